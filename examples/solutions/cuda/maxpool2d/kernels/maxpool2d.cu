// 2-D max pooling over NCHW planes with -inf padding. One thread per output element on a 3-D grid
// (x: output columns, y: output rows, z: planes), so no index needs a division; threads of a warp
// cover consecutive output columns and read their window rows from the same cache lines.
// kWindow > 0 fixes the window size at compile time (the loops unroll); 0 reads it at run time.
#include <cuda_runtime.h>
#include <math.h>

namespace {

constexpr int kBlockX = 32;
constexpr int kBlockY = 8;
constexpr long long kMaxGridZ = 65535;

template <int kWindow>
__global__ void __launch_bounds__(kBlockX* kBlockY)
    maxpool2d_kernel(const float* __restrict__ x, float* __restrict__ y, long long planes, int height, int width,
                     int out_height, int out_width, int runtime_window, int stride, int padding) {
  const int window = kWindow > 0 ? kWindow : runtime_window;
  const int ow = blockIdx.x * kBlockX + threadIdx.x;
  const int oh = blockIdx.y * kBlockY + threadIdx.y;
  if (ow >= out_width || oh >= out_height) return;
  const int h0 = oh * stride - padding, w0 = ow * stride - padding;
  for (long long plane = blockIdx.z; plane < planes; plane += gridDim.z) {
    const float* src = x + plane * height * width;
    float best = -INFINITY;
#pragma unroll
    for (int dh = 0; dh < window; ++dh) {
      const int h = h0 + dh;
      if (h < 0 || h >= height) continue;
      const float* line = src + (long long)h * width;
#pragma unroll
      for (int dw = 0; dw < window; ++dw) {
        const int w = w0 + dw;
        if (w >= 0 && w < width) best = fmaxf(best, line[w]);
      }
    }
    y[(plane * out_height + oh) * out_width + ow] = best;
  }
}

}  // namespace

// x: planes x height x width, y: planes x out_height x out_width (contiguous). config is unused.
extern "C" void maxpool2d_launcher(const float* x, float* y, long long planes, int height, int width,
                                   int out_height, int out_width, int window, int stride, int padding, int config,
                                   cudaStream_t stream) {
  (void)config;
  const dim3 block(kBlockX, kBlockY);
  const dim3 grid((out_width + kBlockX - 1) / kBlockX, (out_height + kBlockY - 1) / kBlockY,
                  (unsigned)(planes < kMaxGridZ ? planes : kMaxGridZ));
  if (window == 3) {
    maxpool2d_kernel<3><<<grid, block, 0, stream>>>(x, y, planes, height, width, out_height, out_width, window,
                                                    stride, padding);
  } else {
    maxpool2d_kernel<0><<<grid, block, 0, stream>>>(x, y, planes, height, width, out_height, out_width, window,
                                                    stride, padding);
  }
}
