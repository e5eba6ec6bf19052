// Row softmax scaled by the row length: y[r, c] = exp(x[r, c] - max_r) / sum_r * cols.
// One block per row. Pass 1 keeps an online (max, sum-of-exp) pair per thread, merged across the
// block with warp shuffles; pass 2 re-reads the row (now in L1/L2) and writes the outputs.
// float4 accesses when the row length is a multiple of 4 and the pointers are 16-byte aligned.
#include <cuda_runtime.h>
#include <math.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct MaxSum {
  float max;
  float sum;  // sum of exp(v - max)
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.sum * __expf(a.max - m) + b.sum * __expf(b.max - m)};
}

__device__ __forceinline__ MaxSum absorb(MaxSum a, float v) {
  if (v <= a.max) return {a.max, a.sum + __expf(v - a.max)};
  return {v, a.sum * __expf(a.max - v) + 1.0f};
}

__device__ MaxSum block_merge(MaxSum local) {
  __shared__ MaxSum partial[kWarps];
  __shared__ MaxSum total;
  for (int offset = 16; offset > 0; offset >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, local.max, offset), __shfl_xor_sync(0xffffffffu, local.sum, offset)};
    local = merge(local, other);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = local;
  __syncthreads();
  if (warp == 0) {
    MaxSum v = lane < kWarps ? partial[lane] : MaxSum{-INFINITY, 0.0f};
    for (int offset = 16; offset > 0; offset >>= 1) {
      MaxSum other{__shfl_xor_sync(0xffffffffu, v.max, offset), __shfl_xor_sync(0xffffffffu, v.sum, offset)};
      v = merge(v, other);
    }
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

template <bool kVec4>
__global__ void __launch_bounds__(kThreads) row_softmax_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                                 int cols, float out_scale) {
  const long long row_start = (long long)blockIdx.x * cols;
  const float* row = x + row_start;
  float* out = y + row_start;
  MaxSum local{-INFINITY, 0.0f};
  if (kVec4) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    #pragma unroll 4
    for (int i = threadIdx.x; i < cols / 4; i += kThreads) {
      const float4 v = row4[i];
      local = absorb(local, v.x);
      local = absorb(local, v.y);
      local = absorb(local, v.z);
      local = absorb(local, v.w);
    }
  } else {
    for (int i = threadIdx.x; i < cols; i += kThreads) local = absorb(local, row[i]);
  }
  const MaxSum stats = block_merge(local);
  const float factor = out_scale / stats.sum;
  if (kVec4) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    float4* out4 = reinterpret_cast<float4*>(out);
    #pragma unroll 4
    for (int i = threadIdx.x; i < cols / 4; i += kThreads) {
      const float4 v = row4[i];
      out4[i] = make_float4(__expf(v.x - stats.max) * factor, __expf(v.y - stats.max) * factor,
                            __expf(v.z - stats.max) * factor, __expf(v.w - stats.max) * factor);
    }
  } else {
    for (int i = threadIdx.x; i < cols; i += kThreads) out[i] = __expf(row[i] - stats.max) * factor;
  }
}

}  // namespace

// x, y: rows x cols (contiguous). out_scale multiplies every probability. config is unused.
extern "C" void row_softmax_launcher(const float* x, float* y, int rows, int cols, float out_scale, int config,
                                     cudaStream_t stream) {
  (void)config;
  const bool aligned =
      ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(y)) & 15ULL) == 0;
  if (cols % 4 == 0 && aligned) {
    row_softmax_kernel<true><<<rows, kThreads, 0, stream>>>(x, y, cols, out_scale);
  } else {
    row_softmax_kernel<false><<<rows, kThreads, 0, stream>>>(x, y, cols, out_scale);
  }
}
