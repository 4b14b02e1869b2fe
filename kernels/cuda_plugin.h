// The CUDA layer as plugins: libpslab_cuda.so holds the CUDA backend (kernels/cuda/) and, where
// NCCL was found, libpslab_nccl.so the NCCL collective (src/comm/collective_nccl.cpp). A process
// loads one the first time it asks for what it holds, so that one that never does (every CPU
// worker, the evaluator of a CPU run) neither loads nor relocates the CUDA runtime, cuBLAS,
// cuBLASLt and NCCL: about 200 MB resident and 80 ms of start-up per process. A plugin binds to
// the code of the binary that loads it (the binaries export their symbols): the backend's to
// Backend's (kernels/), the collective's to Collective's and the rendezvous' (src/comm/), which
// every binary that asks for it has.
//
// Where they are looked for: in $PSLAB_CUDA_PLUGIN_DIR if set; else beside the binary's build,
// <binary's directory>/../kernels/ (a build tree), then ../lib/ (a bundle, experiments/bundle.sh).
#pragma once

#include <string>

namespace pslab {

// What a binary and its plugins share: Backend's and Collective's virtual functions and the
// structs they pass (kernels/backend.h, kernels/elementwise.h, src/comm/collective.h). A plugin
// says which it was built against (pslab_plugin_interface(), kernels/plugin_interface.cpp) and
// one of another is refused as it loads: a plugin left from another build would otherwise call
// the wrong functions. Bump it with any change to them.
constexpr int kPluginInterface = 2;

// The entry point `name` (an extern "C" function) of the plugin `file` ("libpslab_cuda.so",
// "libpslab_nccl.so"), loaded once per process (thread-safe); null when there is none, with
// `why` saying so: a build without CUDA, or the plugin (or a library it needs) not found or not
// loadable, or built against another interface (kPluginInterface), naming every path tried.
void* cuda_plugin_symbol(const char* file, const char* name, std::string* why);

}  // namespace pslab
