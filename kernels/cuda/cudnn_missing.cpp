// cudnn.h for a build whose CUDA toolkit has no cudnn.h: the backend convolves by im2col and
// cuBLAS and normalises with its own kernels, and says so.
#include <stdexcept>

#include "cuda/cudnn.h"

namespace pslab::cuda {

struct Cudnn::Impl {};

std::unique_ptr<Cudnn> Cudnn::open(cudaStream_t, ConvAlgorithms, std::string* why) {
  if (why) *why = "this build found no cudnn.h in the CUDA toolkit (install cuDNN 9 there and rebuild)";
  return nullptr;
}

Cudnn::Cudnn(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Cudnn::~Cudnn() = default;
std::string Cudnn::describe() const { return "no cuDNN"; }
const void* Cudnn::workspace() const { return nullptr; }
bool Cudnn::planned(const math::ConvGeometry&, int, int) const { return false; }
void Cudnn::allow_tf32(bool) {}

[[noreturn]] static void never_opened() { throw std::logic_error("cuDNN called in a build without it"); }
void Cudnn::conv_forward(const float*, const float*, const math::ConvGeometry&, int, int, float*) { never_opened(); }
void Cudnn::conv_backward(const float*, const float*, const float*, const math::ConvGeometry&, int, int, float*,
                          float*) {
  never_opened();
}
void Cudnn::batch_norm_forward(const float*, int, int, int, const float*, const float*, bool, float, float, float*,
                               float*, float*, float*, float*) {
  never_opened();
}
void Cudnn::batch_norm_backward(const float*, const float*, int, int, int, const float*, const float*, const float*,
                                float*, float*, float*) {
  never_opened();
}

}  // namespace pslab::cuda

extern "C" std::size_t pslab_cudnn_version(std::string* why) {
  if (why) *why = "this build found no cudnn.h in the CUDA toolkit";
  return 0;
}
