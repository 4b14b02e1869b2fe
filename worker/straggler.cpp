#include "straggler.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace pslab {

Straggler::Straggler(const StragglerConfig& cfg, std::uint64_t seed, int rank)
    : rng_(Rng::derive(seed, {0x57A6u, std::uint64_t(rank)})) {
  if (std::find(cfg.workers.begin(), cfg.workers.end(), rank) != cfg.workers.end()) slowdown_ = cfg.slowdown;
  fixed_s_ = cfg.delay_ms / 1e3;
  exp_mean_s_ = cfg.exp_delay_ms / 1e3;
  active_ = slowdown_ > 1.0 || fixed_s_ > 0 || exp_mean_s_ > 0;
}

double Straggler::delay_s(double compute_s) {
  if (!active_) return 0.0;
  double d = (slowdown_ - 1.0) * compute_s + fixed_s_;
  if (exp_mean_s_ > 0) d += rng_.exponential(exp_mean_s_);
  return d;
}

double Straggler::sleep_after(double compute_s) {
  const double d = delay_s(compute_s);
  if (d <= 0) return 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(d));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace pslab
