// The virtual cluster's cost model ([virtual] in the config, measured by `launch.py calibrate`)
// and its clock: pslab's RunClock over the scheduler's simulated time.
//
//   a worker's step     compute_s at train.batch samples (scaled by its samples): the time
//                       RunClock::computed() lets pass
//   a message           latency_s + bytes / bytes_per_s on its link (each pair of peers has one
//                       link each way; messages on a link queue behind each other)
//   a server's update   payload bytes / apply_bytes_per_s, one message at a time per server
//                       (a FIFO queue in front of it)
//   an all-reduce       allreduce_s, or a ring over the links
#pragma once

#include <cstddef>

#include "core/clock.h"
#include "run/config.h"
#include "sim/scheduler.h"

namespace pslab::sim {

struct Costs {
  double compute_s = 0.0;  // one step's compute at `batch` samples
  int batch = 1;
  double latency_s = 0.0, bytes_per_s = 1.0, apply_bytes_per_s = 1.0;
  double allreduce_s = 0.0;  // one all-reduce of ∇θ; 0: a ring over the links
  // The cost model of `cfg` ([virtual]); compute_s as given (0 when [virtual] leaves it to be measured).
  static Costs of(const ExperimentConfig& cfg);
  double transfer_s(std::size_t bytes) const { return double(bytes) / bytes_per_s; }
  double apply_s(std::size_t bytes) const { return double(bytes) / apply_bytes_per_s; }
  // A ring all-reduce of `bytes` over `world` ranks: 2 (W - 1) steps of bytes / W each.
  double ring_s(std::size_t bytes, int world) const;
};

// Threading: the simulation's threads (one at a time).
class SimClock final : public RunClock {
 public:
  SimClock(Scheduler& s, const Costs& costs) : s_(s), costs_(costs) {}
  // What unix_s() reads at simulated time 0: the run start the virtual cluster gives its roles.
  static constexpr double kRunStart = 1e9;

  time_point now() const override { return s_.now(); }
  double unix_s() const override { return kRunStart + s_.seconds(); }
  bool sleep_until(time_point t, std::stop_token stop) override;
  double computed(time_point start, long samples) override;
  std::unique_ptr<ClockThread> start(std::function<void(std::stop_token)> fn) override;

 private:
  Scheduler& s_;
  const Costs& costs_;
  int threads_started_ = 0;
};

}  // namespace pslab::sim
