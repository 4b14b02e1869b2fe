// A CUDA plugin as another pslab build left it: built against an older plugin interface
// (kernels/cuda_plugin.h), with the entry point a binary asks for. CudaPlugin.* checks that a
// binary refuses it, naming why, instead of calling into it.
#include "cuda_plugin.h"

extern "C" __attribute__((visibility("default"))) int pslab_plugin_interface() { return pslab::kPluginInterface - 1; }
extern "C" __attribute__((visibility("default"))) int pslab_cuda_device_count() { return 1; }
