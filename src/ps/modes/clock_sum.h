// The batch-weighted sum of the pushes of one clock, which the shard keeps for the mode between
// pushes (ShardOps::kept(), in its checkpoints): bsp averages gradients with it, local:H models.
//   kept()            Σ batch_i x payload_i over the clock's pushes so far
//   kept_counts()[0]  their samples, [1] how many pushes
#pragma once

#include "ps/modes/mode.h"

namespace pslab::clock_sum {

// Adds this push (its payload checked first: a bad one changes nothing).
inline void add(const PushInfo& p, ShardOps& ops) {
  const float* x = ops.payload();
  float* sum = ops.kept();
  const auto counts = ops.kept_counts();
  const std::size_t n = ops.length();
  if (counts[1] == 0) {  // the clock's first push: the sum is its own (none for an empty batch, whatever
    const float b = float(p.batch);  // its payload holds: 0 x inf is NaN)
    for (std::size_t i = 0; i < n; ++i) sum[i] = p.batch > 0 ? b * x[i] : 0.0f;
  } else if (p.batch > 0) {
    ops.cpu().axpy(n, float(p.batch), x, sum);
  }
  counts[0] += p.batch;
  counts[1] += 1;
}

// The sum so far and its samples; the clock is closed (the counts go back to zero, the sum's
// buffer is the caller's until the next push).
inline float* take(ShardOps& ops, long& samples) {
  const auto counts = ops.kept_counts();
  samples = counts[0];
  counts[0] = counts[1] = 0;
  return ops.kept();
}

}  // namespace pslab::clock_sum
