// Host backend: row softmax scaled by out_scale. Per row: max, then exp and sum, then rescale. The exp
// is range reduction to 2^n * e^r (|r| <= ln2 / 2) with a degree-6 polynomial for e^r, and the sum is
// kept in eight float lanes: both written so that the compiler vectorises the loops (std::exp and a
// single running sum would not be; nor would GCC vectorise the comparisons unless it may assume that
// they do not trap).
#pragma GCC optimize("no-trapping-math")
#include <cstdint>
#include <cstring>

namespace {

constexpr int kLanes = 8;

inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : x;  // e^-87 is still a normal float; softmax's inputs are <= 0 here
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  const float n = (x * 1.44269504088896341f + shifter) - shifter;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // x - n * ln2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace

extern "C" void row_softmax_launcher(const float* x, float* y, int rows, int cols, float out_scale, int config,
                                     void* stream) {
  (void)config;
  (void)stream;
  for (int r = 0; r < rows; ++r) {
    const float* row = x + (long long)r * cols;
    float* out = y + (long long)r * cols;
    float top[kLanes], sums[kLanes];
    for (int l = 0; l < kLanes; ++l) top[l] = row[0], sums[l] = 0.0f;
    const int whole = cols - cols % kLanes;
    for (int c = 0; c < whole; c += kLanes)
      for (int l = 0; l < kLanes; ++l) top[l] = row[c + l] > top[l] ? row[c + l] : top[l];
    float max_value = row[0];
    for (int l = 0; l < kLanes; ++l) max_value = top[l] > max_value ? top[l] : max_value;
    for (int c = whole; c < cols; ++c) max_value = row[c] > max_value ? row[c] : max_value;
    for (int c = 0; c < whole; c += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        out[c + l] = exp_approx(row[c + l] - max_value);
        sums[l] += out[c + l];
      }
    double sum = 0.0;
    for (int c = whole; c < cols; ++c) {
      out[c] = exp_approx(row[c] - max_value);
      sum += out[c];
    }
    for (int l = 0; l < kLanes; ++l) sum += sums[l];
    const float factor = static_cast<float>(out_scale / sum);
    for (int c = 0; c < cols; ++c) out[c] *= factor;
  }
}
