// Python entry point for the row L2 norm (host backend).
#include <climits>

#include "binding_registry.h"

extern "C" void row_l2_norm_launcher(const float* x, float* y, int rows, int cols, int config, void* stream);

torch::Tensor row_l2_norm_forward(torch::Tensor x) {
  TORCH_CHECK(x.device().is_cpu(), "row_l2_norm: x must be on the CPU");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "row_l2_norm: x must be float32");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "row_l2_norm: x must be a contiguous 2-D tensor");
  TORCH_CHECK(x.size(0) <= INT_MAX && x.size(1) <= INT_MAX, "row_l2_norm: x is too large");
  auto y = torch::empty({x.size(0)}, x.options());
  row_l2_norm_launcher(x.data_ptr<float>(), y.data_ptr<float>(), static_cast<int>(x.size(0)),
                       static_cast<int>(x.size(1)), /*config=*/0, /*stream=*/nullptr);
  return y;
}

REGISTER_BINDING(row_l2_norm_forward, row_l2_norm_forward);
