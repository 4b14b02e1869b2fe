// Straggler injection, reproducible from the seed: extra time a worker sleeps after each
// step's compute, so that one 2-core machine shows what sync and async modes do when
// workers are uneven.
//   slowdown f for the listed ranks: sleep (f - 1) x this step's compute time
//   delay_ms: a fixed sleep per step, every worker
//   exp_delay_ms: a sleep ~ Exp(mean) per step, every worker, drawn from (seed, rank, step)
#pragma once

#include "run/config.h"
#include "core/rng.h"

namespace pslab {

class Straggler {
 public:
  Straggler(const StragglerConfig& cfg, std::uint64_t seed, int rank);
  // Seconds to sleep after a step whose compute took `compute_s`.
  double delay_s(double compute_s);
  // Sleeps that long; returns the seconds slept.
  double sleep_after(double compute_s);
  bool active() const { return active_; }

 private:
  double slowdown_ = 1.0, fixed_s_ = 0.0, exp_mean_s_ = 0.0;
  bool active_ = false;
  Rng rng_;
};

}  // namespace pslab
