#include "sim/sim_clock.h"

#include <stop_token>

namespace pslab::sim {

Costs Costs::of(const ExperimentConfig& cfg) {
  const VirtualConfig& v = cfg.virtual_cluster;
  Costs c;
  // All-reduce ranks share the cores with no server (calibrate measures both).
  const bool allreduce = !cfg.uses_servers();
  c.compute_s = (allreduce && v.allreduce_compute_ms > 0 ? v.allreduce_compute_ms : v.compute_ms) * 1e-3;
  c.batch = cfg.train.batch;
  c.latency_s = v.latency_us * 1e-6;
  c.bytes_per_s = v.bandwidth_gbps * 1e9;
  c.apply_bytes_per_s = v.apply_gbps * 1e9;
  c.allreduce_s = v.allreduce_ms * 1e-3;
  return c;
}

double Costs::ring_s(std::size_t bytes, int world) const {
  if (world < 2) return 0.0;
  return 2.0 * (world - 1) * (latency_s + transfer_s(bytes / std::size_t(world)));
}

bool SimClock::sleep_until(time_point t, std::stop_token stop) {
  Scheduler::Thread* self = s_.current();
  std::stop_callback wake(stop, [this, self] { s_.wake(self); });  // a stop request ends the sleep
  while (s_.now() < t && !stop.stop_requested()) s_.wait_until(t);
  return !stop.stop_requested();
}

double SimClock::computed(time_point start, long samples) {
  const double cost = costs_.compute_s * double(samples) / double(costs_.batch);
  sleep_until(start + std::chrono::duration_cast<duration>(std::chrono::duration<double>(cost)), {});
  return seconds_between(start, now());
}

namespace {

// A thread of the simulation that a role started (a client's heartbeats, a coordinator):
// asked to stop and joined, in simulated time, when the handle goes.
class SimThread final : public ClockThread {
 public:
  SimThread(Scheduler& s, const std::string& name, std::function<void(std::stop_token)> fn) : s_(s) {
    thread_ = s.spawn(name, [fn = std::move(fn), stop = stop_.get_token()] { fn(stop); });
  }
  ~SimThread() override {
    stop_.request_stop();
    s_.join(thread_);
  }

 private:
  Scheduler& s_;
  std::stop_source stop_;
  Scheduler::Thread* thread_ = nullptr;
};

}  // namespace

std::unique_ptr<ClockThread> SimClock::start(std::function<void(std::stop_token)> fn) {
  return std::make_unique<SimThread>(s_, "thread " + std::to_string(++threads_started_) + " of " + s_.current_name(),
                                     std::move(fn));
}

}  // namespace pslab::sim
