// A worker that pushes garbage on purpose (byzantine.workers, run/config.h): what it pushes
// instead of its gradient, for experiments on robustness and on the servers' push guard.
// Threading: the worker's training thread.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "run/config.h"

namespace pslab {

class Byzantine {
 public:
  Byzantine(const ExperimentConfig& cfg, int rank);
  bool on() const { return on_; }
  // "nan" and "noise": a buffer of n floats to push instead of grad (made once); "batch": grad,
  // with `batch` set to 2^31 - 1. Unchanged when this rank is honest.
  const float* corrupt(const float* grad, std::size_t n, long step, int& batch);
  // "pushes NaN instead of its gradient (byzantine.kind)", for the worker's first line.
  std::string describe() const;

 private:
  bool on_ = false;
  ByzantineConfig cfg_;
  std::uint64_t seed_ = 0;
  int rank_ = 0;
  std::vector<float> bad_;
};

}  // namespace pslab
