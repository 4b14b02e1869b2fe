#include "comm/bucketed_allreduce.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pslab {

BucketedAllreduce::BucketedAllreduce(Collective& coll, float* grads, std::size_t P, std::size_t bucket_floats,
                                     double timeout_s, std::optional<HalfFormat> wire)
    : coll_(coll), grads_(grads), wire_(wire),
      finish_timeout_(std::chrono::milliseconds(long(timeout_s * 2000) + 5000)) {
  if (bucket_floats == 0) throw std::invalid_argument("BucketedAllreduce: bucket of 0 floats");
  // Cut from the end; the first bucket takes the remainder (at least one float, P > 0).
  bounds_.push_back(P);
  while (bounds_.back() > bucket_floats) bounds_.push_back(bounds_.back() - bucket_floats);
  if (bounds_.back() != 0) bounds_.push_back(0);
  std::reverse(bounds_.begin(), bounds_.end());
  ready_lo_ = P;
  thread_ = std::thread([this] { reduce_loop(); });
}

BucketedAllreduce::~BucketedAllreduce() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // a collective in progress ends at the latest at its timeout
}

void BucketedAllreduce::start(long step, float wire_scale) {
  std::lock_guard<std::mutex> lock(mu_);
  if (busy_) throw std::logic_error("BucketedAllreduce: start() before the last step finished");
  step_ = step;
  wire_scale_ = wire_scale;
  ready_lo_ = bounds_.back();
  next_ = buckets();
  busy_ = true;
}

void BucketedAllreduce::ready(std::size_t lo) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lo >= ready_lo_) return;
    ready_lo_ = lo;
  }
  cv_.notify_all();
}

void BucketedAllreduce::finish() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, finish_timeout_, [&] { return !busy_ || error_; }))
    throw std::runtime_error("the all-reduce of step " + std::to_string(step_) + "'s gradient did not finish within " +
                             std::to_string(finish_timeout_.count() / 1000) + " s (" + std::to_string(next_) + " of " +
                             std::to_string(buckets()) + " buckets left)");
  if (error_) std::rethrow_exception(error_);
}

void BucketedAllreduce::reduce_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (busy_ && next_ > 0 && ready_lo_ <= bounds_[next_ - 1]); });
    if (stop_) return;
    const std::size_t k = next_ - 1, lo = bounds_[k], n = bounds_[k + 1] - lo;
    const long step = step_;
    const float scale = wire_scale_;
    lock.unlock();
    try {
      if (wire_) coll_.allreduce_sum_half(grads_ + lo, n, *wire_, scale, step);
      else coll_.allreduce_sum(grads_ + lo, n, step);
    } catch (...) {
      lock.lock();
      error_ = std::current_exception();
      busy_ = false;
      cv_.notify_all();
      return;
    }
    lock.lock();
    next_ = k;
    if (next_ == 0) {
      busy_ = false;
      cv_.notify_all();
    }
  }
}

}  // namespace pslab
