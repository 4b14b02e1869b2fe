// Backend selection. The CUDA backend lives in the CUDA plugin (cuda_plugin.h), loaded the first
// time a process asks for a GPU; a build without CUDA, or a plugin that cannot be loaded, makes
// asking for it an error that says so.
#include "backend.h"

#include <stdexcept>

#include "cuda_plugin.h"

namespace pslab {

// The plugin's entry points (kernels/cuda/cuda_backend.cu).
using MakeCudaBackend = Backend* (*)(int gpu_slot);
using CudaDeviceCount = int (*)(std::string* why);

std::unique_ptr<Backend> make_cuda_backend(int gpu_slot) {
  std::string why;
  const auto make = reinterpret_cast<MakeCudaBackend>(cuda_plugin_symbol("libpslab_cuda.so", "pslab_cuda_backend", &why));
  if (!make) throw std::runtime_error("device = \"cuda\" was asked for, but " + why + "; use device = \"cpu\"");
  return std::unique_ptr<Backend>(make(gpu_slot));
}

int cuda_device_count(std::string* why) {
  std::string no_plugin;
  const auto count = reinterpret_cast<CudaDeviceCount>(cuda_plugin_symbol("libpslab_cuda.so", "pslab_cuda_device_count", &no_plugin));
  if (!count) {
    if (why) *why = no_plugin;
    return 0;
  }
  return count(why);
}

std::unique_ptr<Backend> make_backend(Device d, int cpu_threads, int gpu_slot) {
  return d == Device::cuda ? make_cuda_backend(gpu_slot) : make_cpu_backend(cpu_threads);
}

}  // namespace pslab
