// Error checking for CUDA runtime and cuBLAS calls.
//
//   PSLAB_CUDA_CHECK(cudaMalloc(&p, n));       // throws std::runtime_error on failure
//   PSLAB_CUBLAS_CHECK(cublasSgemm(...));       // likewise, with cuBLAS's status string
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   PSLAB_CUDA_CHECK_LAUNCH();                  // checks cudaGetLastError() after a launch
//
// The message names file:line, the expression text and the library's error string, e.g.
//   "kernels/cuda/cuda_backend.cu:123: cudaMalloc(&p, bytes) failed: out of memory
//    (cudaErrorMemoryAllocation)".
// Launch checks catch bad launch configurations at once; faults inside a kernel surface at the
// next synchronizing call (whose check then reports them).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace pslab::cuda_detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* expr, const char* file,
                                          int line) {
  // A non-sticky error is also recorded as the thread's "last error"; clear it so that a later
  // PSLAB_CUDA_CHECK_LAUNCH does not report this failure a second time.
  (void)cudaGetLastError();
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr +
                           " failed: " + cudaGetErrorString(err) + " (" +
                           cudaGetErrorName(err) + ")");
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t st, const char* expr,
                                            const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr +
                           " failed: " + cublasGetStatusString(st) + " (cuBLAS status " +
                           std::to_string(static_cast<int>(st)) + ")");
}

}  // namespace pslab::cuda_detail

#define PSLAB_CUDA_CHECK(expr)                                                          \
  do {                                                                                  \
    const cudaError_t pslab_cuda_err_ = (expr);                                         \
    if (pslab_cuda_err_ != cudaSuccess)                                                 \
      ::pslab::cuda_detail::throw_cuda_error(pslab_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define PSLAB_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                    \
    const cublasStatus_t pslab_cublas_st_ = (expr);                                       \
    if (pslab_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                        \
      ::pslab::cuda_detail::throw_cublas_error(pslab_cublas_st_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a <<<...>>> launch: reports an invalid configuration (too many threads, bad stream,
// no kernel image for this GPU, ...) at the launch site.
#define PSLAB_CUDA_CHECK_LAUNCH()                                                            \
  do {                                                                                       \
    const cudaError_t pslab_cuda_err_ = cudaGetLastError();                                  \
    if (pslab_cuda_err_ != cudaSuccess)                                                      \
      ::pslab::cuda_detail::throw_cuda_error(pslab_cuda_err_, "kernel launch (cudaGetLastError)", \
                                             __FILE__, __LINE__);                            \
  } while (0)
