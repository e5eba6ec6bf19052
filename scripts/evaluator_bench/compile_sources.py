"""The one-kernel candidate `compile` builds (out = a*x + b*y), as a workspace and in the KernelBench style."""

from __future__ import annotations

from pathlib import Path

CUDA_KERNEL = r"""
#include <cuda_runtime.h>
__global__ void axpby_kernel(const float* x, const float* y, float* out, float a, float b, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + b * y[i];
}
extern "C" void axpby_launcher(const float* x, const float* y, float* out, float a, float b, long n, int config,
                               cudaStream_t stream) {
  int threads = config > 0 ? config : 256;
  axpby_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, stream>>>(x, y, out, a, b, n);
}
"""
CUDA_BINDING = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include "binding_registry.h"
extern "C" void axpby_launcher(const float* x, const float* y, float* out, float a, float b, long n, int config,
                               cudaStream_t stream);
torch::Tensor axpby(torch::Tensor x, torch::Tensor y, double a, double b) {
  TORCH_CHECK(x.is_cuda() && y.is_cuda(), "axpby: CUDA tensors expected");
  TORCH_CHECK(x.sizes() == y.sizes() && x.is_contiguous() && y.is_contiguous(), "axpby: same-shape contiguous");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "axpby: float32");
  auto out = torch::empty_like(x);
  axpby_launcher(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), (float)a, (float)b, x.numel(), 256,
                 at::cuda::getCurrentCUDAStream());
  return out;
}
REGISTER_BINDING(axpby, axpby);
"""
HOST_KERNEL = r"""
#include <cstdint>
extern "C" void axpby_launcher(const float* x, const float* y, float* out, float a, float b, long n, int config,
                               void* stream) {
  (void)config; (void)stream;
  for (long i = 0; i < n; ++i) out[i] = a * x[i] + b * y[i];
}
"""
HOST_BINDING = CUDA_BINDING.replace("#include <ATen/cuda/CUDAContext.h>\n", "").replace(
    "cudaStream_t stream", "void* stream").replace("at::cuda::getCurrentCUDAStream()", "nullptr").replace(
    "x.is_cuda() && y.is_cuda(), \"axpby: CUDA tensors expected\"",
    "x.is_cpu() && y.is_cpu(), \"axpby: CPU tensors expected\"")
# KernelBench style: one .cu with torch headers, the kernel and the wrapper; load_inline writes the pybind module.
KERNELBENCH_CUDA = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
__global__ void axpby_kernel(const float* x, const float* y, float* out, float a, float b, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + b * y[i];
}
torch::Tensor axpby(torch::Tensor x, torch::Tensor y, double a, double b) {
  auto out = torch::empty_like(x);
  long n = x.numel();
  axpby_kernel<<<(unsigned)((n + 255) / 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(),
                                                     (float)a, (float)b, n);
  return out;
}
"""
KERNELBENCH_HOST = r"""
#include <torch/extension.h>
torch::Tensor axpby(torch::Tensor x, torch::Tensor y, double a, double b) {
  auto out = torch::empty_like(x);
  const float* px = x.data_ptr<float>(); const float* py = y.data_ptr<float>(); float* po = out.data_ptr<float>();
  for (long i = 0; i < x.numel(); ++i) po[i] = (float)a * px[i] + (float)b * py[i];
  return out;
}
"""


def candidate_files(backend: str, nonce: str = "") -> dict[str, bytes]:
    """The one-kernel workspace (kernels/ only); a nonce comment makes every byte sequence new (a cold build)."""
    tag = f"\n// {nonce}\n" if nonce else ""
    if backend == "cuda":
        files = {"kernels/axpby.cu": CUDA_KERNEL, "kernels/axpby_binding.cpp": CUDA_BINDING}
    else:
        files = {"kernels/axpby.cpp": HOST_KERNEL, "kernels/axpby_binding.cpp": HOST_BINDING}
    return {rel: (text + tag).encode() for rel, text in files.items()}


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root
