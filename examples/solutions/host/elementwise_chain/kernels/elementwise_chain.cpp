// Host backend: per-column affine -> GELU(tanh) -> clamp in one pass over the rows. The tanh is a
// rational function (a degree-13 odd polynomial over a degree-6 even one, input clamped to +-7.9),
// accurate to a few float32 ulps and, unlike std::tanh, vectorised by the compiler. GCC keeps the
// clamps' comparisons as branches (and the loop scalar) unless it may assume they do not trap.
#pragma GCC optimize("no-trapping-math")
#include <algorithm>

namespace {

inline float rational_tanh(float x) {
  x = std::min(std::max(x, -7.90531110763549805f), 7.90531110763549805f);
  const float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 - 8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return x * p / q;
}

}  // namespace

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
      const float g = 0.5f * v * (1.0f + rational_tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v)));
      out[c] = std::min(std::max(g, lo), hi);
    }
  }
}
