// The CPU backend's convolutions on oneDNN, the library PyTorch's CPU convolutions run on: its
// JIT kernels in NHWC run ResNet's 3x3 convolutions 3-8x faster than im2col + OpenBLAS on one
// core. The backend holds its images in NHWC (Backend::image_layout), so the activations go in
// and out as they are; only the weights are reordered, into oneDNN's blocked layout (buffers
// kept per shape). A shape oneDNN takes no primitive for, or only its reference one, reports so
// (ready() false; none of the shapes tried, odd strides and paddings included).
// Threading: oneDNN's OpenMP threads, `threads` of them (OpenBLAS's count at the call). One
// caller at a time.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <tuple>

#include "elementwise.h"

namespace pslab {

class OnednnConvolutions {
 public:
  OnednnConvolutions();
  ~OnednnConvolutions();
  OnednnConvolutions(const OnednnConvolutions&) = delete;
  OnednnConvolutions& operator=(const OnednnConvolutions&) = delete;

  // Whether oneDNN runs this shape (the first call per shape builds its primitives).
  bool ready(const math::ConvGeometry& g, int OC, int B, int threads);
  // As Backend::conv_forward / conv_backward in NHWC, for a shape that is ready(); no scratch.
  void forward(const float* x, const float* W, const math::ConvGeometry& g, int OC, int B, int threads, float* y);
  void backward(const float* x, const float* W, const float* dy, const math::ConvGeometry& g, int OC, int B,
                int threads, float* dW, float* dx);

 private:
  struct Plan;  // one shape's primitives and weight buffers (onednn_conv.cpp)
  using Key = std::tuple<int, int, int, int, int, int, int, int, int, int>;  // geometry, OC, B, threads
  Plan* plan(const math::ConvGeometry& g, int OC, int B, int threads);
  struct Engine;
  std::unique_ptr<Engine> engine_;
  std::map<Key, std::unique_ptr<Plan>> plans_;  // (a null plan: a shape oneDNN does not run)
};

}  // namespace pslab
