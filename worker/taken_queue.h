// θs an evaluator took when they were due and has not evaluated yet, in order; their buffers are
// reused once evaluated (worker/roles/evaluator.cpp, and the evaluator of libpslab_client). A
// taker thread at the process's priority takes each θ into the queue, while the evaluating
// thread, at a lower priority, works through it: no tick is lost to a slow evaluation while the
// queue has room (kTakenQueueBytes).
// Threading: the taker calls take_buffer/put/fail, the evaluator next/give_back.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <stop_token>
#include <vector>

#include "comm/interrupt.h"

namespace pslab {

constexpr std::size_t kTakenQueueBytes = std::size_t(256) << 20;  // θ copies waiting for evaluation

// Items of P floats that fit in kTakenQueueBytes, at least 2.
inline std::size_t taken_queue_capacity(std::size_t P) {
  return std::max<std::size_t>(2, kTakenQueueBytes / (std::max<std::size_t>(P, 1) * sizeof(float)));
}

template <typename Info>
class TakenQueue {
 public:
  struct Item {
    std::vector<float> theta;
    Info info;
    double taken_s = 0.0;
  };
  TakenQueue(std::size_t floats, std::size_t capacity) : floats_(floats), capacity_(capacity) {}
  // A buffer to take θ into: a free one, a new one while fewer than `capacity` exist, or else
  // the next one evaluated (waiting for it; null if `stop` is requested meanwhile).
  std::unique_ptr<Item> take_buffer(std::stop_token stop) {
    std::unique_lock lock(mu_);
    if (free_.empty() && made_ < capacity_) {
      ++made_;
      auto item = std::make_unique<Item>();
      item->theta.resize(floats_);
      return item;
    }
    if (!cv_.wait(lock, stop, [&] { return !free_.empty(); })) return nullptr;
    auto item = std::move(free_.back());
    free_.pop_back();
    return item;
  }
  void put(std::unique_ptr<Item> item) {
    std::lock_guard lock(mu_);
    queued_.push_back(std::move(item));
    cv_.notify_all();
  }
  // The taker failed: next() rethrows `e` once every θ taken before was evaluated.
  void fail(std::exception_ptr e) {
    std::lock_guard lock(mu_);
    error_ = e;
    cv_.notify_all();
  }
  std::exception_ptr error() {
    std::lock_guard lock(mu_);
    return error_;
  }
  // Blocks until a θ is queued or the taker failed (its own waits have timeouts); a caught
  // interrupt (comm/interrupt.h: a Python evaluator's Ctrl-C) throws.
  std::unique_ptr<Item> next() {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(comm::interrupt_slice_ms(60000)),
                         [&] { return !queued_.empty() || error_; })) {
      lock.unlock();
      comm::throw_if_interrupted();
      lock.lock();
    }
    if (queued_.empty()) std::rethrow_exception(error_);
    auto item = std::move(queued_.front());
    queued_.pop_front();
    return item;
  }
  void give_back(std::unique_ptr<Item> item) {
    std::lock_guard lock(mu_);
    free_.push_back(std::move(item));
    cv_.notify_all();
  }

 private:
  std::size_t floats_, capacity_, made_ = 0;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<std::unique_ptr<Item>> queued_;
  std::vector<std::unique_ptr<Item>> free_;
  std::exception_ptr error_;
};


}  // namespace pslab
