// GPU tests skip only where there is no GPU to use: a build without CUDA, no driver, or no
// device (kernels/backend.h: cuda_device_count says which). On a machine with a GPU, whatever
// fails after this line (a backend or NCCL constructor included) fails the test. With
// PSLAB_REQUIRE_GPU=1 in the environment (tests/gpu.sh sets it) nothing skips: a GPU test that
// cannot run fails, saying why.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backend.h"

namespace pslab::test {
inline bool gpu_required() {
  const char* v = std::getenv("PSLAB_REQUIRE_GPU");
  return v && *v && std::string(v) != "0";
}
}  // namespace pslab::test

// Skips the test (fails it under PSLAB_REQUIRE_GPU) with `why`.
#define PSLAB_GPU_UNAVAILABLE(why)                                               \
  do {                                                                           \
    if (::pslab::test::gpu_required()) FAIL() << "PSLAB_REQUIRE_GPU: " << (why); \
    GTEST_SKIP() << (why);                                                       \
  } while (0)

#define PSLAB_SKIP_WITHOUT_GPU()                                                   \
  do {                                                                             \
    std::string pslab_why_;                                                        \
    if (::pslab::cuda_device_count(&pslab_why_) == 0) PSLAB_GPU_UNAVAILABLE(pslab_why_); \
  } while (0)
