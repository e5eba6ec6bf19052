// Host backend: LayerNorm over the last dimension, two-pass statistics per row. Each sum is kept in eight
// float lanes (summed in double at the end), which the compiler vectorises; a single running sum would
// stay scalar, since vectorising it would reorder the additions.
#include <cmath>

namespace {

constexpr int kLanes = 8;

// The sum of f(row[c]) over the row: eight lanes, then the tail and the lanes in double.
template <typename F>
double lane_sum(const float* row, int cols, F f) {
  float lanes[kLanes] = {};
  const int whole = cols - cols % kLanes;
  for (int c = 0; c < whole; c += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += f(row[c + l]);
  double sum = 0.0;
  for (int c = whole; c < cols; ++c) sum += f(row[c]);
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

}  // namespace

extern "C" void layernorm_launcher(const float* x, const float* weight, const float* bias, float* y, int rows,
                                   int cols, float eps, int config, void* stream) {
  (void)config;
  (void)stream;
  for (int r = 0; r < rows; ++r) {
    const float* row = x + (long long)r * cols;
    float* out = y + (long long)r * cols;
    const float mean = static_cast<float>(lane_sum(row, cols, [](float v) { return v; }) / cols);
    const double squares = lane_sum(row, cols, [mean](float v) { return (v - mean) * (v - mean); });
    const float rstd = static_cast<float>(1.0 / std::sqrt(squares / cols + eps));
    for (int c = 0; c < cols; ++c) out[c] = (row[c] - mean) * rstd * weight[c] + bias[c];
  }
}
