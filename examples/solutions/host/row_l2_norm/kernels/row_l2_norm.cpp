// Host backend: row L2 norm with four independent partial sums per row (double accumulation).
#include <cmath>

extern "C" void row_l2_norm_launcher(const float* x, float* y, int rows, int cols, int config, void* stream) {
  (void)config;
  (void)stream;
  for (int r = 0; r < rows; ++r) {
    const float* row = x + (long long)r * cols;
    double partial[4] = {0.0, 0.0, 0.0, 0.0};
    int c = 0;
    for (; c + 4 <= cols; c += 4)
      for (int j = 0; j < 4; ++j) partial[j] += static_cast<double>(row[c + j]) * row[c + j];
    for (; c < cols; ++c) partial[0] += static_cast<double>(row[c]) * row[c];
    y[r] = static_cast<float>(std::sqrt((partial[0] + partial[1]) + (partial[2] + partial[3])));
  }
}
