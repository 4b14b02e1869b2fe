// main() of the C++ test programs: gtest's, after the CPU backend's choice of BLAS kernels, so
// that a test computes with the kernels of the pslab programs it starts.
#include <gtest/gtest.h>

#include "backend.h"

int main(int argc, char** argv) {
  pslab::use_best_cpu_runtime(argv);  // (may re-execute this program: first)
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
