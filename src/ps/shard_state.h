// One shard of θ on a parameter server: its parameters by version, the optimizer state for
// its range, the clock table of the workers and the staleness statistics. A plain object
// that the server's event loop drives and that tests drive directly, without sockets.
//
// What a push does and when a pull may be served is the mode's decision (ps/modes/mode.h,
// chosen by Options::mode); the shard checks what every mode needs (a worker's rank, its next
// clock, a version the shard has had, the payload's checksum), decodes the payload with the
// run's push codec (ps/codecs/, Options::codec) and asks the mode, which updates θ through the
// shard's primitives (ShardOps).
//
// Versions: `version` counts updates applied to the shard. Staleness of a push = the shard's
// version when it arrived - the version its gradient was computed on (0 under bsp).
//
// Pushes in pieces (ps/pieces.h, cluster.piece_kib): push_piece() takes each piece as it
// arrives, by reference (the caller keeps its bytes until the push ends). Pushes are applied
// one at a time, in the order their first pieces came, piece by piece: the mode runs on each
// piece's window of the shard, writing the next version's buffer, which is published whole with
// the push's last piece, so a pull never sees a torn version (pulls in between are served the
// current one). A push streams (each piece applied as it comes, its checksum verified in the
// same pass) where the mode applies_in_pieces() and the optimizer keeps no state; otherwise
// each piece is verified as it comes and the push applied once all came (a push that changes
// state in place must not fail half-way). The result is bit for bit the whole push's: the same
// arithmetic per float, the same learning rate, version and counts. A streaming push abandoned
// half-way (a bad piece, its worker lost) leaves no trace.
//
// Threading: one thread (the server's event loop) calls everything, except
// ParamVersions::release(), which a transport's I/O thread calls when a zero-copy send is done.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "comm/transport/transport.h"
#include "comm/wire.h"
#include "thread_team.h"
#include "core/optimizer.h"
#include "ps/checkpoint.h"
#include "ps/codecs/codec.h"
#include "ps/errors.h"
#include "ps/modes/mode.h"
#include "ps/pieces.h"

namespace pslab {

// Contiguous range [offset, offset + length) of θ owned by one server; shards are balanced
// by length (they differ by at most one float). With `layers` (the sizes of the model's
// consecutive layers, summing to num_params: for an optimizer that needs whole layers, lars
// and lamb) no layer is split: each boundary is the layer boundary nearest the balanced one,
// every shard at least one layer (std::invalid_argument when there are fewer layers than
// shards).
struct ShardRange {
  std::size_t offset = 0, length = 0;
};
ShardRange shard_range(std::size_t num_params, int num_shards, int shard, const std::vector<std::size_t>& layers = {});

// The shard's parameters by version, for zero-copy pull replies: a reply references the
// current buffer until ZeroMQ has sent it, so an update writes the next version into a
// buffer that no send references (out of place; no copy) and then makes it current.
// Buffers come from `memory` when given (the transport's payload_memory(): shared memory that the
// shm transport lends instead of copying), else from the heap.
class ParamVersions {
 public:
  using Memory = std::function<std::unique_ptr<comm::PayloadMemory>(std::size_t bytes)>;
  struct Buffer {
    float* data = nullptr;  // size() floats
    std::atomic<int> in_flight{0};  // zero-copy sends referencing this buffer
    std::vector<float> heap;                     // the floats, or
    std::unique_ptr<comm::PayloadMemory> memory;  // where they are
  };
  explicit ParamVersions(std::vector<float> initial, Memory memory = {});

  const float* current() const { return current_->data; }
  std::size_t size() const { return size_; }
  // Marks the current buffer as referenced by one more send; pass the result to release()
  // (the transport's release callback) when the send is done.
  Buffer* acquire_current();
  // The same for the buffer last returned by next() (a version being written, for a reply that
  // leaves piece by piece as it is written).
  Buffer* acquire_next();
  static void release(Buffer* b) { b->in_flight.fetch_sub(1, std::memory_order_release); }
  // A buffer other than the current one that no send references (allocated if none is free).
  float* next();
  // Makes the buffer last returned by next() current.
  void publish();
  std::size_t buffers() const { return pool_.size(); }

 private:
  Buffer& add_buffer();
  std::size_t size_;
  Memory memory_;
  std::vector<std::unique_ptr<Buffer>> pool_;
  Buffer* current_;
  Buffer* next_ = nullptr;
};

// A served pull, for checking the gating rules afterwards.
struct PullRecord {
  int worker;
  long clock;      // the puller's clock
  long min_clock;  // slowest worker's clock when served
  long version;    // version served
};

class ShardState : private ShardOps {
 public:
  struct Options {
    std::string mode = "asp";    // as cluster.mode names it (a mode with servers)
    std::string codec = "f32";   // the push codec, as cluster.codec names it
    int workers = 1;
    ShardRange range;
    OptimizerConfig optimizer;
    std::vector<std::size_t> layers;  // the model's layers cut to the range (layer_sizes(); empty: one)
    ScheduleConfig schedule;
    std::size_t train_size = 1;  // samples per epoch, for the schedule's progress
    int batch = 1;               // per-worker batch, for the linear scaling rule
    bool record_pulls = false;   // keep a PullRecord per served pull
    int threads = 1;             // threads that share a large update (cluster.server_threads)
    ParamVersions::Memory memory;  // where θ versions live (default: the heap)
    Pieces pieces;               // how pushes and pull replies are cut (cluster.piece_kib)
  };
  // `initial` is the shard's slice of the initial θ (range.length floats). Throws
  // std::invalid_argument for an unknown mode or codec, or a mode without servers.
  ShardState(Backend& cpu, const Options& opt, std::vector<float> initial);

  // A worker's gradient for its step `clock`, computed on parameters of `version_pulled`, over
  // `batch` samples: `payload` is its range.length floats encoded by the codec, `checksum`
  // the payload's wire::checksum_bytes. The mode decides what it does (asp/ssp: applied now;
  // bsp: summed and applied with the clock). Throws ProtocolError when the push breaks the
  // mode's rules and PayloadError when the payload fails its checksum or cannot be decoded;
  // either way nothing changes.
  void push(int worker, long clock, long version_pulled, int batch, std::span<const std::byte> payload,
            std::uint64_t checksum);
  // Piece `piece` of `pieces` of a push (pieces == 1: the whole push, in any codec; otherwise
  // dense f32 pieces cut by Options::pieces, in order). `payload` is referenced, not copied,
  // until the listener hears push_ended() for this worker. What it applies (this push, pushes
  // that waited for it) the listener hears as it happens. Throws as push() does for this
  // piece, and ProtocolError for a piece out of order or unlike its push's first; either way
  // this worker's push is abandoned (and push_ended() said for it first).
  struct PieceOf {
    int worker = 0;
    long clock = 0, version_pulled = 0;
    int batch = 0;
    std::size_t piece = 0, pieces = 1;
  };
  struct Done {
    int worker;
    long clock;
    std::exception_ptr error;  // why the shard refused it (null: applied, or abandoned)
    bool abandoned = false;    // abandon_push(): the caller's decision, nothing applied
  };
  class Listener {
   public:
    virtual ~Listener() = default;
    // Piece `piece` of the worker's push is in the version being written (streamed_checksum(),
    // acquire_streamed()); called before the push ends. Pushes of one piece: not called.
    virtual void piece_applied(int worker, std::size_t piece) = 0;
    // The worker's push ended: applied (its version published), or refused (nothing of it
    // applied); its payloads are no longer referenced.
    virtual void push_ended(const Done& d) = 0;
  };
  void push_piece(const PieceOf& p, std::span<const std::byte> payload, std::uint64_t checksum, Listener& l);
  // Abandons the worker's push, if one is open (a piece the server refused; the worker lost):
  // nothing of it applied; pushes that waited for it go on.
  void abandon_push(int worker, Listener& l);
  // The worker whose push is being applied (-1: none), and, once its first piece is, what the
  // shard will be when it ends: for a push+pull answered piece by piece.
  int applying() const { return applying_; }
  // Whether some worker's push has begun and not ended (pieces to come, or waiting its turn).
  bool pushes_open() const {
    for (const Incoming& in : incoming_)
      if (in.open) return true;
    return false;
  }
  // The worker's open push: {pieces arrived, pieces}; {0, 0} when none is open.
  std::pair<std::size_t, std::size_t> open_push(int worker) const {
    const Incoming& in = incoming_[std::size_t(worker)];
    return in.open ? std::pair{in.arrived, in.pieces} : std::pair<std::size_t, std::size_t>{0, 0};
  }
  struct After {
    bool advances = false;  // it makes a new version (not an empty batch)
    long version = 0, min_clock = 0, samples_applied = 0;
    bool pull_ready = false;  // a pull for pull_clock may be served then
  };
  After after_stream(long pull_clock);
  // Piece p of the version the push being applied writes, once that piece is applied: its
  // checksum, and its buffer, marked as referenced by one more send (ParamVersions::release).
  std::uint64_t streamed_checksum(std::size_t p) const { return next_piece_sums_[p].value(); }
  ParamVersions::Buffer* acquire_streamed() { return params_.acquire_next(); }
  // Pieces of this shard (1: it travels whole).
  std::size_t pieces() const { return opt_.pieces.count(opt_.range.length); }
  // wire::checksum of piece p of the current version (computed while it was written).
  std::uint64_t piece_checksum(std::size_t p) const { return piece_sums_[p].value(); }
  // Whether a pull by a worker at `clock` may be served now (evaluators are never held).
  bool pull_ready(long clock) const { return mode_.pull_ready(clock, view()); }
  // Why a pull for `clock` is held, naming the workers it waits for.
  std::string why_held(long clock) const { return mode_.why_held(clock, view()); }
  // Notes that a pull was served now (the records; for a mode that keeps_served_theta, a copy
  // of the shard as served to `worker`).
  void record_pull(int worker, long clock);
  // Forgets those copies: each worker's next push counts as computed on θ now, as on a copy of the
  // shard made from its checkpoint, which holds none (a backup that joins by it).
  void forget_served() { std::fill(served_version_.begin(), served_version_.end(), -1L); }
  // Bytes of those copies: workers x shard, 0 for modes that keep none.
  std::size_t pulled_params_bytes() const { return served_.size() * sizeof(float); }
  // Drops a worker that died or fell silent (the server decides; the mode must train on without
  // it): its clock no longer counts for the mode, and a later push from it is refused (its
  // open push, if any: abandon_push() first).
  void drop_worker(int worker);
  bool dropped(int worker) const { return lost_[std::size_t(worker)] != 0; }
  // A dropped worker taken back (its link came back): its clock gates pulls again, from where it was.
  void readmit_worker(int worker);
  // A worker rejoining a server restarted from a checkpoint that is behind it: its clock moves
  // to `clock` (the mode must train on without the updates in between, as asp and ssp do);
  // returns how many of its updates this shard lost (0 if it was not behind).
  long fast_forward(int worker, long clock);

  // Everything needed to go on where the shard is now (ps/checkpoint.h); shard, num_shards and
  // config_hash are the server's to fill in.
  ShardCheckpoint checkpoint() const;
  // Goes on from a checkpoint of this shard (same range and workers; throws
  // std::invalid_argument naming what differs). θ becomes a new current version.
  void restore(const ShardCheckpoint& c);
  const Mode& mode() const { return mode_; }
  const PushCodec& codec() const { return *codec_; }
  long version() const { return version_; }
  long min_clock() const { return view().min_clock(); }
  long clock_of(int worker) const { return clocks_[std::size_t(worker)]; }
  long samples_applied() const { return samples_applied_; }
  const Options& options() const { return opt_; }
  ParamVersions& params() { return params_; }
  const float* current() const { return params_.current(); }
  // wire::checksum of the current version (computed while it was written).
  std::uint64_t current_checksum() const { return checksum_; }

  // Staleness of accepted pushes: histogram per worker (index = staleness; the last bucket
  // collects everything >= its index). Pushes of an empty batch are not counted.
  const std::vector<std::vector<long>>& staleness_histogram() const { return staleness_; }
  const std::vector<PullRecord>& pull_records() const { return pulls_; }
  long updates_applied() const { return version_; }

 private:
  // The push being handled, for the primitives the mode calls.
  struct Pending {
    const float* payload = nullptr;  // dense, range.length floats
    std::uint64_t checksum = 0;      // of the payload bytes; for dense f32, the floats' own bytes
    int batch = 0;
    bool verified = false;    // the payload's checksum was checked
    int worker = 0;
    long version_pulled = 0;  // the version its gradient was computed on
  };
  // A push arriving in pieces, per worker, from its first piece until it ends.
  struct Incoming {
    bool open = false;
    PushInfo info;
    std::size_t pieces = 1, arrived = 0, applied = 0;
    bool streams = false;  // each piece applied as it comes (else once all came, each verified)
    struct Part {
      std::span<const std::byte> bytes;
      std::uint64_t checksum = 0;
    };
    std::vector<Part> parts;  // by piece (capacity kept)
  };
  // What the pieces of the push being applied did so far (the same for every piece).
  struct Stream {
    bool advanced = false;   // a new version is being written
    bool optimizer = false;  // by an optimizer step (counted once, at its first piece)
    long samples = 0;
  };
  void check_push(const PushInfo& info) const;  // what push() checks before anything changes
  // The push after its checks: `payload` in the codec, `verified` when its checksum was checked.
  void apply_push(const PushInfo& info, std::span<const std::byte> payload, std::uint64_t checksum, bool verified);
  bool streams_in_pieces() const { return mode_.applies_in_pieces() && optimizer_.stateless() && codec_->dense_f32(); }
  // Applies what can be applied now, in order: the pushes waiting, piece by piece.
  void pump(Listener& l);
  void apply_window(Incoming& in, std::size_t p);  // piece p of the push being applied
  void commit_window(Incoming& in);                // its end: the version published
  void end_push(int worker, std::exception_ptr error, Listener& l);  // off the queue, said
  // The pending push's staleness: versions made since the one it was computed on.
  long pending_staleness() const { return version_ - pending_.version_pulled; }
  ShardView view() const { return ShardView{version_, clocks_, lost_}; }
  // ShardOps, on pending_ and the window [win_lo_, win_lo_ + win_n_) of the shard (all of it,
  // or the streaming push's piece).
  std::size_t length() const override { return win_n_; }
  const float* payload() override;
  const float* theta() const override { return params_.current() + win_lo_; }
  const float* served(int worker) override;
  float* kept() override;
  std::span<long, 2> kept_counts() override { return kept_counts_; }
  float* scratch() override;
  Backend& cpu() override { return be_; }
  void step(const float* grad, double lr_factor, long samples) override;
  void add(const float* change, double scale, long samples) override;
  void advance() override;
  // How update() makes the next version: an optimizer step with a gradient, or θ + scale x a change.
  struct Update {
    bool optimizer;
    double scale;  // !optimizer: the change's factor
  };
  // Writes the next version from the current one and `x` (a gradient, or a change of θ) over
  // the window, chunk by chunk, computing the new version's piece checksums on the way (and,
  // with verify, x's: on a mismatch the new version is dropped before publication and
  // ChecksumError thrown). Publishes it, unless a push is applied in pieces (commit_window()).
  void update(const float* x, long update_samples, double lr_factor, const std::uint64_t* verify, Update how);
  // update() with x = grad, or with the pending payload (verified in the same pass where that is safe).
  void update_with(const float* x, long samples, double lr_factor, Update how);
  // Runs fn(lo, hi, t) over slices [lo, hi) of n floats, on the team's threads when n is large
  // enough to gain (slices of whole 64-byte lines; t = the slice's index); returns how many
  // slices there were.
  int for_slices(std::size_t n, const std::function<void(std::size_t, std::size_t, int)>& fn);
  std::uint64_t checksum_of(const float* data, std::size_t n);  // over the slices
  // piece_sums_ and checksum_ of θ as it is now (at the start, after a restore).
  void sum_current();
  void publish_sums();  // next_piece_sums_ become the current version's; checksum_ from them
  std::size_t piece_of(std::size_t i) const { return pieces() == 1 ? 0 : i / opt_.pieces.per_piece(length_all()); }
  std::size_t piece_end(std::size_t q) const { return opt_.pieces.begin(length_all(), q) + opt_.pieces.size(length_all(), q); }
  std::size_t length_all() const { return opt_.range.length; }
  void count_staleness(int worker, long staleness);

  Options opt_;
  std::size_t win_lo_ = 0, win_n_ = 0;  // the ShardOps window (see length())
  Backend& be_;
  const Mode& mode_;
  std::unique_ptr<PushCodec> codec_;
  std::vector<float> decoded_;  // a push decoded to dense floats (codecs other than dense f32)
  Optimizer optimizer_;
  ParamVersions params_;
  std::uint64_t checksum_ = 0;
  std::vector<wire::Checksum> piece_sums_, next_piece_sums_;  // per piece: the current version's, the next's
  std::vector<Incoming> incoming_;  // per worker
  std::vector<int> queue_;          // open pushes in the order their first pieces came
  int applying_ = -1;               // the worker whose push is being applied (queue_ front), -1: none
  float* stream_next_ = nullptr;    // the version it writes
  Stream stream_;
  std::array<long, 2> counts_before_{};  // kept_counts() before it (each piece starts from them)
  long version_ = 0;
  long samples_applied_ = 0;
  std::vector<long> clocks_;  // per worker: pushes done
  std::vector<char> lost_;    // per worker: 1 = dropped (drop_worker)
  Pending pending_;
  std::vector<float> kept_;           // the mode's kept buffer, allocated on first use (in checkpoints)
  std::array<long, 2> kept_counts_{};  // the mode's kept integers (in checkpoints)
  std::vector<float> scratch_;        // a buffer for one push, allocated on first use
  std::vector<std::vector<long>> staleness_;
  std::vector<PullRecord> pulls_;
  // keeps_served_theta modes: per worker, the shard as last served (workers x range.length)
  // and its version (-1: never served).
  std::vector<float> served_;
  std::vector<long> served_version_;
  ThreadTeam team_;
  std::vector<wire::Checksum> grad_sums_;  // per slice, reused
  // Per slice: the checksums of the pieces it wrote (consecutive, from piece seg_first_[t]).
  std::vector<std::vector<wire::Checksum>> param_segs_;
  std::vector<std::size_t> seg_first_;
};

}  // namespace pslab
