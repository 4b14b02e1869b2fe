// Backend's default convolution: the whole batch in one im2col, one GEMM per pass and a swap
// of the outer dimensions, so the number of backend calls does not grow with the batch; and its
// default image relayout and NHWC mean pool.
#include <string>

#include "backend.h"

namespace pslab {

// scratch: cols (K, B*N) | t (OC, B*N), K = C*KH*KW, N = OH*OW.
void Backend::conv_forward(const float* x, const float* W, const math::ConvGeometry& g, int OC, int B, float* y,
                           float* scratch) {
  const int K = g.C * g.KH * g.KW, N = g.OH() * g.OW(), BN = B * N;
  float* cols = scratch;
  float* t = scratch + std::size_t(K) * BN;
  im2col(x, g, B, cols);
  gemm(Trans::no, Trans::no, OC, BN, K, 1.0f, W, K, cols, BN, 0.0f, t, BN);  // (OC,K)(K,B*N)
  swap_outer(t, OC, B, N, y);                                                 // (OC,B,N) -> (B,OC,N)
}

void Backend::conv_backward(const float*, const float* W, const float* dy, const math::ConvGeometry& g, int OC, int B,
                            float* dW, float* dx, float* scratch) {
  const int K = g.C * g.KH * g.KW, N = g.OH() * g.OW(), BN = B * N;
  if (B == 0) return fill(dW, std::size_t(OC) * K, 0.0f);
  float* cols = scratch;
  float* t = scratch + std::size_t(K) * BN;
  swap_outer(dy, B, OC, N, t);                                                // (B,OC,N) -> (OC,B,N)
  gemm(Trans::no, Trans::yes, OC, K, BN, 1.0f, t, BN, cols, BN, 0.0f, dW, K);  // dW = dy cols^T
  if (dx) {
    gemm(Trans::yes, Trans::no, K, BN, OC, 1.0f, W, K, t, BN, 0.0f, cols, BN);  // W^T dy, over cols
    col2im(cols, g, B, dx);
  }
}

void Backend::relayout_images(const float* x, int B, int C, int HW, ImageLayout to, float* y) {
  const std::size_t image = std::size_t(C) * HW;
  for (int b = 0; b < B; ++b)  // (C, HW) <-> (HW, C): the two outer dimensions of (., ., 1)
    swap_outer(x + b * image, to == ImageLayout::nhwc ? C : HW, to == ImageLayout::nhwc ? HW : C, 1, y + b * image);
}

void Backend::mean_pool_nhwc(const float*, int, int, int, float*) {
  throw std::logic_error("mean_pool_nhwc on " + describe() + ", whose images are not NHWC");
}

void Backend::mean_pool_nhwc_backward(const float*, int, int, int, float*) {
  throw std::logic_error("mean_pool_nhwc_backward on " + describe() + ", whose images are not NHWC");
}

}  // namespace pslab
