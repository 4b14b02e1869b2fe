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

ParamVersions::ParamVersions(std::vector<float> initial, Memory memory) : size_(initial.size()), memory_(std::move(memory)) {
  Buffer& first = add_buffer();
  std::copy(initial.begin(), initial.end(), first.data);
  current_ = &first;
}

ParamVersions::Buffer& ParamVersions::add_buffer() {
  auto b = std::make_unique<Buffer>();
  if (memory_) {
    b->memory = memory_(std::max<std::size_t>(size_, 1) * sizeof(float));
    b->data = static_cast<float*>(b->memory->data());
  } else {
    b->heap.resize(std::max<std::size_t>(size_, 1));
    b->data = b->heap.data();
  }
  pool_.push_back(std::move(b));
  return *pool_.back();
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
  if (!next_) next_ = &add_buffer();
  return next_->data;
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
// Below this many floats per thread an update is not split: waking a thread costs more than
// the pass it would share (512 KiB takes ~70 us at memory speed).
constexpr std::size_t kMinFloatsPerThread = std::size_t(1) << 17;

[[noreturn]] void bad_checksum() {
  throw ChecksumError("push payload checksum mismatch (corrupted in transit)");
}
}  // namespace

ShardState::ShardState(Backend& cpu, const Options& opt, std::vector<float> initial)
    : opt_(opt), be_(cpu), mode_(mode_of(opt.mode)), codec_(make_codec(opt.codec)),
      optimizer_(cpu, opt.optimizer, opt.range.length, opt.layers),
      params_(std::move(initial), opt.memory), clocks_(std::size_t(opt.workers), 0), lost_(std::size_t(opt.workers), 0),
      staleness_(std::size_t(opt.workers)), team_(std::max(1, opt.threads)), grad_sums_(std::size_t(team_.size())),
      param_sums_(std::size_t(team_.size())) {
  if (!mode_.uses_servers()) throw std::invalid_argument("cluster.mode = \"" + opt.mode + "\" has no servers");
  if (params_.size() != opt.range.length)
    throw std::invalid_argument("ShardState: initial slice has " + std::to_string(params_.size()) +
                                " floats, the shard " + std::to_string(opt.range.length));
  checksum_ = checksum_of(params_.current());
  if (!codec_->dense_f32()) decoded_.resize(opt.range.length);
}

ShardCheckpoint ShardState::checkpoint() const {
  ShardCheckpoint c;
  c.offset = opt_.range.offset;
  c.length = opt_.range.length;
  c.version = version_;
  c.samples_applied = samples_applied_;
  c.clocks = clocks_;
  c.lost = lost_;
  c.theta.assign(params_.current(), params_.current() + params_.size());
  c.optimizer_steps = optimizer_.steps();
  c.optimizer = optimizer_.state();
  c.kept = kept_;
  c.kept_counts = kept_counts_;
  c.staleness = staleness_;
  return c;
}

void ShardState::restore(const ShardCheckpoint& c) {
  if (c.offset != opt_.range.offset || c.length != opt_.range.length)
    throw std::invalid_argument("it holds floats [" + std::to_string(c.offset) + ", " + std::to_string(c.offset + c.length) +
                                "), this shard is [" + std::to_string(opt_.range.offset) + ", " +
                                std::to_string(opt_.range.offset + opt_.range.length) + ")");
  if (c.clocks.size() != clocks_.size())
    throw std::invalid_argument("it has " + std::to_string(c.clocks.size()) + " workers, this run " +
                                std::to_string(clocks_.size()));
  if (!c.kept.empty() && c.kept.size() != opt_.range.length) throw std::invalid_argument("its mode's buffer has the wrong size");
  optimizer_.restore(c.optimizer_steps, c.optimizer);
  float* next = params_.next();
  std::copy(c.theta.begin(), c.theta.end(), next);
  params_.publish();
  checksum_ = checksum_of(params_.current());
  version_ = c.version;
  samples_applied_ = c.samples_applied;
  clocks_ = c.clocks;
  lost_ = c.lost;
  kept_ = c.kept;
  kept_counts_ = c.kept_counts;
  staleness_ = c.staleness;
  for (auto& h : staleness_)  // the file pads every histogram to the longest
    while (!h.empty() && h.back() == 0) h.pop_back();
}

void ShardState::record_pull(int worker, long clock) {
  if (opt_.record_pulls) pulls_.push_back({worker, clock, min_clock(), version_});
  if (mode_.keeps_served_theta() && worker >= 0 && worker < opt_.workers) {
    const std::size_t n = opt_.range.length;
    if (served_.empty()) served_.assign(std::size_t(opt_.workers) * n, 0.0f), served_version_.assign(std::size_t(opt_.workers), -1);
    std::copy(params_.current(), params_.current() + n, served_.begin() + std::ptrdiff_t(std::size_t(worker) * n));
    served_version_[std::size_t(worker)] = version_;
  }
}

void ShardState::count_staleness(int worker, long staleness) {
  auto& h = staleness_[std::size_t(worker)];
  const std::size_t b = std::min<std::size_t>(std::size_t(std::max(0L, staleness)), kStalenessBuckets - 1);
  if (h.size() <= b) h.resize(b + 1, 0);
  ++h[b];
}

void ShardState::update(const float* x, long update_samples, double lr_factor, const std::uint64_t* verify, Update how) {
  const double epoch = double(samples_applied_) / double(opt_.train_size);
  const int lr_batch = mode_.update_batch(opt_.batch, opt_.workers);
  const double lr = lr_factor * learning_rate(opt_.schedule, opt_.optimizer.lr, lr_batch, epoch);
  const float* cur = params_.current();
  float* next = params_.next();
  if (how.optimizer) {
    optimizer_.begin_step();
    optimizer_.prepare(cur, x);  // layer-wise optimizers: the trust ratios over the whole shard
  }
  const float scale = float(how.scale);
  const int slices = for_slices([&](std::size_t begin, std::size_t end, int t) {
    wire::Checksum x_sum, param_sum;
    for (std::size_t lo = begin; lo < end; lo += kChunk) {
      const std::size_t n = std::min(kChunk, end - lo);
      if (verify) x_sum.update(x + lo, n);
      if (how.optimizer) {
        optimizer_.step_range(cur + lo, x + lo, next + lo, lo, n, lr);
      } else {
        for (std::size_t i = lo; i < lo + n; ++i) next[i] = cur[i] + scale * x[i];
      }
      param_sum.update(next + lo, n);
    }
    grad_sums_[std::size_t(t)] = x_sum, param_sums_[std::size_t(t)] = param_sum;
  });
  for (int t = 1; t < slices; ++t) grad_sums_[0].append(grad_sums_[std::size_t(t)]), param_sums_[0].append(param_sums_[std::size_t(t)]);
  if (verify && grad_sums_[0].value() != *verify) bad_checksum();  // `next` is never published
  params_.publish();
  checksum_ = param_sums_[0].value();
  ++version_;
  samples_applied_ += update_samples;
}

int ShardState::for_slices(const std::function<void(std::size_t, std::size_t, int)>& fn) {
  const std::size_t n = opt_.range.length;
  const int slices = int(std::clamp<std::size_t>(n / kMinFloatsPerThread, 1, std::size_t(team_.size())));
  if (slices == 1) {
    fn(0, n, 0);
    return 1;
  }
  const std::size_t per = ((n + std::size_t(slices) - 1) / std::size_t(slices) + 15) / 16 * 16;  // 64-byte multiples
  team_.run([&](int t) {
    const std::size_t lo = std::min(n, std::size_t(t) * per), hi = std::min(n, lo + per);
    if (t < slices) fn(lo, hi, t);
  });
  return slices;
}

std::uint64_t ShardState::checksum_of(const float* data) {
  const int slices = for_slices([&](std::size_t lo, std::size_t hi, int t) {
    wire::Checksum c;
    c.update(data + lo, hi - lo);
    grad_sums_[std::size_t(t)] = c;
  });
  for (int t = 1; t < slices; ++t) grad_sums_[0].append(grad_sums_[std::size_t(t)]);
  return grad_sums_[0].value();
}

// ---- the primitives a mode uses (ShardOps) ----

const float* ShardState::payload() {
  if (!pending_.verified) {
    if (checksum_of(pending_.payload) != pending_.checksum) bad_checksum();
    pending_.verified = true;
  }
  return pending_.payload;
}

const float* ShardState::served(int worker) {
  if (served_version_.empty() || served_version_[std::size_t(worker)] != pending_.version_pulled)
    throw ProtocolError(mode_.name() + ": worker " + std::to_string(worker) + " pushed a gradient of version " +
                        std::to_string(pending_.version_pulled) + ", but this shard last served it " +
                        (served_version_.empty() || served_version_[std::size_t(worker)] < 0
                             ? std::string("nothing")
                             : "version " + std::to_string(served_version_[std::size_t(worker)])));
  return served_.data() + std::size_t(worker) * opt_.range.length;
}

float* ShardState::kept() {
  if (kept_.size() != opt_.range.length) kept_.assign(opt_.range.length, 0.0f);
  return kept_.data();
}

float* ShardState::scratch() {
  if (scratch_.size() != opt_.range.length) scratch_.resize(opt_.range.length);
  return scratch_.data();
}

void ShardState::update_with(const float* x, long samples, double lr_factor, Update how) {
  if (x) return update(x, samples, lr_factor, nullptr, how);
  // This push's payload. A stateless update can be abandoned before publication: its payload is
  // checked in the same pass. A stateful one (momentum, Adam) would have changed its state: checked first.
  if (!pending_.verified && (!how.optimizer || optimizer_.stateless())) {
    update(pending_.payload, samples, lr_factor, &pending_.checksum, how);
    pending_.verified = true;
  } else {
    update(payload(), samples, lr_factor, nullptr, how);
  }
}

void ShardState::step(const float* grad, double lr_factor, long samples) {
  if (!grad && pending_.batch == 0) return (void)payload();  // an empty batch: no update (momentum, Adam, decay would move θ)
  if (opt_.optimizer.staleness_lr) lr_factor /= double(std::max(1L, pending_staleness()));  // Zhang et al. 2016
  update_with(grad, samples, lr_factor, Update{true, 1.0});
}

void ShardState::add(const float* change, double scale, long samples) {
  if (!change && pending_.batch == 0) return (void)payload();
  update_with(change, samples, 1.0, Update{false, scale});
}

void ShardState::push(int worker, long clock, long version_pulled, int batch, std::span<const std::byte> payload,
                      std::uint64_t checksum) {
  if (worker < 0 || worker >= opt_.workers)
    throw ProtocolError("push from worker " + std::to_string(worker) + ", expected a rank in [0, " +
                        std::to_string(opt_.workers) + ")");
  if (batch < 0) throw ProtocolError("push with batch " + std::to_string(batch) + " < 0");
  if (lost_[std::size_t(worker)])
    throw ProtocolError("push from worker " + std::to_string(worker) + ", which this run dropped as lost");
  long& wclock = clocks_[std::size_t(worker)];
  if (clock != wclock)
    throw ProtocolError("push from worker " + std::to_string(worker) + " for clock " + std::to_string(clock) +
                        ", expected its next clock " + std::to_string(wclock));
  if (version_pulled < 0 || version_pulled > version_)
    throw ProtocolError("push computed on version " + std::to_string(version_pulled) +
                        ", which this shard has not reached (at " + std::to_string(version_) + ")");
  const PushInfo info{worker, clock, version_pulled, batch};
  mode_.check_push(info, view());

  // The payload, dense. Dense f32 is read in place and checked in the first pass over it
  // (fused with the update where it can be); other codecs are checked, then decoded.
  const std::size_t n = opt_.range.length;
  const float* dense = decoded_.data();
  bool verified = false;
  if (codec_->dense_f32()) {
    if (payload.size() != n * sizeof(float))
      throw PayloadError("f32 payload of " + std::to_string(payload.size()) + " bytes for a shard of " +
                         std::to_string(n) + " floats");
    if (reinterpret_cast<std::uintptr_t>(payload.data()) % alignof(float) == 0) {
      dense = reinterpret_cast<const float*>(payload.data());
    } else {
      if (decoded_.size() != n) decoded_.resize(n);  // a transport that does not align: copy once
      codec_->decode(payload, n, decoded_.data());
      dense = decoded_.data();
    }
  } else {
    if (wire::checksum_bytes(payload.data(), payload.size()) != checksum) bad_checksum();
    codec_->decode(payload, n, decoded_.data());
    verified = true;
  }

  // The mode sees the worker's clock with this push counted; a payload that fails its check
  // in the mode's first read of it changed nothing, and the clock goes back.
  const long arrived_at = version_;
  pending_ = Pending{dense, checksum, batch, verified, worker, version_pulled};
  ++wclock;
  try {
    mode_.on_push(info, view(), *this);
  } catch (...) {
    --wclock;
    pending_ = Pending{};
    throw;
  }
  pending_ = Pending{};
  if (batch > 0) count_staleness(worker, arrived_at - version_pulled);
}

long ShardState::fast_forward(int worker, long clock) {
  long& c = clocks_.at(std::size_t(worker));
  if (clock <= c) return 0;
  if (!mode_.trains_without_lost_workers())
    throw std::logic_error(mode_.name() + " cannot train on without worker " + std::to_string(worker) + "'s updates");
  const long lost = clock - c;
  c = clock;
  return lost;
}

void ShardState::drop_worker(int worker) {
  if (!mode_.trains_without_lost_workers())
    throw std::logic_error(mode_.name() + " cannot train on without worker " + std::to_string(worker));
  lost_.at(std::size_t(worker)) = 1;
}

}  // namespace pslab
