#include "ps/shard_state.h"

#include <algorithm>

#include "comm/wire.h"

namespace pslab {

ShardRange shard_range(std::size_t num_params, int num_shards, int shard) {
  if (num_shards < 1 || shard < 0 || shard >= num_shards)
    throw std::invalid_argument("shard " + std::to_string(shard) + " is not in [0, " +
                                std::to_string(num_shards) + ")");
  const std::size_t lo = num_params * std::size_t(shard) / std::size_t(num_shards);
  const std::size_t hi = num_params * std::size_t(shard + 1) / std::size_t(num_shards);
  return {lo, hi - lo};
}

// ---- ParamVersions ----

ParamVersions::ParamVersions(std::vector<float> initial) {
  pool_.push_back(std::make_unique<Buffer>());
  pool_.back()->data = std::move(initial);
  current_ = pool_.back().get();
}

ParamVersions::Buffer* ParamVersions::acquire_current() {
  current_->in_flight.fetch_add(1, std::memory_order_relaxed);
  return current_;
}

float* ParamVersions::next() {
  next_ = nullptr;
  for (auto& b : pool_)
    if (b.get() != current_ && b->in_flight.load(std::memory_order_acquire) == 0) {
      next_ = b.get();
      break;
    }
  if (!next_) {
    pool_.push_back(std::make_unique<Buffer>());
    pool_.back()->data.resize(current_->data.size());
    next_ = pool_.back().get();
  }
  return next_->data.data();
}

void ParamVersions::publish() {
  if (!next_) throw std::logic_error("ParamVersions::publish without next()");
  current_ = next_;
  next_ = nullptr;
}

// ---- ShardState ----

namespace {
constexpr std::size_t kStalenessBuckets = 1024;
constexpr std::size_t kChunk = 8192;  // floats per piece of an update: 32 KiB, stays in L1/L2

[[noreturn]] void bad_checksum() {
  throw PayloadError("push payload checksum mismatch (corrupted in transit)");
}
}  // namespace

ShardState::ShardState(Backend& cpu, const Options& opt, std::vector<float> initial)
    : opt_(opt), be_(cpu), optimizer_(cpu, opt.optimizer, opt.range.length), params_(std::move(initial)),
      clocks_(std::size_t(opt.workers), 0), staleness_(std::size_t(opt.workers)) {
  if (params_.size() != opt.range.length)
    throw std::invalid_argument("ShardState: initial slice has " + std::to_string(params_.size()) +
                                " floats, the shard " + std::to_string(opt.range.length));
  if (opt.mode.kind == Mode::Kind::bsp) {
    acc_.assign(opt.range.length, 0.0f);
    pushed_.assign(std::size_t(opt.workers), 0);
  }
  checksum_ = wire::checksum(params_.current(), params_.size());
}

long ShardState::min_clock() const { return *std::min_element(clocks_.begin(), clocks_.end()); }

bool ShardState::pull_ready(long clock) const {
  switch (opt_.mode.kind) {
    case Mode::Kind::bsp: return version_ >= clock;
    case Mode::Kind::ssp: return min_clock() >= clock - opt_.mode.staleness;
    default: return true;
  }
}

void ShardState::record_pull(int worker, long clock) {
  if (opt_.record_pulls) pulls_.push_back({worker, clock, min_clock(), version_});
}

void ShardState::count_staleness(int worker, long staleness) {
  auto& h = staleness_[std::size_t(worker)];
  const std::size_t b = std::min<std::size_t>(std::size_t(std::max(0L, staleness)), kStalenessBuckets - 1);
  if (h.size() <= b) h.resize(b + 1, 0);
  ++h[b];
}

void ShardState::apply(const float* grad, long samples, const std::uint64_t* verify) {
  const double epoch = double(samples_applied_) / double(opt_.train_size);
  const int global_batch = opt_.mode.kind == Mode::Kind::bsp ? opt_.batch * opt_.workers : opt_.batch;
  const double lr = learning_rate(opt_.schedule, opt_.optimizer.lr, global_batch, epoch);
  const float* cur = params_.current();
  float* next = params_.next();
  wire::Checksum grad_sum, param_sum;
  optimizer_.begin_step();
  for (std::size_t lo = 0; lo < opt_.range.length; lo += kChunk) {
    const std::size_t n = std::min(kChunk, opt_.range.length - lo);
    if (verify) grad_sum.update(grad + lo, n);
    optimizer_.step_range(cur + lo, grad + lo, next + lo, lo, n, lr);
    param_sum.update(next + lo, n);
  }
  if (verify && grad_sum.value() != *verify) bad_checksum();  // `next` is never published
  params_.publish();
  checksum_ = param_sum.value();
  ++version_;
  samples_applied_ += samples;
}

bool ShardState::push(int worker, long clock, long version_pulled, int batch, const float* grad,
                      std::uint64_t checksum) {
  if (worker < 0 || worker >= opt_.workers)
    throw ProtocolError("push from worker " + std::to_string(worker) + ", expected a rank in [0, " +
                        std::to_string(opt_.workers) + ")");
  if (batch < 0) throw ProtocolError("push with batch " + std::to_string(batch) + " < 0");
  long& wclock = clocks_[std::size_t(worker)];
  if (clock != wclock)
    throw ProtocolError("push from worker " + std::to_string(worker) + " for clock " + std::to_string(clock) +
                        ", expected its next clock " + std::to_string(wclock));
  if (version_pulled < 0 || version_pulled > version_)
    throw ProtocolError("push computed on version " + std::to_string(version_pulled) +
                        ", which this shard has not reached (at " + std::to_string(version_) + ")");

  if (opt_.mode.kind != Mode::Kind::bsp) {
    // A stateless optimizer's update can be abandoned before publication: verify the
    // gradient in the same pass. A stateful one would have changed its state: verify first.
    if (optimizer_.stateless()) {
      apply(grad, batch, &checksum);
    } else {
      if (wire::checksum(grad, opt_.range.length) != checksum) bad_checksum();
      apply(grad, batch);
    }
    count_staleness(worker, version_ - 1 - version_pulled);
    ++wclock;
    return true;
  }

  // bsp: the open clock is `version_`; accumulate sum_i batch_i * g_i.
  if (clock != version_)
    throw ProtocolError("bsp push for clock " + std::to_string(clock) + " while clock " +
                        std::to_string(version_) + " is open");
  if (pushed_[std::size_t(worker)])
    throw ProtocolError("second bsp push from worker " + std::to_string(worker) + " for clock " + std::to_string(clock));
  const std::size_t n = opt_.range.length;
  if (wire::checksum(grad, n) != checksum) bad_checksum();
  if (pushes_in_clock_ == 0) {
    for (std::size_t i = 0; i < n; ++i) acc_[i] = float(batch) * grad[i];
  } else {
    be_.axpy(n, float(batch), grad, acc_.data());
  }
  pushed_[std::size_t(worker)] = 1;
  ++pushes_in_clock_;
  samples_in_clock_ += batch;
  ++wclock;
  count_staleness(worker, version_ - version_pulled);
  if (pushes_in_clock_ < opt_.workers) return false;

  // Every worker pushed: apply the batch-weighted mean gradient once.
  if (samples_in_clock_ > 0) be_.scale(n, 1.0f / float(samples_in_clock_), acc_.data());
  apply(acc_.data(), samples_in_clock_);
  std::fill(pushed_.begin(), pushed_.end(), 0);
  pushes_in_clock_ = 0;
  samples_in_clock_ = 0;
  return true;
}

}  // namespace pslab
