// Simulated time for the threads of a virtual cluster. Every role of the run (each server,
// worker, the evaluator, and the threads they start) is a real thread running pslab's real
// code, but only one runs at a time, and simulated time moves only when every thread waits:
// a discrete-event simulation whose events are message deliveries (SimTransport) and threads
// waking up. Events run in simulated-time order; ties in the order they were scheduled, so a
// run is deterministic.
//
// A thread runs until it waits (Scheduler::wait_until: a sleep, a receive, a join); it then runs
// the next events itself: callbacks (deliveries), until one is a thread's wake-up, which hands
// that thread the turn (or lets the waiting thread go on, if it is its own). Code run on a simulation thread must
// wait only through the scheduler (the simulated clock and transport): a real sleep or lock
// wait holds every other thread up (the scheduler names a thread that keeps its turn for long).
//
// When a thread fails (or stop() is called), the simulation stops, as the launcher stops every
// process of a run when one fails: every other thread's next wait throws Stopped, which unwinds
// it (a wait made while it unwinds, by a destructor, returns at once, with simulated time moved
// to its deadline); run() then rethrows the first failure. If every thread waits with nothing
// left to wake it, the process ends naming them (a bug: every wait of pslab's has a deadline).
//
// Threading: spawn() and run() on the driving thread (spawn() also from a simulation thread);
// the rest only on the thread that has the turn (a simulation thread, or a callback it runs).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.h"

namespace pslab::sim {

class Scheduler {
 public:
  using time_point = RunClock::time_point;
  using duration = RunClock::duration;
  struct Thread;

  // Simulated time 0 is this time point (away from time_point{}, which code takes for "unset").
  static time_point epoch() { return time_point(std::chrono::hours(1)); }

  Scheduler();
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // A new simulation thread running fn, first scheduled at `at` (default: now). From the
  // driving thread before run(), or from a simulation thread.
  Thread* spawn(std::string name, std::function<void()> fn, time_point at = {});
  // Runs the simulation until every thread has ended; rethrows the first failure.
  void run();

  // ---- from simulation threads ----
  time_point now() const { return now_; }
  double seconds() const { return seconds_between(epoch(), now_); }
  // The calling thread waits until `t` or until wake() (whichever comes first).
  void wait_until(time_point t);
  // Makes thread `t` run now if it waits (no effect otherwise; a later wait is not woken).
  void wake(Thread* t);
  // The calling simulation thread (null on the driving thread, e.g. in a callback).
  Thread* current() const { return current_; }
  // Its name ("the driver" outside the simulation's threads).
  std::string current_name() const;
  // Waits until thread `t` has ended.
  void join(Thread* t);
  // Runs fn at simulated time `t`, between threads' turns (on whichever thread passes the turn on).
  void at(time_point t, std::function<void()> fn);
  // Stops the simulation with `why` as its failure (the first one counts). From a simulation
  // thread or a callback.
  void stop(std::exception_ptr why, const std::string& who);
  // What a wait throws once the simulation stops; not a std::exception, so that code which
  // catches those to go on does not catch it.
  struct Stopped {};

 private:
  struct Event {
    time_point t;
    std::uint64_t seq;
    Thread* thread;  // null: a callback
    std::uint64_t generation;
    std::function<void()> fn;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const { return a.t > b.t || (a.t == b.t && a.seq > b.seq); }
  };
  void push(time_point t, Thread* thread, std::uint64_t generation, std::function<void()> fn);
  void body(Thread* t);  // a simulation thread's: its first turn, fn, its end
  // Runs the events (deliveries inline) until one wakes a thread: that thread, now current; null
  // when every thread has ended.
  Thread* next_turn();
  // Hands the turn to the next thread (self: it may be the next and go on) and, if self is not
  // null and not next, waits until it has the turn again.
  void pass_turn(Thread* self);
  std::string waiting_threads() const;

  std::mutex end_mu_;  // the driving thread waits for the end: finished_
  std::condition_variable end_cv_;
  bool finished_ = false;
  std::atomic<long> turns_{0};
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  std::uint64_t seq_ = 0;
  time_point now_ = epoch();
  Thread* current_ = nullptr;  // the thread that has the turn
  std::vector<std::unique_ptr<Thread>> threads_;
  int live_ = 0;
  bool aborting_ = false;  // destroyed without run(): threads that never had a turn end at once
  bool stopping_ = false;  // stop(): every wait throws Stopped
  std::exception_ptr first_error_;
};

}  // namespace pslab::sim
