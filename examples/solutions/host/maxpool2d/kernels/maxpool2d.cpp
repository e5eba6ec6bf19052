// Host backend: 2-D max pooling over NCHW planes, -inf padding, window clipped to the plane.
#include <algorithm>
#include <cmath>

extern "C" void maxpool2d_launcher(const float* x, float* y, long long planes, int height, int width,
                                   int out_height, int out_width, int window, int stride, int padding, int config,
                                   void* stream) {
  (void)config;
  (void)stream;
  for (long long p = 0; p < planes; ++p) {
    const float* src = x + p * height * width;
    float* dst = y + p * out_height * out_width;
    for (int oh = 0; oh < out_height; ++oh) {
      const int h_begin = std::max(oh * stride - padding, 0);
      const int h_end = std::min(oh * stride - padding + window, height);
      for (int ow = 0; ow < out_width; ++ow) {
        const int w_begin = std::max(ow * stride - padding, 0);
        const int w_end = std::min(ow * stride - padding + window, width);
        float best = -INFINITY;
        for (int h = h_begin; h < h_end; ++h)
          for (int w = w_begin; w < w_end; ++w) best = std::max(best, src[static_cast<long long>(h) * width + w]);
        dst[static_cast<long long>(oh) * out_width + ow] = best;
      }
    }
  }
}
