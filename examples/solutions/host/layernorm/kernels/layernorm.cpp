// Host backend: LayerNorm over the last dimension, two-pass statistics in double per row.
#include <cmath>

extern "C" void layernorm_launcher(const float* x, const float* weight, const float* bias, float* y, int rows,
                                   int cols, float eps, int config, void* stream) {
  (void)config;
  (void)stream;
  for (int r = 0; r < rows; ++r) {
    const float* row = x + (long long)r * cols;
    float* out = y + (long long)r * cols;
    double sum = 0.0;
    for (int c = 0; c < cols; ++c) sum += row[c];
    const double mean = sum / cols;
    double squares = 0.0;
    for (int c = 0; c < cols; ++c) {
      const double d = row[c] - mean;
      squares += d * d;
    }
    const float rstd = static_cast<float>(1.0 / std::sqrt(squares / cols + eps));
    const float mean_f = static_cast<float>(mean);
    for (int c = 0; c < cols; ++c) out[c] = (row[c] - mean_f) * rstd * weight[c] + bias[c];
  }
}
