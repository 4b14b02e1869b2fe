// Built into every CUDA plugin (libpslab_cuda.so, libpslab_nccl.so): which interface it was built
// against, so that a binary refuses a plugin of another pslab (kernels/cuda_plugin.h).
#include "cuda_plugin.h"

extern "C" __attribute__((visibility("default"))) int pslab_plugin_interface() { return pslab::kPluginInterface; }
