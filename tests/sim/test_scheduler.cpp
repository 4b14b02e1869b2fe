// The virtual cluster's discrete-event scheduler and simulated clock (src/sim/scheduler.h,
// sim_clock.h): threads take turns one at a time, in simulated-time order (ties in the order
// they were scheduled), time moves only while every thread waits, and a failure stops them all.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "sim/scheduler.h"
#include "sim/sim_clock.h"

using namespace pslab;
using namespace pslab::sim;
using namespace std::chrono_literals;

namespace {

double ms_since_epoch(const Scheduler& s) { return s.seconds() * 1e3; }

}  // namespace

TEST(Scheduler, ThreadsTakeTurnsInSimulatedTimeOrderTiesInSpawnOrder) {
  Scheduler s;
  std::vector<std::string> log;
  auto body = [&](const char* name, std::vector<int> waits_ms) {
    return [&s, &log, name, waits_ms] {
      for (int w : waits_ms) {
        log.push_back(std::string(name) + "@" + std::to_string(int(ms_since_epoch(s))));
        s.wait_until(s.now() + std::chrono::milliseconds(w));
      }
      log.push_back(std::string(name) + " ends @" + std::to_string(int(ms_since_epoch(s))));
    };
  };
  s.spawn("a", body("a", {3, 3}));
  s.spawn("b", body("b", {2, 4}));
  s.spawn("c", body("c", {6}), Scheduler::epoch() + 1ms);
  s.run();
  EXPECT_EQ(log, (std::vector<std::string>{"a@0", "b@0", "c@1", "b@2", "a@3", "b ends @6", "a ends @6", "c ends @7"}));
  EXPECT_EQ(ms_since_epoch(s), 7.0) << "time moved only as far as the last wait";
}

TEST(Scheduler, AWakeRunsAWaitingThreadNowAndItsOldTimerIsStale) {
  Scheduler s;
  Scheduler::Thread* sleeper = nullptr;
  std::vector<double> woke;
  sleeper = s.spawn("sleeper", [&] {
    s.wait_until(s.now() + 10s);  // woken at 1 s
    woke.push_back(ms_since_epoch(s));
    s.wait_until(s.now() + 20s);  // its first timer (10 s) must not end this wait
    woke.push_back(ms_since_epoch(s));
  });
  s.spawn("waker", [&] {
    s.wait_until(s.now() + 1s);
    s.wake(sleeper);
    s.wake(sleeper);  // twice: still one wake-up
  });
  s.run();
  EXPECT_EQ(woke, (std::vector<double>{1000.0, 21000.0}));
}

TEST(Scheduler, CallbacksRunAtTheirTimeBetweenTurnsAndJoinWaitsForAnEnd) {
  Scheduler s;
  std::vector<std::string> log;
  Scheduler::Thread* worker = s.spawn("worker", [&] {
    s.at(s.now() + 5ms, [&] { log.push_back("delivery@" + std::to_string(int(ms_since_epoch(s)))); });
    s.wait_until(s.now() + 8ms);
    log.push_back("worker ends@" + std::to_string(int(ms_since_epoch(s))));
  });
  s.spawn("joiner", [&] {
    s.join(worker);
    log.push_back("joined@" + std::to_string(int(ms_since_epoch(s))));
  });
  s.run();
  EXPECT_EQ(log, (std::vector<std::string>{"delivery@5", "worker ends@8", "joined@8"}));
}

// The first failure stops every thread: their next wait throws Scheduler::Stopped (a wait while
// unwinding, by a destructor, returns with time moved on), and run() rethrows the failure.
TEST(Scheduler, TheFirstFailureStopsEveryThreadAndIsRethrown) {
  Scheduler s;
  bool unwound = false, after_wait = false;
  struct WaitsInItsDestructor {
    Scheduler& s;
    bool& done;
    ~WaitsInItsDestructor() {
      s.wait_until(s.now() + 3s);  // e.g. a coordinator waiting for Byes
      done = true;
    }
  };
  s.spawn("patient", [&] {
    WaitsInItsDestructor guard{s, unwound};
    s.wait_until(s.now() + 1h);
    after_wait = true;
  });
  s.spawn("failing", [&] {
    s.wait_until(s.now() + 2s);
    throw std::runtime_error("worker 7: broke");
  });
  try {
    s.run();
    FAIL() << "run() returned";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "worker 7: broke");
  }
  EXPECT_TRUE(unwound);
  EXPECT_FALSE(after_wait);
  EXPECT_LT(s.seconds(), 10.0) << "the patient thread's hour was not waited";
}

TEST(SimClock, ComputeTakesTheCostModelsTimeAndAStopEndsASleep) {
  Scheduler s;
  Costs costs;
  costs.compute_s = 0.002;  // at batch 64
  costs.batch = 64;
  SimClock clock(s, costs);
  double took = 0, stopped_at = -1;
  bool slept_through = true;
  s.spawn("worker", [&] {
    const auto t0 = clock.now();
    took = clock.computed(t0, 32);  // half a batch: 1 ms
    auto beats = clock.start([&](std::stop_token stop) {
      slept_through = clock.sleep_for(1h, stop);
      stopped_at = s.seconds();
    });
    clock.sleep_for(5s);
    beats.reset();  // asks it to stop and joins it, in simulated time
  });
  s.run();
  EXPECT_DOUBLE_EQ(took, 0.001);
  EXPECT_FALSE(slept_through);
  EXPECT_NEAR(stopped_at, 5.001, 1e-9);
  EXPECT_NEAR(clock.unix_s() - SimClock::kRunStart, s.seconds(), 1e-6);
}
