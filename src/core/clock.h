// Time as the roles of a process see it, and the threads that wait on it.
//
// A real process runs on the wall clock (wall_clock()): steady time, real sleeps, a compute
// step takes the time it takes, threads are std::jthreads. The virtual cluster (src/sim/) hands
// every role of a run its simulated clock instead, through the run's transport
// (comm::Transport::clock()): simulated time moves only when every thread of the run waits,
// one thread runs at a time, and a compute step takes what the cost model says. So every wait
// of a role goes through its clock: its sleeps and threads here, its receives through the
// transport, whose deadlines are this clock's time points.
//
// Threading: every method may be called from any thread that waits on this clock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>

namespace pslab {

// A thread started by a RunClock: destroying the handle asks it to stop (its stop_token) and
// joins it.
class ClockThread {
 public:
  virtual ~ClockThread() = default;
};

class RunClock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;
  virtual ~RunClock() = default;

  virtual time_point now() const = 0;
  // What metric lines count from: seconds since the Unix epoch on the wall clock; in the
  // virtual cluster simulated seconds since its start (whose run start is 0).
  virtual double unix_s() const = 0;
  // Sleeps until `t`. Returns false, early, once `stop` is requested.
  virtual bool sleep_until(time_point t, std::stop_token stop = {}) = 0;
  bool sleep_for(duration d, std::stop_token stop = {}) { return sleep_until(now() + d, stop); }
  bool sleep_s(double s, std::stop_token stop = {}) {
    return s <= 0 || sleep_for(std::chrono::duration_cast<duration>(std::chrono::duration<double>(s)), stop);
  }
  // A compute step of `samples` samples that began at `start` is done: returns its seconds. The
  // wall clock: the time that passed. The virtual cluster: its cost model's time, which passes now.
  virtual double computed(time_point start, long samples) = 0;
  // Runs fn(stop) on a thread of this clock's.
  virtual std::unique_ptr<ClockThread> start(std::function<void(std::stop_token)> fn) = 0;
};

inline double seconds_between(RunClock::time_point a, RunClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

namespace detail {
class WallThread final : public ClockThread {
 public:
  explicit WallThread(std::function<void(std::stop_token)> fn) : thread_(std::move(fn)) {}

 private:
  std::jthread thread_;  // its destructor requests stop and joins
};

class WallClock final : public RunClock {
 public:
  time_point now() const override { return std::chrono::steady_clock::now(); }
  double unix_s() const override {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  bool sleep_until(time_point t, std::stop_token stop) override {
    if (!stop.stop_possible()) {
      std::this_thread::sleep_until(t);
      return true;
    }
    std::mutex mu;
    std::condition_variable_any wake;
    std::unique_lock lock(mu);
    wake.wait_until(lock, stop, t, [] { return false; });  // a sleep that a stop request ends
    return !stop.stop_requested();
  }
  double computed(time_point start, long) override { return seconds_between(start, now()); }
  std::unique_ptr<ClockThread> start(std::function<void(std::stop_token)> fn) override {
    return std::make_unique<WallThread>(std::move(fn));
  }
};
}  // namespace detail

// The wall clock, shared by everything in a real process.
inline RunClock& wall_clock() {
  static detail::WallClock clock;
  return clock;
}

}  // namespace pslab
