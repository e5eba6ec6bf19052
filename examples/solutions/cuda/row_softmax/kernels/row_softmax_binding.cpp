// Python entry point for the scaled row softmax (CUDA backend).
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "binding_registry.h"

extern "C" void row_softmax_launcher(const float* x, float* y, int rows, int cols, float out_scale, int config,
                                     cudaStream_t stream);

torch::Tensor row_softmax_forward(torch::Tensor x, double out_scale) {
  TORCH_CHECK(x.is_cuda(), "row_softmax: x must be on the GPU");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "row_softmax: x must be float32");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "row_softmax: x must be a contiguous 2-D tensor");
  TORCH_CHECK(x.size(0) <= INT32_MAX && x.size(1) <= INT32_MAX, "row_softmax: x is too large");
  auto y = torch::empty_like(x);
  if (x.numel() == 0) return y;
  row_softmax_launcher(x.data_ptr<float>(), y.data_ptr<float>(), static_cast<int>(x.size(0)),
                       static_cast<int>(x.size(1)), static_cast<float>(out_scale), /*config=*/0,
                       c10::cuda::getCurrentCUDAStream());
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, "row_softmax: launch failed: ", cudaGetErrorString(err));
  return y;
}

REGISTER_BINDING(row_softmax_forward, row_softmax_forward);
