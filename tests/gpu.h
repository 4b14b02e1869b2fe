// GPU tests skip only where there is no GPU to use: a build without CUDA, no driver, or no
// device (kernels/backend.h: cuda_device_count says which). On a machine with a GPU, whatever
// fails after this line (a backend or NCCL constructor included) fails the test.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "backend.h"

#define PSLAB_SKIP_WITHOUT_GPU()                                     \
  do {                                                               \
    std::string pslab_why_;                                          \
    if (::pslab::cuda_device_count(&pslab_why_) == 0) GTEST_SKIP() << pslab_why_; \
  } while (0)
