// A mode of training (cluster.mode): one typed object, made once from its name by the mode
// registry (mode_of), with one file per mode (bsp.cpp, ssp.cpp, asp.cpp, dcasgd.cpp, local.cpp,
// easgd.cpp, allreduce.cpp) and one registry line each (registry.cpp). A mode says
//
//   how the workers train      worker_protocol(): all-reduce ∇θ every step (no servers); push
//                              ∇θ every step; or train their own θ and push a change of it
//                              after local steps (local:H) or an elastic difference (easgd)
//   the lr's batch             update_batch(): the samples one update averages (linear scaling)
//   a lost worker              trains_without_lost_workers(): whether the run may go on without
//                              a worker that died or fell silent (cluster.on_worker_loss)
//   what it reads of a config  reads(): keys only some modes use (easgd: cluster.sync_every);
//                              a config that sets one for a mode that does not read it is refused
//
// and, for the modes with servers, its math on each shard (the rule):
//
//   what a push does           on_push(): through ShardOps, the shard's primitives (an optimizer
//                              step with a gradient, θ += a change, a new version as it is), over
//                              the push's payload, θ now, θ as last served to the pushing
//                              worker, and buffers the shard keeps for the mode
//   when a pull is ready       pull_ready(clock)
//   why a pull is held         why_held(clock): "bsp clock 17 still needs pushes from worker 3
//                              (clock 16)"
//   pieces                     applies_in_pieces(): whether a push may be applied piece by
//                              piece as it arrives (asp, ssp, dcasgd, easgd)
//
// A mode is immutable (every method const): what changes with the pushes lives in the shard
// (ShardState keeps the buffers, versions, statistics and the mode's kept state, and puts them
// in its checkpoints). A test or an extension adds a mode with a Registrar in its own file.
//
// Threading: a mode may be used from any thread; on_push and the others from the server's
// event-loop thread.
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend.h"
#include "core/registry.h"
#include "ps/errors.h"

namespace pslab {

// What a mode may read of its shard.
struct ShardView {
  long version = 0;             // updates applied to the shard
  std::span<const long> clocks; // per worker: pushes done (in on_push: this push counted)
  std::span<const char> lost;   // per worker: 1 = dropped from the run (its clock no longer counts)
  int workers() const { return int(clocks.size()); }
  bool counts(int worker) const { return lost.empty() || !lost[std::size_t(worker)]; }
  // The slowest clock of the workers that count; when none does (each dropped, or done and said
  // Bye), of them all.
  long min_clock() const {
    long m = -1, all = -1;
    for (int r = 0; r < workers(); ++r) {
      const long c = clocks[std::size_t(r)];
      if (all < 0 || c < all) all = c;
      if (counts(r) && (m < 0 || c < m)) m = c;
    }
    return m >= 0 ? m : all < 0 ? 0 : all;
  }
};

// A push, as its header described it (the shard has checked that the worker is a worker, that
// `clock` is its next clock and that the shard has had `version_pulled`).
struct PushInfo {
  int worker = 0;
  long clock = 0;
  long version_pulled = 0;
  int batch = 0;  // samples behind the gradient; 0 for an empty batch
};

// The shard's primitives, for the push being handled. Buffers are the shard's length()
// floats. A call that reads the push's payload may throw PayloadError when it fails its
// integrity check; nothing has changed then (a mode reads the payload before it changes
// anything).
class ShardOps {
 public:
  virtual ~ShardOps() = default;
  virtual std::size_t length() const = 0;
  // The push's payload as dense floats (a gradient, or a change of θ), its checksum verified.
  virtual const float* payload() = 0;
  // θ now.
  virtual const float* theta() const = 0;
  // θ as this shard last served it to `worker` (modes that keeps_served_theta()); θ now where
  // this process served it none (restarted from a checkpoint, or a backup that joined by
  // snapshot); throws ProtocolError when what it served is not what the push was computed on.
  virtual const float* served(int worker) = 0;
  // A buffer the shard keeps for the mode between pushes and in its checkpoints (bsp: the open
  // clock's sum), and integers it keeps likewise (zero at first).
  virtual float* kept() = 0;
  virtual std::span<long, 2> kept_counts() = 0;
  // A buffer for this push alone.
  virtual float* scratch() = 0;
  // The shard's CPU backend, for vector arithmetic (axpy, scale).
  virtual Backend& cpu() = 0;
  // One optimizer step with `grad` at lr_factor x the scheduled learning rate (divided by the
  // push's staleness with optimizer.staleness_lr), counting `samples` as applied; publishes a
  // new version. grad == nullptr: this push's payload, checked in the same pass; a push of an
  // empty batch then changes nothing.
  virtual void step(const float* grad, double lr_factor, long samples) = 0;
  // θ += scale x change (no optimizer, no learning rate), counting `samples`; publishes a new
  // version. change == nullptr: this push's payload, as for step().
  virtual void add(const float* change, double scale, long samples) = 0;
  // Publishes a new version, θ as it is (a clock that held no samples).
  virtual void advance() = 0;
};

// How the workers of a mode train.
struct WorkerProtocol {
  enum class Kind {
    allreduce,  // every step: ∇θ all-reduced between the workers, each steps its own replica; no servers
    gradient,   // every step: push ∇θ; the reply is θ for the next step (bsp, ssp, asp, dcasgd)
    delta,      // local_steps steps of the worker's own optimizer on its own θ, then push
                // θ_local − θ_pulled; the reply (the servers' average) replaces θ_local (local:H)
    elastic,    // the worker's own optimizer on its own θ; every cluster.sync_every steps pull the
                // centre c, push e = alpha (θ − c) and move θ −= e (easgd)
  } kind = Kind::gradient;
  int local_steps = 1;  // delta: steps per push
  double alpha = 0.0;   // elastic: the moving rate
};

class Mode {
 public:
  virtual ~Mode() = default;
  // As cluster.mode names it, e.g. "ssp:2".
  virtual std::string name() const = 0;
  virtual WorkerProtocol worker_protocol() const = 0;
  bool uses_servers() const { return worker_protocol().kind != WorkerProtocol::Kind::allreduce; }
  // Samples averaged by one update when every worker pushes `batch`: the lr's batch.
  virtual int update_batch(int batch, int workers) const = 0;
  // Whether training may go on without a worker that died or fell silent (its clock then no
  // longer counts in ShardView::min_clock). Modes that need every worker's push keep false.
  virtual bool trains_without_lost_workers() const { return false; }
  // Config keys only some modes read, each with what it is ("is the elastic exchange period of
  // easgd"); a config may set one only for a mode that reads it.
  struct Key {
    std::string key, what;
  };
  virtual std::vector<Key> reads() const { return {}; }

  // ---- on a server (modes that use servers) ----
  // Throws ProtocolError, saying what was expected, for a push this mode refuses (nothing has
  // changed yet).
  virtual void check_push(const PushInfo&, const ShardView&) const {}
  // What the push does to the shard (the pushing worker's clock already counts it).
  virtual void on_push(const PushInfo& push, const ShardView& shard, ShardOps& ops) const;
  // Whether a pull by a worker at `clock` may be served now (evaluators are never held).
  virtual bool pull_ready(long clock, const ShardView& shard) const;
  // Why a pull for `clock` is held now, naming the workers it waits for.
  virtual std::string why_held(long clock, const ShardView& shard) const;
  // Whether the shard keeps, per worker, a copy of θ as it last served it (ShardOps::served;
  // dcasgd: one shard's worth of memory per worker).
  virtual bool keeps_served_theta() const { return false; }
  // Whether on_push() may run piece by piece as a push arrives in pieces (ps/pieces.h): its
  // work is elementwise over ops.length() floats, it decides the same way for every piece of a
  // push, and it changes nothing in place but through step(), add() and advance() (so it uses
  // no kept() buffer). The shard then runs it once per piece, on that piece's floats, and makes
  // the version at the last piece; a push abandoned half-way leaves no trace. Otherwise (the
  // default, e.g. bsp's clock sum) the pieces are gathered and the push applied whole.
  virtual bool applies_in_pieces() const { return false; }
};

// cluster.mode -> mode. Built-ins: allreduce, bsp, ssp:<s>, asp, dcasgd:<λ>, local:<H>,
// easgd:<alpha> (ps/modes/registry.cpp).
Registry<Mode>& mode_registry();
inline std::unique_ptr<Mode> make_mode(const std::string& spec) { return mode_registry().make(spec); }
// The mode `spec` names, made once per process and kept (every later call with the same spec
// returns the same object). Throws std::invalid_argument as make_mode does.
const Mode& mode_of(const std::string& spec);

// "worker 1 (clock 3), worker 2 (clock 3)": the workers that count whose clock is below `clock`.
std::string workers_below(const ShardView& shard, long clock);
// The argument after a mode's colon ("ssp:2" -> 2) as a finite number / an integer; throws
// std::invalid_argument(expected) when it is not one.
double mode_number(const std::string& text, const char* expected);
long mode_integer(const std::string& text, const char* expected);

}  // namespace pslab
