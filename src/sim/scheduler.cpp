// The turn passes from thread to thread directly: a thread that waits runs the event loop itself
// (deliveries included) until it finds the next thread to wake, hands that one the turn (its
// baton), and sleeps on its own; if the next is itself, it goes on with no switch at all. The
// driving thread only starts the loop and waits for the end. Only the thread with the turn
// touches the scheduler's state, so no lock guards it: each hand-over (a Baton's release store,
// then acquire exchange) orders what one thread did before what the next does.
#include "sim/scheduler.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace pslab::sim {

namespace {

// The turn, handed to one thread: give() by the thread that passes it, take() by the one that
// waits for it, which sleeps in the kernel (a futex) until then, without spinning (on a machine
// of two cores a spinning waiter would take the core the turn's holder needs).
class Baton {
 public:
  void give() {
    v_.store(1, std::memory_order_release);
    ::syscall(SYS_futex, &v_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }
  void take() {
    while (v_.exchange(0, std::memory_order_acquire) == 0)
      ::syscall(SYS_futex, &v_, FUTEX_WAIT_PRIVATE, 0, nullptr, nullptr, 0);  // (returns at once if given meanwhile)
  }

 private:
  std::atomic<int> v_{0};
};

}  // namespace

struct Scheduler::Thread {
  std::string name;
  std::function<void()> fn;
  std::thread os;
  Baton turn;  // given: it has the turn
  bool started = false;  // it has had a turn
  bool waiting = true;   // it waits for a wake-up (its first turn, or wait_until)
  bool done = false;
  std::uint64_t generation = 1;  // of its current wait: a wake-up event of another is stale
  time_point wakes_at{};         // its current wait's timer (max: none), for a deadlock's message
  std::vector<Thread*> joiners;
};

namespace {
constexpr auto kSlowTurn = std::chrono::seconds(300);  // real time: a turn this long is named
}

Scheduler::Scheduler() = default;

Scheduler::~Scheduler() {
  aborting_ = true;  // threads that never had a turn end without running (run() was not called)
  for (auto& t : threads_)
    if (!t->started) t->turn.give();
  for (auto& t : threads_)
    if (t->os.joinable()) t->os.join();
}

Scheduler::Thread* Scheduler::spawn(std::string name, std::function<void()> fn, time_point at) {
  threads_.push_back(std::make_unique<Thread>());
  Thread* t = threads_.back().get();
  t->name = std::move(name);
  t->fn = std::move(fn);
  ++live_;
  push(at == time_point{} ? now_ : std::max(at, now_), t, t->generation, {});
  t->os = std::thread([this, t] { body(t); });
  return t;
}

void Scheduler::body(Thread* t) {
  t->turn.take();
  t->started = true;
  if (aborting_) return;  // destroyed without run(): nobody waits for its end
  try {
    if (!stopping_) t->fn();
  } catch (const Stopped&) {
    // the simulation stopped: nothing more to say
  } catch (...) {
    stop(std::current_exception(), t->name);
  }
  t->done = true;
  --live_;
  for (Thread* j : t->joiners) push(now_, j, j->generation, {});
  pass_turn(nullptr);
}

void Scheduler::push(time_point t, Thread* thread, std::uint64_t generation, std::function<void()> fn) {
  events_.push(Event{t, seq_++, thread, generation, std::move(fn)});
}

void Scheduler::at(time_point t, std::function<void()> fn) { push(std::max(t, now_), nullptr, 0, std::move(fn)); }

Scheduler::Thread* Scheduler::next_turn() {
  current_ = nullptr;
  while (live_ > 0) {
    if (events_.empty()) {
      // Every thread waits and nothing can wake one: a bug (every wait of pslab's has a
      // deadline). Nothing can unblock them, so the process ends here, naming them.
      std::fprintf(stderr, "[virtual] deadlock at simulated %.3f s: every thread waits, nothing is left to wake one: %s\n",
                   seconds(), waiting_threads().c_str());
      std::abort();
    }
    Event ev = std::move(const_cast<Event&>(events_.top()));  // popped at once: its callback is not copied
    events_.pop();
    now_ = std::max(now_, ev.t);
    if (!ev.thread) {
      ev.fn();  // a delivery: it may wake a thread
      continue;
    }
    Thread* t = ev.thread;
    if (t->done || !t->waiting || ev.generation != t->generation) continue;  // stale
    t->waiting = false;
    current_ = t;
    ++turns_;
    return t;
  }
  return nullptr;
}

void Scheduler::pass_turn(Thread* self) {
  Thread* next = next_turn();
  if (next && next == self) return;  // it goes on: no switch
  if (next) {
    next->turn.give();
  } else {
    std::lock_guard lock(end_mu_);
    finished_ = true;
    end_cv_.notify_one();
  }
  if (self) self->turn.take();
}

void Scheduler::stop(std::exception_ptr why, const std::string& who) {
  if (!first_error_) {
    first_error_ = why;
    try {
      std::rethrow_exception(why);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[virtual] %s failed at simulated %.3f s: %s\n", who.c_str(), seconds(), e.what());
    } catch (...) {
      std::fprintf(stderr, "[virtual] %s failed at simulated %.3f s\n", who.c_str(), seconds());
    }
  }
  if (stopping_) return;
  stopping_ = true;
  for (auto& t : threads_)  // every waiting thread gets a turn now, to unwind
    if (t->waiting && !t->done) push(now_, t.get(), t->generation, {});
}

void Scheduler::wait_until(time_point t) {
  Thread* self = current_;
  if (!self) throw std::logic_error("sim::Scheduler::wait_until outside a simulation thread");
  if (stopping_ && std::uncaught_exceptions() == 0) throw Stopped{};
  // Unwinding after a stop (a destructor's wait): no timer, but a turn for the others, and the
  // deadline's time, so that a wait for another thread or for a time ends.
  const bool unwinding = stopping_;
  if (unwinding && t != time_point::max()) now_ = std::max(now_, t);
  self->waiting = true;
  ++self->generation;
  self->wakes_at = t;
  if (unwinding) push(now_, self, self->generation, {});
  else if (t != time_point::max()) push(std::max(t, now_), self, self->generation, {});
  pass_turn(self);
  if (stopping_ && !unwinding) throw Stopped{};  // the simulation stopped while this thread waited
}

void Scheduler::wake(Thread* t) {
  if (t && t->waiting && !t->done) push(now_, t, t->generation, {});
}

void Scheduler::join(Thread* t) {
  while (!t->done) {
    t->joiners.push_back(current_);
    wait_until(time_point::max());
  }
}

std::string Scheduler::current_name() const { return current_ ? current_->name : "the driver"; }

std::string Scheduler::waiting_threads() const {
  std::string s;
  for (const auto& t : threads_)
    if (!t->done) s += (s.empty() ? "" : ", ") + t->name + (t->wakes_at == time_point::max() ? " (waits with no deadline)" : "");
  return s;
}

void Scheduler::run() {
  pass_turn(nullptr);
  std::unique_lock lock(end_mu_);
  for (long turns = -1; !end_cv_.wait_for(lock, kSlowTurn, [&] { return finished_; });) {
    // (read without the turn: a diagnostic, after 5 minutes without a new turn)
    if (turns_.load() == turns)
      std::fprintf(stderr, "[virtual] a thread has kept its turn for %lld s of real time: it waits outside the "
                   "simulation, or computes for long\n", static_cast<long long>(kSlowTurn.count()));
    turns = turns_.load();
  }
  lock.unlock();
  for (auto& t : threads_)
    if (t->os.joinable()) t->os.join();
  if (first_error_) std::rethrow_exception(first_error_);
}

}  // namespace pslab::sim
