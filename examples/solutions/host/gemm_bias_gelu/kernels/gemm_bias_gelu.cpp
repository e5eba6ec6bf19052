// Host backend: y = gelu(x @ W^T + b), full fp32. W is transposed once into a K x N scratch buffer so
// the inner loop walks contiguous memory (and vectorises without reassociating any sum); each output
// row is accumulated in place, then the bias and the exact-erf GELU are applied.
#include <cmath>
#include <vector>

extern "C" void gemm_bias_gelu_launcher(const float* x, const float* w, const float* bias, float* y, int M, int N,
                                        int K, int config, void* stream) {
  (void)config;
  (void)stream;
  std::vector<float> w_t(static_cast<size_t>(K) * N);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) w_t[static_cast<size_t>(k) * N + n] = w[static_cast<size_t>(n) * K + k];
  constexpr float kInvSqrt2 = 0.7071067811865476f;
  for (int m = 0; m < M; ++m) {
    float* out = y + static_cast<size_t>(m) * N;
    const float* row = x + static_cast<size_t>(m) * K;
    for (int n = 0; n < N; ++n) out[n] = 0.0f;
    for (int k = 0; k < K; ++k) {
      const float a = row[k];
      const float* w_row = w_t.data() + static_cast<size_t>(k) * N;
      for (int n = 0; n < N; ++n) out[n] += a * w_row[n];
    }
    for (int n = 0; n < N; ++n) {
      const float v = out[n] + bias[n];
      out[n] = 0.5f * v * (1.0f + std::erf(v * kInvSqrt2));
    }
  }
}
