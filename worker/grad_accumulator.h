// train.accumulate = N (gradient accumulation): an update is the mean gradient over N
// consecutive batches of a worker. A training loop hands each batch's ∇θ to add(); the N-th
// batch, or the run's last, makes the update due, and mean() is then what the update uses
// (the optimizer's gradient, a push, an all-reduce). With N = 1 nothing is copied: mean() is
// the gradient add() was given. Buffers (P floats, on the backend's device; a host copy for
// GPUs that push) are allocated once.
// Threading: the training loop's thread.
#pragma once

#include <cstddef>

#include "backend.h"

namespace pslab {

class GradAccumulator {
 public:
  GradAccumulator(Backend& be, int batches, std::size_t P);
  int batches() const { return n_; }
  // Adds `grad` (P floats on the device: the mean gradient over its `weight` samples) to the
  // weighted sum of the open update; returns true when the update is due (the N-th batch since
  // the last one, or `last`), with mean() then the weighted mean (zeros if no batch had samples).
  bool add(float* grad, double weight, bool last);
  float* mean() const { return mean_; }  // device: `grad` itself (N = 1) or the accumulator's
  // mean() on the host (copied on a GPU; the same pointer on the CPU).
  const float* host_mean();
  // Samples behind mean() (the weights' sum).
  double weight() const { return weight_; }

 private:
  Backend& be_;
  int n_;
  std::size_t P_;
  DeviceBuffer<float> sum_;
  HostBuffer<float> host_;
  float* mean_ = nullptr;
  int count_ = 0;        // batches in the open update
  double open_ = 0.0;    // their weight
  double weight_ = 0.0;  // the due update's weight
};

}  // namespace pslab
