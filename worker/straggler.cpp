#include "straggler.h"

#include <algorithm>

namespace pslab {

double Straggler::sleep_s(double s) {
  if (s <= 0) return 0.0;
  const auto t0 = clock_.now();
  clock_.sleep_s(s);
  return seconds_between(t0, clock_.now());
}

Straggler::Straggler(const StragglerConfig& cfg, std::uint64_t seed, int rank, RunClock& clock)
    : clock_(clock), seed_(seed), rank_(rank) {
  if (std::find(cfg.workers.begin(), cfg.workers.end(), rank) != cfg.workers.end()) slowdown_ = cfg.slowdown;
  fixed_s_ = cfg.delay_ms / 1e3;
  exp_mean_s_ = cfg.exp_delay_ms / 1e3;
  active_ = slowdown_ > 1.0 || fixed_s_ > 0 || exp_mean_s_ > 0;
  paced_.self = this;
}

double Straggler::delay_s(double compute_s) {
  if (!active_) return 0.0;
  double d = (slowdown_ - 1.0) * compute_s + fixed_s_;
  if (exp_mean_s_ > 0) {  // drawn from (seed, rank, step): a resumed run draws what it would have
    Rng rng = Rng::derive(seed_, {0x57A6u, std::uint64_t(rank_), std::uint64_t(step_)});
    d += rng.exponential(exp_mean_s_);
  }
  return d;
}

void Straggler::start_step(long step) {
  step_ = step;
  mark_ = clock_.now();
  paced_s_ = owed_s_ = 0.0;
}

GradListener* Straggler::paced(GradListener* inner) {
  if (slowdown_ <= 1.0) return inner;
  paced_.inner = inner;
  return &paced_;
}

void Straggler::Paced::ready(std::size_t lo) {
  // Owed sleep is paid in sleeps of at least 0.2 ms: a sleep overshoots by the timer slack
  // (~50 us), which on a dozen tiny sleeps per step would double the slowdown. An overshoot
  // is credited against what is owed next.
  Straggler& s = *self;
  const auto now = s.clock_.now();
  s.owed_s_ += (s.slowdown_ - 1.0) * seconds_between(s.mark_, now);
  if (s.owed_s_ >= 2e-4) {
    const double slept = s.sleep_s(s.owed_s_);
    s.paced_s_ += slept;
    s.owed_s_ -= slept;
  }
  s.mark_ = s.clock_.now();
  if (inner) inner->ready(lo);
}

double Straggler::sleep_after(double compute_s) {
  const double slept = paced_s_;
  paced_s_ = owed_s_ = 0.0;
  return slept + sleep_s(delay_s(compute_s) - slept);
}

}  // namespace pslab
