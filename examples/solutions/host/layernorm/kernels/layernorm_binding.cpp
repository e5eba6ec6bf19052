// Python entry point for LayerNorm over the last dimension (host backend).
#include <climits>

#include "binding_registry.h"

extern "C" void layernorm_launcher(const float* x, const float* weight, const float* bias, float* y, int rows,
                                   int cols, float eps, int config, void* stream);

torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu() && bias.device().is_cpu(),
              "layernorm: tensors must be on the CPU");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                  bias.scalar_type() == torch::kFloat32,
              "layernorm: tensors must be float32");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "layernorm: x must be a contiguous 2-D tensor");
  const int64_t cols = x.size(1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == cols && weight.is_contiguous(),
              "layernorm: weight must be contiguous with one value per column");
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == cols && bias.is_contiguous(),
              "layernorm: bias must be contiguous with one value per column");
  TORCH_CHECK(x.size(0) <= INT_MAX && cols <= INT_MAX, "layernorm: x is too large");
  auto y = torch::empty_like(x);
  layernorm_launcher(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(),
                     static_cast<int>(x.size(0)), static_cast<int>(cols), static_cast<float>(eps), /*config=*/0,
                     /*stream=*/nullptr);
  return y;
}

REGISTER_BINDING(layernorm_forward, layernorm_forward);
