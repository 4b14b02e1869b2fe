// Straggler injection, reproducible from the seed: extra time a worker sleeps after each
// step's compute, so that one 2-core machine shows what sync and async modes do when
// workers are uneven.
//   slowdown f for the listed ranks: sleep (f - 1) x this step's compute time
//   delay_ms: a fixed sleep per step, every worker
//   exp_delay_ms: a sleep ~ Exp(mean) per step, every worker, drawn from (seed, rank, step)
//
// With overlap, pieces of the gradient leave during backward; a slowed rank then sleeps part
// of its (f - 1) x compute inside backward, before each piece is announced (paced()), so its
// pieces leave when they would on a machine f times slower. The step's total sleep is the same.
#pragma once

#include <chrono>

#include "core/clock.h"
#include "core/model.h"
#include "core/rng.h"
#include "run/config.h"

namespace pslab {

class Straggler {
 public:
  // Sleeps on `clock` (the role's: simulated time in the virtual cluster).
  Straggler(const StragglerConfig& cfg, std::uint64_t seed, int rank, RunClock& clock);
  // Seconds to sleep after a step whose compute took `compute_s`.
  double delay_s(double compute_s);
  bool active() const { return active_; }

  // Call when the step's compute starts (step: the worker's, from 0; a resumed run's go on).
  void start_step(long step);
  // `inner` (may be null), or for a slowed rank a listener that sleeps before passing each
  // report on. Valid while this Straggler lives.
  GradListener* paced(GradListener* inner);
  // Seconds slept inside this step's compute so far (by the paced listener).
  double paced_s() const { return paced_s_; }
  // Sleeps what is left of delay_s(compute_s) after the paced sleeps; returns the seconds
  // slept in the step, paced ones included. compute_s excludes the paced sleeps.
  double sleep_after(double compute_s);

 private:
  struct Paced final : GradListener {
    Straggler* self = nullptr;
    GradListener* inner = nullptr;
    void ready(std::size_t lo) override;
  };

  // Sleeps `s` seconds (if > 0); returns the seconds really slept.
  double sleep_s(double s);

  RunClock& clock_;
  double slowdown_ = 1.0, fixed_s_ = 0.0, exp_mean_s_ = 0.0;
  bool active_ = false;
  std::uint64_t seed_;
  int rank_;
  long step_ = 0;
  Paced paced_;
  RunClock::time_point mark_{};  // the step's start, or the end of the last paced sleep
  double paced_s_ = 0.0;      // slept inside this step's compute
  double owed_s_ = 0.0;       // pacing not slept yet: sleeps wait for 0.2 ms (timer slack)
};

}  // namespace pslab
