// Host backend: per-column affine -> GELU(tanh) -> clamp in one pass over the rows (plain C++).
#include <algorithm>
#include <cmath>

extern "C" void elementwise_chain_launcher(const float* x, const float* scale, const float* bias, float* y,
                                           long long rows, int features, float lo, float hi, int config,
                                           void* stream) {
  (void)config;
  (void)stream;
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kGeluCubic = 0.044715f;
  for (long long r = 0; r < rows; ++r) {
    const float* row = x + r * features;
    float* out = y + r * features;
    for (int c = 0; c < features; ++c) {
      const float v = row[c] * scale[c] + bias[c];
      const float g = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v)));
      out[c] = std::min(std::max(g, lo), hi);
    }
  }
}
