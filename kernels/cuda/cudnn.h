// cuDNN for the CUDA backend's convolutions and batch norm, loaded at run time (dlopen of
// libcudnn.so.9, the legacy API, float32 NCHW): a build machine's toolkit has cuDNN, a GPU host
// may hold it only in Python's nvidia-cudnn package (its lib/ on LD_LIBRARY_PATH; tests/gpu.sh
// puts it there) or not at all. Without it the backend convolves by im2col and cuBLAS and
// normalises with its own kernels, and its describe() says why.
//
// Convolutions: one plan per (geometry, OC, batch), made on first use: its descriptors and, for
// each pass, the first deterministic algorithm of cuDNN's ranking, in plain FP32 (CUDNN_FMA_MATH)
// unless TF32 is allowed. The ranking is cuDNN's `heuristic` by default (cudnnGet*_v7: the same
// choice in every run on one GPU and cuDNN version, so two runs of a seed compute the same sums),
// or `timed` (PSLAB_CUDNN=timed; cudnnFind*: each candidate run and timed, as PyTorch's
// cudnn.benchmark; the choice is made once per process and shape, so every backend of a process
// sums alike, but two processes may choose differently between algorithms of close speed and so
// differ in their last bits). On an H200 timing changed the small CNN's and ResNet-20's steps by
// 0.96-1.01x. The workspace is this object's, grown to the
// largest plan's; nothing is allocated per step.
// Everything runs on the backend's stream (one thread at a time, as the backend).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

#include "elementwise.h"  // math::ConvGeometry

namespace pslab::cuda {

enum class ConvAlgorithms { timed, heuristic };  // how a convolution's algorithms are ranked (above)

class Cudnn {
 public:
  // Null, with `why`, where libcudnn.so.9 cannot be loaded, lacks an entry point, is not
  // version 9, or cudnnCreate fails on the current device.
  static std::unique_ptr<Cudnn> open(cudaStream_t stream, ConvAlgorithms ranking, std::string* why);
  ~Cudnn();
  Cudnn(const Cudnn&) = delete;
  Cudnn& operator=(const Cudnn&) = delete;

  std::string describe() const;  // "cuDNN 9.10.2 (algorithms by heuristic)"
  // Its workspace (device memory every convolution uses; null before the first): a step graph
  // that recorded convolutions is stale once it moved (grew for a new plan).
  const void* workspace() const;
  // Whether this convolution shape has its plan (made by its first conv_forward or
  // conv_backward; making one allocates, which a step graph's recording may not).
  bool planned(const math::ConvGeometry& g, int OC, int B) const;
  // TF32 tensor cores for convolutions (and re-planning: plans keep their algorithms).
  void allow_tf32(bool on);

  // As Backend::conv_forward / conv_backward, without scratch.
  void conv_forward(const float* x, const float* W, const math::ConvGeometry& g, int OC, int B, float* y);
  void conv_backward(const float* x, const float* W, const float* dy, const math::ConvGeometry& g, int OC, int B,
                     float* dW, float* dx);

  // As Backend::batch_norm_forward / batch_norm_backward (CUDNN_BATCHNORM_SPATIAL, the same
  // conventions: the running variance unbiased and moved by `momentum`, saved_invstd =
  // 1 / sqrt(var + eps)) where runs_batch_norm says so: eps at least cuDNN's 1e-5, at least two
  // values a channel, and a dx that is neither null nor dy (the backend's kernels take the rest).
  // Backward reads the saved statistics, so it needs no eps.
  static bool runs_batch_norm(float eps, int B, int HW) { return eps >= 1e-5f && B >= 1 && std::size_t(B) * HW >= 2; }
  static bool runs_batch_norm_backward(int B, int HW, const float* dy, const float* dx) {
    return runs_batch_norm(1e-5f, B, HW) && dx && dx != dy;
  }
  void batch_norm_forward(const float* x, int B, int C, int HW, const float* gamma, const float* beta, bool training,
                          float momentum, float eps, float* running_mean, float* running_var, float* saved_mean,
                          float* saved_invstd, float* y);
  void batch_norm_backward(const float* x, const float* dy, int B, int C, int HW, const float* gamma,
                           const float* saved_mean, const float* saved_invstd, float* dgamma, float* dbeta, float* dx);

 private:
  struct Impl;  // cudnn.cpp: the loaded entry points, the handle, the plans, the workspace
  explicit Cudnn(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pslab::cuda
