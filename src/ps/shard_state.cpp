#include "ps/shard_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/wire.h"

namespace pslab {

namespace {

// Where shard k begins (k = num_shards: the end), whole layers each (see shard_range).
std::size_t layer_boundary(std::size_t num_params, int num_shards, int k, const std::vector<std::size_t>& layers) {
  const std::size_t L = layers.size(), S = std::size_t(num_shards);
  if (L < S)
    throw std::invalid_argument(std::to_string(num_shards) + " shards of whole layers for a model of " +
                                std::to_string(L) + " layers");
  std::vector<std::size_t> ends(L + 1, 0);  // ends[j]: where layer j begins (ends[L] = num_params)
  for (std::size_t j = 0; j < L; ++j) ends[j + 1] = ends[j] + layers[j];
  if (ends[L] != num_params)
    throw std::invalid_argument("layers of " + std::to_string(ends[L]) + " parameters for " + std::to_string(num_params));
  std::size_t at = 0;  // the layer the boundary before begins at
  for (std::size_t i = 1; i <= std::size_t(k); ++i) {
    if (i == S) return num_params;
    const double balanced = double(num_params) * double(i) / double(S);
    std::size_t best = at + 1;  // at least one layer for this shard, and one for each after it
    for (std::size_t j = at + 1; j <= L - (S - i); ++j)
      if (std::abs(double(ends[j]) - balanced) < std::abs(double(ends[best]) - balanced)) best = j;
    at = best;
  }
  return ends[at];
}

}  // namespace

ShardRange shard_range(std::size_t num_params, int num_shards, int shard, const std::vector<std::size_t>& layers) {
  if (num_shards < 1 || shard < 0 || shard >= num_shards)
    throw std::invalid_argument("shard " + std::to_string(shard) + " is not in [0, " +
                                std::to_string(num_shards) + ")");
  if (!layers.empty()) {
    const std::size_t lo = layer_boundary(num_params, num_shards, shard, layers);
    return {lo, layer_boundary(num_params, num_shards, shard + 1, layers) - lo};
  }
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

ParamVersions::Buffer* ParamVersions::acquire_next() {
  if (!next_) throw std::logic_error("ParamVersions::acquire_next without next()");
  next_->in_flight.fetch_add(1, std::memory_order_relaxed);
  return next_;
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
      param_segs_(std::size_t(team_.size())), seg_first_(std::size_t(team_.size()), 0) {
  win_n_ = opt.range.length;
  piece_sums_.resize(pieces());
  next_piece_sums_.resize(pieces());
  for (auto& segs : param_segs_) segs.reserve(pieces() + 1);
  incoming_.resize(std::size_t(opt.workers));
  if (!mode_.uses_servers()) throw std::invalid_argument("cluster.mode = \"" + opt.mode + "\" has no servers");
  if (optimizer_.needs_whole_range() && pieces() > 1)  // (pieces_of() gives it whole shards)
    throw std::invalid_argument("optimizer.kind = \"" + opt.optimizer.kind + "\" reads the whole shard before it " +
                                "updates it: its pushes cannot be applied in pieces");
  if (params_.size() != opt.range.length)
    throw std::invalid_argument("ShardState: initial slice has " + std::to_string(params_.size()) +
                                " floats, the shard " + std::to_string(opt.range.length));
  sum_current();
  if (!codec_->dense_f32()) decoded_.resize(opt.range.length);
}

void ShardState::sum_current() {
  const float* theta = params_.current();
  for (std::size_t q = 0; q < pieces(); ++q) {
    const std::size_t lo = opt_.pieces.begin(length_all(), q);
    piece_sums_[q] = wire::Checksum();
    piece_sums_[q].update(theta + lo, opt_.pieces.size(length_all(), q));
  }
  wire::Checksum whole = piece_sums_[0];
  for (std::size_t q = 1; q < pieces(); ++q) whole.append(piece_sums_[q]);
  checksum_ = whole.value();
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
  sum_current();
  version_ = c.version;
  for (Incoming& in : incoming_) in.open = false;
  applying_ = -1, queue_.clear();
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
  const bool windowed = applying_ >= 0;  // a push in pieces: this piece's window, published at its end
  const float* cur = params_.current() + win_lo_;
  float* next = (windowed ? stream_next_ : params_.next()) + win_lo_;
  if (how.optimizer && !windowed) {
    optimizer_.begin_step();
    optimizer_.prepare(cur, x);  // layer-wise optimizers: the trust ratios over the whole shard (never in pieces)
  } else if (how.optimizer && !stream_.optimizer) {
    optimizer_.begin_step();  // once per push, at its first piece (Adam's bias correction counts it)
  }
  const float scale = float(how.scale);
  const int slices = for_slices(win_n_, [&](std::size_t begin, std::size_t end, int t) {
    wire::Checksum x_sum;
    std::vector<wire::Checksum>& segs = param_segs_[std::size_t(t)];
    segs.clear();
    seg_first_[std::size_t(t)] = piece_of(win_lo_ + begin);
    segs.emplace_back();
    for (std::size_t lo = begin; lo < end;) {
      // A chunk stays in cache for both passes, and inside one piece (its checksum is the piece's).
      const std::size_t n = std::min({kChunk, end - lo, piece_end(piece_of(win_lo_ + lo)) - (win_lo_ + lo)});
      if (verify) x_sum.update(x + lo, n);
      if (how.optimizer) {
        optimizer_.step_range(cur + lo, x + lo, next + lo, win_lo_ + lo, n, lr);
      } else {
        for (std::size_t i = lo; i < lo + n; ++i) next[i] = cur[i] + scale * x[i];
      }
      segs.back().update(next + lo, n);
      lo += n;
      if (lo < end && piece_of(win_lo_ + lo) != piece_of(win_lo_ + lo - 1)) segs.emplace_back();
    }
    grad_sums_[std::size_t(t)] = x_sum;
  });
  for (int t = 1; t < slices; ++t) grad_sums_[0].append(grad_sums_[std::size_t(t)]);
  if (verify && grad_sums_[0].value() != *verify) bad_checksum();  // `next` is never published
  std::size_t last = std::size_t(-1);  // the pieces' checksums, from the slices' segments in order
  for (int t = 0; t < slices; ++t)
    for (std::size_t j = 0; j < param_segs_[std::size_t(t)].size(); ++j) {
      const std::size_t q = seg_first_[std::size_t(t)] + j;
      if (q != last) next_piece_sums_[q] = param_segs_[std::size_t(t)][j];
      else next_piece_sums_[q].append(param_segs_[std::size_t(t)][j]);
      last = q;
    }
  if (windowed) {
    stream_ = Stream{true, how.optimizer || stream_.optimizer, update_samples};
    return;
  }
  params_.publish();
  publish_sums();
  ++version_;
  samples_applied_ += update_samples;
}

void ShardState::publish_sums() {
  piece_sums_.swap(next_piece_sums_);
  wire::Checksum whole = piece_sums_[0];
  for (std::size_t q = 1; q < pieces(); ++q) whole.append(piece_sums_[q]);
  checksum_ = whole.value();
}

int ShardState::for_slices(std::size_t n, const std::function<void(std::size_t, std::size_t, int)>& fn) {
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

std::uint64_t ShardState::checksum_of(const float* data, std::size_t n) {
  const int slices = for_slices(n, [&](std::size_t lo, std::size_t hi, int t) {
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
    if (checksum_of(pending_.payload, win_n_) != pending_.checksum) bad_checksum();
    pending_.verified = true;
  }
  return pending_.payload;
}

const float* ShardState::served(int worker) {
  // None served here (a server restarted from its checkpoint, which holds no served copies, or
  // a backup that joined by the shard's snapshot): the push counts as computed on θ now.
  if (served_version_.empty() || served_version_[std::size_t(worker)] < 0) return theta();
  if (served_version_[std::size_t(worker)] != pending_.version_pulled)
    throw ProtocolError(mode_.name() + ": worker " + std::to_string(worker) + " pushed a gradient of version " +
                        std::to_string(pending_.version_pulled) + ", but this shard last served it version " +
                        std::to_string(served_version_[std::size_t(worker)]));
  return served_.data() + std::size_t(worker) * opt_.range.length + win_lo_;
}

float* ShardState::kept() {
  if (kept_.size() != opt_.range.length) kept_.assign(opt_.range.length, 0.0f);
  return kept_.data() + win_lo_;
}

float* ShardState::scratch() {
  if (scratch_.size() != opt_.range.length) scratch_.resize(opt_.range.length);
  return scratch_.data() + win_lo_;
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

void ShardState::advance() {
  if (applying_ < 0) return (void)++version_;
  // A streaming push's piece that leaves θ as it is: the next version's piece is the current one's.
  std::copy(params_.current() + win_lo_, params_.current() + win_lo_ + win_n_, stream_next_ + win_lo_);
  next_piece_sums_[piece_of(win_lo_)] = piece_sums_[piece_of(win_lo_)];
  stream_ = Stream{true, stream_.optimizer, 0};
}

// ---- pushes ----

void ShardState::check_push(const PushInfo& p) const {
  if (p.worker < 0 || p.worker >= opt_.workers)
    throw ProtocolError("push from worker " + std::to_string(p.worker) + ", expected a rank in [0, " +
                        std::to_string(opt_.workers) + ")");
  if (p.batch < 0) throw ProtocolError("push with batch " + std::to_string(p.batch) + " < 0");
  if (lost_[std::size_t(p.worker)])
    throw ProtocolError("push from worker " + std::to_string(p.worker) + ", which this run dropped as lost");
  const long wclock = clocks_[std::size_t(p.worker)];
  if (p.clock != wclock)
    throw ProtocolError("push from worker " + std::to_string(p.worker) + " for clock " + std::to_string(p.clock) +
                        ", expected its next clock " + std::to_string(wclock));
  if (p.version_pulled < 0 || p.version_pulled > version_)
    throw ProtocolError("push computed on version " + std::to_string(p.version_pulled) +
                        ", which this shard has not reached (at " + std::to_string(version_) + ")");
  mode_.check_push(p, view());
}

void ShardState::push(int worker, long clock, long version_pulled, int batch, std::span<const std::byte> payload,
                      std::uint64_t checksum) {
  const PushInfo info{worker, clock, version_pulled, batch};
  check_push(info);
  if (applying_ >= 0 || !queue_.empty() || incoming_[std::size_t(worker)].open)
    throw ProtocolError("a whole push while a push in pieces is open: the server hands pushes to push_piece()");
  apply_push(info, payload, checksum, false);
}

void ShardState::apply_push(const PushInfo& info, std::span<const std::byte> payload, std::uint64_t checksum,
                            bool verified) {
  // The payload, dense. Dense f32 is read in place and checked in the first pass over it
  // (fused with the update where it can be); other codecs are checked, then decoded.
  const std::size_t n = opt_.range.length;
  const float* dense = decoded_.data();
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
    if (!verified && wire::checksum_bytes(payload.data(), payload.size()) != checksum) bad_checksum();
    codec_->decode(payload, n, decoded_.data());
    verified = true;
  }

  // The mode sees the worker's clock with this push counted; a payload that fails its check
  // in the mode's first read of it changed nothing, and the clock goes back.
  const long arrived_at = version_;
  long& wclock = clocks_[std::size_t(info.worker)];
  pending_ = Pending{dense, checksum, info.batch, verified, info.worker, info.version_pulled};
  ++wclock;
  try {
    mode_.on_push(info, view(), *this);
  } catch (...) {
    --wclock;
    pending_ = Pending{};
    throw;
  }
  pending_ = Pending{};
  if (info.batch > 0) count_staleness(info.worker, arrived_at - info.version_pulled);
}

void ShardState::push_piece(const PieceOf& p, std::span<const std::byte> payload, std::uint64_t checksum, Listener& l) {
  if (p.worker < 0 || p.worker >= opt_.workers) {
    l.push_ended(Done{p.worker, p.clock, std::make_exception_ptr(ProtocolError(
        "push from worker " + std::to_string(p.worker) + ", expected a rank in [0, " + std::to_string(opt_.workers) + ")"))});
    return;
  }
  Incoming& in = incoming_[std::size_t(p.worker)];
  const PushInfo info{p.worker, p.clock, p.version_pulled, p.batch};
  // A refusal abandons the worker's open push, if any, and ends this one with the reason.
  auto refuse = [&](std::exception_ptr why) {
    abandon_push(p.worker, l);
    l.push_ended(Done{p.worker, p.clock, why});
  };
  if (p.piece >= p.pieces)  // (a whole push is piece 0 of 1)
    return refuse(std::make_exception_ptr(ProtocolError("push piece " + std::to_string(p.piece) + " of " +
                                                        std::to_string(p.pieces) + " from worker " + std::to_string(p.worker))));
  if (p.piece == 0) {
    if (in.open)
      return refuse(std::make_exception_ptr(ProtocolError(
          "push of worker " + std::to_string(p.worker) + " for clock " + std::to_string(p.clock) + " while its push for clock " +
          std::to_string(in.info.clock) + " is not applied yet")));
    try {
      check_push(info);
      if (p.pieces != 1 && (p.pieces != pieces() || !codec_->dense_f32()))
        throw ProtocolError("push in " + std::to_string(p.pieces) + " pieces; this shard's pushes come in " +
                            std::to_string(codec_->dense_f32() ? pieces() : 1) + " (cluster.piece_kib, cluster.codec)");
      if (p.pieces == 1 && queue_.empty()) {  // whole, nothing before it: applied now, as push() does
        apply_push(info, payload, checksum, false);
        return l.push_ended(Done{p.worker, p.clock, nullptr});
      }
    } catch (...) {
      return l.push_ended(Done{p.worker, p.clock, std::current_exception()});
    }
    in.open = true, in.info = info, in.pieces = p.pieces, in.arrived = in.applied = 0;
    in.streams = p.pieces > 1 && streams_in_pieces();
    in.parts.resize(p.pieces);
    queue_.push_back(p.worker);
  } else if (!in.open || p.piece != in.arrived || p.pieces != in.pieces || p.clock != in.info.clock ||
             p.version_pulled != in.info.version_pulled || p.batch != in.info.batch) {
    return refuse(std::make_exception_ptr(ProtocolError(
        "worker " + std::to_string(p.worker) + " clock " + std::to_string(p.clock) + ": piece " + std::to_string(p.piece) +
        " of " + std::to_string(p.pieces) +
        (in.open ? " of a push whose next is piece " + std::to_string(in.arrived) + " of " + std::to_string(in.pieces) +
                       " (or unlike its first piece)"
                 : " of a push whose first piece did not come"))));
  }
  if (p.pieces > 1) {
    const std::size_t n = opt_.pieces.size(length_all(), p.piece);
    if (payload.size() != n * sizeof(float))
      return refuse(std::make_exception_ptr(PayloadError("f32 piece of " + std::to_string(payload.size()) + " bytes for piece " +
                                                         std::to_string(p.piece) + " of " + std::to_string(n) + " floats")));
    // A push applied once all came changes state in place: each piece checked as it comes.
    if (!in.streams && wire::checksum_bytes(payload.data(), payload.size()) != checksum)
      return refuse(std::make_exception_ptr(ChecksumError("push payload checksum mismatch (corrupted in transit)")));
  }
  in.parts[p.piece] = Incoming::Part{payload, checksum};
  ++in.arrived;
  pump(l);
}

void ShardState::pump(Listener& l) {
  while (!queue_.empty()) {
    const int w = queue_.front();
    Incoming& in = incoming_[std::size_t(w)];
    if (in.pieces == 1) {  // a whole push that waited for the ones before it
      std::exception_ptr error;
      try {
        check_push(in.info);
        apply_push(in.info, in.parts[0].bytes, in.parts[0].checksum, false);
      } catch (...) {
        error = std::current_exception();
      }
      end_push(w, error, l);
      continue;
    }
    if (!in.streams && in.arrived < in.pieces) return;  // applied once every piece came
    if (applying_ != w) {
      try {
        check_push(in.info);  // again: a push before it may have changed what the rule allows
      } catch (...) {
        end_push(w, std::current_exception(), l);
        continue;
      }
      applying_ = w, stream_next_ = params_.next(), stream_ = Stream{}, counts_before_ = kept_counts_;
    }
    std::exception_ptr error;
    for (; in.applied < in.arrived && !error; ++in.applied) {
      try {
        apply_window(in, in.applied);
        l.piece_applied(w, in.applied);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error) {  // refused in a piece: before any change (checked pieces), or streaming (nothing kept, never published)
      if (stream_.optimizer) optimizer_.cancel_step();
      kept_counts_ = counts_before_;
      applying_ = -1, stream_next_ = nullptr;
      end_push(w, error, l);
      continue;
    }
    if (in.applied < in.pieces) return;  // streaming: its next piece has not come
    commit_window(in);
    end_push(w, nullptr, l);
  }
}

void ShardState::apply_window(Incoming& in, std::size_t p) {
  const std::size_t lo = opt_.pieces.begin(length_all(), p), n = opt_.pieces.size(length_all(), p);
  const std::span<const std::byte> payload = in.parts[p].bytes;
  const float* dense = reinterpret_cast<const float*>(payload.data());
  if (reinterpret_cast<std::uintptr_t>(payload.data()) % alignof(float) != 0) {  // a transport that does not align
    if (decoded_.size() != length_all()) decoded_.resize(length_all());
    std::memcpy(decoded_.data() + lo, payload.data(), payload.size());
    dense = decoded_.data() + lo;
  }
  // The mode runs on this piece's window with the push's clock counted, as for a whole push,
  // from the same state for every piece (its kept counts as before the push); between pieces
  // the shard is as it was before the push (its clock, version and θ).
  long& wclock = clocks_[std::size_t(in.info.worker)];
  kept_counts_ = counts_before_;
  win_lo_ = lo, win_n_ = n;
  pending_ = Pending{dense, in.parts[p].checksum, in.info.batch, !in.streams, in.info.worker, in.info.version_pulled};
  ++wclock;
  try {
    mode_.on_push(in.info, view(), *this);
  } catch (...) {
    --wclock, win_lo_ = 0, win_n_ = length_all(), pending_ = Pending{}, kept_counts_ = counts_before_;
    throw;
  }
  --wclock, win_lo_ = 0, win_n_ = length_all(), pending_ = Pending{};
}

void ShardState::commit_window(Incoming& in) {
  const long arrived_at = version_;
  if (stream_.advanced) {
    params_.publish();
    publish_sums();
    ++version_;
    samples_applied_ += stream_.samples;
  }
  ++clocks_[std::size_t(in.info.worker)];
  if (in.info.batch > 0) count_staleness(in.info.worker, arrived_at - in.info.version_pulled);
  applying_ = -1, stream_next_ = nullptr;
}

void ShardState::end_push(int worker, std::exception_ptr error, Listener& l) {
  Incoming& in = incoming_[std::size_t(worker)];
  in.open = false;
  queue_.erase(std::remove(queue_.begin(), queue_.end(), worker), queue_.end());
  l.push_ended(Done{worker, in.info.clock, error});
}

ShardState::After ShardState::after_stream(long pull_clock) {
  After a;
  if (applying_ < 0) return a;
  long& wclock = clocks_[std::size_t(applying_)];
  ++wclock, version_ += stream_.advanced;
  a = After{stream_.advanced, version_, min_clock(), samples_applied_ + stream_.samples, mode_.pull_ready(pull_clock, view())};
  --wclock, version_ -= stream_.advanced;
  return a;
}

void ShardState::abandon_push(int worker, Listener& l) {
  if (worker < 0 || worker >= opt_.workers || !incoming_[std::size_t(worker)].open) return;
  Incoming& in = incoming_[std::size_t(worker)];
  if (applying_ == worker) {  // only a streaming push is ever left half-applied: its version never published
    if (stream_.optimizer) optimizer_.cancel_step();
    kept_counts_ = counts_before_;
    applying_ = -1, stream_next_ = nullptr;
  }
  in.open = false;
  queue_.erase(std::remove(queue_.begin(), queue_.end(), worker), queue_.end());
  l.push_ended(Done{worker, in.info.clock, nullptr, /*abandoned*/ true});
  pump(l);  // the pushes that waited for it
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

void ShardState::readmit_worker(int worker) { lost_.at(std::size_t(worker)) = 0; }

}  // namespace pslab
