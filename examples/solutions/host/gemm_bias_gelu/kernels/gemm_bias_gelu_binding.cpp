// Python entry point for the fused Linear + bias + GELU (host backend).
#include <climits>

#include "binding_registry.h"

extern "C" void gemm_bias_gelu_launcher(const float* x, const float* w, const float* bias, float* y, int M, int N,
                                        int K, int config, void* stream);

torch::Tensor gemm_bias_gelu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu() && bias.device().is_cpu(),
              "gemm_bias_gelu: tensors must be on the CPU");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                  bias.scalar_type() == torch::kFloat32,
              "gemm_bias_gelu: tensors must be float32");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "gemm_bias_gelu: x must be a contiguous 2-D tensor");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.size(1) == x.size(1),
              "gemm_bias_gelu: weight must be contiguous, out_features x in_features");
  TORCH_CHECK(bias.dim() == 1 && bias.is_contiguous() && bias.size(0) == weight.size(0),
              "gemm_bias_gelu: bias must be contiguous with one value per output feature");
  TORCH_CHECK(x.size(0) <= INT_MAX && weight.size(0) <= INT_MAX && x.size(1) <= INT_MAX,
              "gemm_bias_gelu: tensors are too large");
  auto y = torch::empty({x.size(0), weight.size(0)}, x.options());
  if (y.numel() == 0) return y;
  gemm_bias_gelu_launcher(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(),
                          static_cast<int>(x.size(0)), static_cast<int>(weight.size(0)), static_cast<int>(x.size(1)),
                          /*config=*/0, /*stream=*/nullptr);
  return y;
}

REGISTER_BINDING(gemm_bias_gelu_forward, gemm_bias_gelu_forward);
