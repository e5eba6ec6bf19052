// 2-D max pooling over NCHW planes with -inf padding. One thread per output element; threads of
// a warp cover consecutive output columns, so their window rows are read from the same cache
// lines. kWindow > 0 fixes the window size at compile time (the loops unroll); 0 reads it at run time.
#include <cuda_runtime.h>
#include <math.h>

namespace {

template <int kWindow>
__global__ void maxpool2d_kernel(const float* __restrict__ x, float* __restrict__ y, long long planes, int height,
                                 int width, int out_height, int out_width, int runtime_window, int stride,
                                 int padding) {
  const int window = kWindow > 0 ? kWindow : runtime_window;
  const long long total = planes * out_height * out_width;
  for (long long o = blockIdx.x * (long long)blockDim.x + threadIdx.x; o < total;
       o += (long long)gridDim.x * blockDim.x) {
    const int ow = (int)(o % out_width);
    const int oh = (int)((o / out_width) % out_height);
    const long long plane = o / ((long long)out_width * out_height);
    const float* src = x + plane * height * width;
    const int h0 = oh * stride - padding, w0 = ow * stride - padding;
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
    y[o] = best;
  }
}

int grid_for(long long work, int threads) {
  long long blocks = (work + threads - 1) / threads;
  const long long cap = 132LL * 32;
  if (blocks > cap) blocks = cap;
  return (int)(blocks < 1 ? 1 : blocks);
}

}  // namespace

// x: planes x height x width, y: planes x out_height x out_width (contiguous). config is unused.
extern "C" void maxpool2d_launcher(const float* x, float* y, long long planes, int height, int width,
                                   int out_height, int out_width, int window, int stride, int padding, int config,
                                   cudaStream_t stream) {
  (void)config;
  constexpr int kThreads = 256;
  const long long total = planes * out_height * out_width;
  const int blocks = grid_for(total, kThreads);
  if (window == 3) {
    maxpool2d_kernel<3><<<blocks, kThreads, 0, stream>>>(x, y, planes, height, width, out_height, out_width, window,
                                                         stride, padding);
  } else {
    maxpool2d_kernel<0><<<blocks, kThreads, 0, stream>>>(x, y, planes, height, width, out_height, out_width, window,
                                                         stride, padding);
  }
}
