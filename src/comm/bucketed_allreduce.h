// All-reduce of ∇θ in buckets, each started as soon as backward has finished it (overlap, as
// DDP does), on a reducing thread of its own while the training thread computes the rest.
//
// Buckets are [b_k, b_{k+1}) of about bucket_floats, cut from the end of ∇θ: they depend only
// on P, so every rank reduces the same buckets in the same order (last to first, the order
// backward finishes them). Each element is summed exactly as in one whole all-reduce by the
// shm collective and by Gloo with 2 ranks; other collectives may round differently.
//
// Threading: start(), ready() (as the model's GradListener) and finish() are called by the
// training thread. Between start() and finish() the collective belongs to the reducing thread;
// outside, to the training thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "comm/collective.h"
#include "core/model.h"

namespace pslab {

class BucketedAllreduce final : public GradListener {
 public:
  // grads: the P floats of ∇θ (the collective's device); timeout_s: the run's cluster.timeout_s
  // (the collective times out first and names the ranks; finish() waits twice as long);
  // wire: all-reduce in that 16-bit format (cluster.codec f16 / bf16), or float32.
  BucketedAllreduce(Collective& coll, float* grads, std::size_t P, std::size_t bucket_floats, double timeout_s,
                    std::optional<HalfFormat> wire = std::nullopt);
  ~BucketedAllreduce() override;
  BucketedAllreduce(const BucketedAllreduce&) = delete;
  BucketedAllreduce& operator=(const BucketedAllreduce&) = delete;

  // Backward of `step` is about to begin: no part of ∇θ is final yet. wire_scale: a 16-bit
  // wire's scale for this step (Collective::allreduce_sum_half).
  void start(long step, float wire_scale = 1.0f);
  // ∇θ[lo, P) is final: the reducing thread may start every bucket inside it.
  void ready(std::size_t lo) override;
  // Waits until every bucket of the step is reduced; rethrows the reducing thread's error.
  void finish();
  std::size_t buckets() const { return bounds_.size() - 1; }

 private:
  void reduce_loop();

  Collective& coll_;
  float* grads_;
  std::optional<HalfFormat> wire_;
  std::vector<std::size_t> bounds_;  // b_0 = 0 < b_1 < ... < b_n = P
  std::chrono::milliseconds finish_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_:
  long step_ = -1;          // the step being reduced
  float wire_scale_ = 1.0f; // its 16-bit wire's scale
  bool busy_ = false;       // between start() and the last bucket of the step
  std::size_t ready_lo_ = 0;
  std::size_t next_ = 0;    // buckets [0, next_) of the step are not reduced yet (progress)
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace pslab
