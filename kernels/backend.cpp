// Backend selection. The CUDA backend exists only when CMake found the toolkit
// (PSLAB_HAVE_CUDA); otherwise asking for it is an error that says so.
#include "backend.h"

#include <stdexcept>

namespace pslab {

#ifndef PSLAB_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int) {
  throw std::runtime_error(
      "device = \"cuda\" was asked for, but this build of pslab has no CUDA backend "
      "(nvcc was not found when CMake configured the build); use device = \"cpu\"");
}

int cuda_device_count(std::string* why) {
  if (why) *why = "this build of pslab has no CUDA backend (nvcc was not found when CMake configured the build)";
  return 0;
}
#endif

std::unique_ptr<Backend> make_backend(Device d, int cpu_threads, int gpu_slot) {
  return d == Device::cuda ? make_cuda_backend(gpu_slot) : make_cpu_backend(cpu_threads);
}

}  // namespace pslab
