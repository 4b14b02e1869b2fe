// The consistency rules and the update of one parameter shard: a plain object that the
// server's event loop drives and that tests drive directly, without sockets.
//
//   bsp    pushes of clock c are averaged (weighted by batch size) and applied once, when all
//          W workers have pushed c; a pull for clock c is served once version >= c
//   ssp:s  each push is applied on arrival; a pull for clock c is served once the slowest
//          worker's clock (pushes done) is >= c - s
//   asp    each push is applied on arrival; pulls are never held
//
// Versions: `version` counts updates applied to the shard. Staleness of an applied update =
// version at apply time - version the gradient was computed on (0 under bsp).
//
// Threading: one thread (the server's event loop) calls everything, except
// ParamVersions::release(), which ZeroMQ's I/O thread calls when a zero-copy send is done.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"
#include "ps/mode.h"
#include "core/optimizer.h"

namespace pslab {

// Contiguous range [offset, offset + length) of θ owned by one server; shards are balanced
// by length (they differ by at most one float).
struct ShardRange {
  std::size_t offset = 0, length = 0;
};
ShardRange shard_range(std::size_t num_params, int num_shards, int shard);

// A push or pull that breaks the mode's rules (e.g. a second bsp push for one clock).
// what() says what was expected.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A gradient whose checksum does not match the one its header carried.
class PayloadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The shard's parameters by version, for zero-copy pull replies: a reply references the
// current buffer until ZeroMQ has sent it, so an update writes the next version into a
// buffer that no send references (out of place; no copy) and then makes it current.
class ParamVersions {
 public:
  struct Buffer {
    std::vector<float> data;
    std::atomic<int> in_flight{0};  // zero-copy sends referencing this buffer
  };
  explicit ParamVersions(std::vector<float> initial);

  const float* current() const { return current_->data.data(); }
  std::size_t size() const { return current_->data.size(); }
  // Marks the current buffer as referenced by one more send; pass the result to release()
  // (ZeroMQ's free callback) when the send is done.
  Buffer* acquire_current();
  static void release(Buffer* b) { b->in_flight.fetch_sub(1, std::memory_order_release); }
  // A buffer other than the current one that no send references (allocated if none is free).
  float* next();
  // Makes the buffer last returned by next() current.
  void publish();
  std::size_t buffers() const { return pool_.size(); }

 private:
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

class ShardState {
 public:
  struct Options {
    Mode mode;
    int workers = 1;
    ShardRange range;
    OptimizerConfig optimizer;
    ScheduleConfig schedule;
    std::size_t train_size = 1;  // samples per epoch, for the schedule's progress
    int batch = 1;               // per-worker batch, for the linear scaling rule
    bool record_pulls = false;   // keep a PullRecord per served pull
  };
  // `initial` is the shard's slice of the initial θ (range.length floats).
  ShardState(Backend& cpu, const Options& opt, std::vector<float> initial);

  // A worker's gradient (range.length floats) for its step `clock`, computed on parameters
  // of `version_pulled`, over `batch` samples, with payload checksum `checksum`
  // (wire::checksum). asp/ssp: applied now. bsp: accumulated; applied when the W-th push of
  // the clock arrives. Returns true when parameters changed. Throws ProtocolError when the
  // push breaks the mode's rules and PayloadError when the checksum does not match; either
  // way nothing changes.
  bool push(int worker, long clock, long version_pulled, int batch, const float* grad, std::uint64_t checksum);
  // Whether a pull by a worker at `clock` may be served now (evaluators are never held).
  bool pull_ready(long clock) const;
  // Notes that a pull was served (for the records).
  void record_pull(int worker, long clock);

  long version() const { return version_; }
  long min_clock() const;
  long clock_of(int worker) const { return clocks_[std::size_t(worker)]; }
  long samples_applied() const { return samples_applied_; }
  const Options& options() const { return opt_; }
  ParamVersions& params() { return params_; }
  const float* current() const { return params_.current(); }
  // wire::checksum of the current version (computed while it was written).
  std::uint64_t current_checksum() const { return checksum_; }

  // Staleness of applied updates: histogram per worker (index = staleness; the last bucket
  // collects everything >= its index).
  const std::vector<std::vector<long>>& staleness_histogram() const { return staleness_; }
  const std::vector<PullRecord>& pull_records() const { return pulls_; }
  long updates_applied() const { return version_; }

 private:
  // Writes the next version from the current one and `grad`, chunk by chunk, computing the
  // new version's checksum on the way (and, with verify, the gradient's: on a mismatch the
  // new version is dropped before publication and PayloadError thrown).
  void apply(const float* grad, long samples, const std::uint64_t* verify = nullptr);
  void count_staleness(int worker, long staleness);

  Options opt_;
  Backend& be_;
  Optimizer optimizer_;
  ParamVersions params_;
  std::uint64_t checksum_ = 0;
  long version_ = 0;
  long samples_applied_ = 0;
  std::vector<long> clocks_;  // per worker: pushes done
  // bsp: the open clock's accumulated batch-weighted gradient sum and who pushed.
  std::vector<float> acc_;
  std::vector<char> pushed_;
  int pushes_in_clock_ = 0;
  long samples_in_clock_ = 0;
  std::vector<std::vector<long>> staleness_;
  std::vector<PullRecord> pulls_;
};

}  // namespace pslab
