// Python entry point for 2-D max pooling (CUDA backend).
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "binding_registry.h"

extern "C" void maxpool2d_launcher(const float* x, float* y, long long planes, int height, int width,
                                   int out_height, int out_width, int window, int stride, int padding, int config,
                                   cudaStream_t stream);

torch::Tensor maxpool2d_forward(torch::Tensor x, int64_t window, int64_t stride, int64_t padding) {
  TORCH_CHECK(x.is_cuda(), "maxpool2d: x must be on the GPU");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "maxpool2d: x must be float32");
  TORCH_CHECK(x.dim() == 4 && x.is_contiguous(), "maxpool2d: x must be a contiguous NCHW tensor");
  TORCH_CHECK(window > 0 && stride > 0 && padding >= 0 && 2 * padding <= window,
              "maxpool2d: need window > 0, stride > 0 and 0 <= padding <= window / 2");
  const int64_t height = x.size(2), width = x.size(3);
  TORCH_CHECK(height + 2 * padding >= window && width + 2 * padding >= window, "maxpool2d: input smaller than window");
  const int64_t out_height = (height + 2 * padding - window) / stride + 1;
  const int64_t out_width = (width + 2 * padding - window) / stride + 1;
  auto y = torch::empty({x.size(0), x.size(1), out_height, out_width}, x.options());
  if (y.numel() == 0) return y;
  maxpool2d_launcher(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0) * x.size(1), static_cast<int>(height),
                     static_cast<int>(width), static_cast<int>(out_height), static_cast<int>(out_width),
                     static_cast<int>(window), static_cast<int>(stride), static_cast<int>(padding), /*config=*/0,
                     c10::cuda::getCurrentCUDAStream());
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, "maxpool2d: launch failed: ", cudaGetErrorString(err));
  return y;
}

REGISTER_BINDING(maxpool2d_forward, maxpool2d_forward);
