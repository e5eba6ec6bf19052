// Host backend: row softmax scaled by out_scale. Per row: max, then exp and sum, then rescale.
#include <cmath>

extern "C" void row_softmax_launcher(const float* x, float* y, int rows, int cols, float out_scale, int config,
                                     void* stream) {
  (void)config;
  (void)stream;
  for (int r = 0; r < rows; ++r) {
    const float* row = x + (long long)r * cols;
    float* out = y + (long long)r * cols;
    float max_value = -INFINITY;
    for (int c = 0; c < cols; ++c) max_value = std::fmax(max_value, row[c]);
    double sum = 0.0;
    for (int c = 0; c < cols; ++c) {
      out[c] = std::exp(row[c] - max_value);
      sum += out[c];
    }
    const float factor = static_cast<float>(out_scale / sum);
    for (int c = 0; c < cols; ++c) out[c] *= factor;
  }
}
