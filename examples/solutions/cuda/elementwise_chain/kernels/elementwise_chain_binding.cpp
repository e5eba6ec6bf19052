// Python entry point for the fused elementwise chain (CUDA backend).
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "binding_registry.h"

extern "C" void elementwise_chain_launcher(const float* x, const float* scale, const float* bias, float* y,
                                           long long rows, int features, float lo, float hi, int config,
                                           cudaStream_t stream);

torch::Tensor elementwise_chain_forward(torch::Tensor x, torch::Tensor scale, torch::Tensor bias, double lo,
                                        double hi) {
  TORCH_CHECK(x.is_cuda() && scale.is_cuda() && bias.is_cuda(), "elementwise_chain: tensors must be on the GPU");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && scale.scalar_type() == torch::kFloat32 &&
                  bias.scalar_type() == torch::kFloat32,
              "elementwise_chain: tensors must be float32");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "elementwise_chain: x must be a contiguous 2-D tensor");
  const int64_t features = x.size(1);
  TORCH_CHECK(scale.dim() == 1 && scale.size(0) == features && scale.is_contiguous(),
              "elementwise_chain: scale must be contiguous with one value per feature");
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == features && bias.is_contiguous(),
              "elementwise_chain: bias must be contiguous with one value per feature");
  auto y = torch::empty_like(x);
  if (x.numel() == 0) return y;
  elementwise_chain_launcher(x.data_ptr<float>(), scale.data_ptr<float>(), bias.data_ptr<float>(),
                             y.data_ptr<float>(), x.size(0), static_cast<int>(features), static_cast<float>(lo),
                             static_cast<float>(hi), /*config=*/0, c10::cuda::getCurrentCUDAStream());
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, "elementwise_chain: launch failed: ", cudaGetErrorString(err));
  return y;
}

REGISTER_BINDING(elementwise_chain_forward, elementwise_chain_forward);
