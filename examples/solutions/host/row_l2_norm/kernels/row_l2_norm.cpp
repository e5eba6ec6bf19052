// Host backend: row L2 norm. The sum of squares is kept in eight float lanes (summed in double at the
// end), which the compiler vectorises; a single running sum would stay scalar.
#include <cmath>

extern "C" void row_l2_norm_launcher(const float* x, float* y, int rows, int cols, int config, void* stream) {
  (void)config;
  (void)stream;
  constexpr int kLanes = 8;
  const int whole = cols - cols % kLanes;
  for (int r = 0; r < rows; ++r) {
    const float* row = x + (long long)r * cols;
    float lanes[kLanes] = {};
    for (int c = 0; c < whole; c += kLanes)
      for (int l = 0; l < kLanes; ++l) lanes[l] += row[c + l] * row[c + l];
    double sum = 0.0;
    for (int c = whole; c < cols; ++c) sum += static_cast<double>(row[c]) * row[c];
    for (int l = 0; l < kLanes; ++l) sum += lanes[l];
    y[r] = static_cast<float>(std::sqrt(sum));
  }
}
