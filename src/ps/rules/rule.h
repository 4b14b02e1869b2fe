// A consistency rule: how the pushes of the workers meet one shard of θ. One class per mode,
// one file each (bsp.cpp, ssp.cpp, asp.cpp, ...), created from cluster.mode by rule_registry():
//
//   when a pull is ready   pull_ready(clock)
//   what a push does       on_push(): apply it now (as it is, or delay-compensated), or
//                          accumulate it for the clock and apply the clock's mean once it is
//                          complete (through ShardOps); or, for the model-averaging rules
//                          whose pushes are changes of θ, add it (or the clock's mean)
//   what workers push      worker_protocol(): ∇θ every step, or a change of θ after local
//                          steps (local:H, easgd)
//   the lr's batch         update_batch(): the samples one update averages, for the linear
//                          scaling rule
//   why a pull is held     why_held(clock): "bsp clock 17 still needs pushes from worker 3
//                          (clock 16)"
//   its own state          save() / load(), for checkpoints (the built-in rules keep none:
//                          they read the shard's version and clock table)
//   a lost worker          trains_without_lost_workers(): whether the run may go on when a
//                          worker dies or falls silent (cluster.on_worker_loss); the servers
//                          then drop it from the clock table that the rule sees
//
// A rule reads the shard through ShardView and changes it only through ShardOps, so that
// ShardState (ps/shard_state.h) keeps the buffers, versions and statistics in one place.
//
// Threading: the server's event-loop thread only.
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/registry.h"
#include "ps/errors.h"

namespace pslab {

// What a rule may read of its shard.
struct ShardView {
  long version = 0;             // updates applied to the shard
  std::span<const long> clocks; // per worker: pushes done (in on_push: this push counted)
  std::span<const char> lost;   // per worker: 1 = dropped from the run (its clock no longer counts)
  int workers() const { return int(clocks.size()); }
  bool counts(int worker) const { return lost.empty() || !lost[std::size_t(worker)]; }
  // The slowest clock of the workers that count (0 when none does).
  long min_clock() const {
    long m = -1;
    for (int r = 0; r < workers(); ++r)
      if (counts(r) && (m < 0 || clocks[std::size_t(r)] < m)) m = clocks[std::size_t(r)];
    return m < 0 ? 0 : m;
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

// What a rule can do to its shard with the push being handled. Each call may throw
// PayloadError when the push's payload fails its integrity check; nothing has changed then.
// A rule therefore calls these before it changes its own state.
class ShardOps {
 public:
  virtual ~ShardOps() = default;
  // One optimizer step with this push's gradient, at lr_factor x the scheduled learning rate;
  // publishes a new version. A push of an empty batch changes nothing.
  virtual void apply(double lr_factor = 1.0) = 0;
  // Adds batch x gradient to the sum of the open clock.
  virtual void accumulate() = 0;
  // One step with the batch-weighted mean of what was accumulated, then clears it; publishes
  // a new version even when the clock held no samples (the clock advances either way).
  virtual void apply_accumulated() = 0;
  // One step (as apply()) with the gradient corrected for the updates the pushing worker
  // missed: g + λ g ⊙ g ⊙ (θ now − θ as last served to it). Needs keeps_pulled_params().
  virtual void apply_delay_compensated(double lambda) = 0;
  // θ += scale x this push's payload, which is a change of θ, not a gradient (no optimizer, no
  // learning rate); publishes a new version. A push of an empty batch changes nothing.
  virtual void add(double scale = 1.0) = 0;
  // θ += the batch-weighted mean of what was accumulated (changes of θ), then clears it;
  // publishes a new version even when the clock held no samples.
  virtual void add_accumulated() = 0;
};

// How the workers of a rule train between pushes (worker/ps_worker.cpp, worker/local_worker.cpp).
struct WorkerProtocol {
  enum class Push {
    gradient,  // every step: push ∇θ; the reply is θ for the next step (bsp, ssp, asp, dcasgd)
    delta,     // local_steps steps of the worker's own optimizer on its own θ, then push
               // θ_local − θ_pulled; the reply (the servers' average) replaces θ_local (local:H)
    elastic,   // the worker's own optimizer on its own θ; every cluster.sync_every steps pull the
               // centre c, push e = alpha (θ − c) and move θ −= e (easgd)
  } push = Push::gradient;
  int local_steps = 1;  // delta: steps per push
  double alpha = 0.0;   // elastic: the moving rate
};

class ConsistencyRule {
 public:
  virtual ~ConsistencyRule() = default;
  // As cluster.mode names it, e.g. "ssp:2".
  virtual std::string name() const = 0;
  // Throws ProtocolError, saying what was expected, for a push this rule refuses (nothing has
  // changed yet).
  virtual void check_push(const PushInfo&, const ShardView&) const {}
  // What the push does to the shard (the pushing worker's clock already counts it).
  virtual void on_push(const PushInfo& push, const ShardView& shard, ShardOps& ops) = 0;
  // Whether a pull by a worker at `clock` may be served now (evaluators are never held).
  virtual bool pull_ready(long clock, const ShardView& shard) const = 0;
  // Samples averaged by one update when every worker pushes `batch`: the lr's batch.
  virtual int update_batch(int batch, int workers) const = 0;
  // Why a pull for `clock` is held now, naming the workers it waits for.
  virtual std::string why_held(long clock, const ShardView& shard) const = 0;
  // Whether training may go on without a worker that died or fell silent (its clock then no
  // longer counts in ShardView::min_clock). Rules that need every worker's push keep false.
  virtual bool trains_without_lost_workers() const { return false; }
  // Whether the shard keeps, per worker, a copy of θ as it last served it (dcasgd: one shard's
  // worth of memory per worker).
  virtual bool keeps_pulled_params() const { return false; }
  // What the workers push and how they train between pushes.
  virtual WorkerProtocol worker_protocol() const { return {}; }
  // The rule's own state (not the shard's), for checkpoints.
  virtual std::string save() const { return {}; }
  virtual void load(std::string_view state) {
    if (!state.empty()) throw std::invalid_argument(name() + " keeps no state, but a saved state was given");
  }
};

// cluster.mode -> rule. Built-ins: bsp, ssp:<s>, asp, dcasgd:<λ>, local:<H>, easgd:<alpha>
// (ps/rules/registry.cpp).
Registry<ConsistencyRule>& rule_registry();
inline std::unique_ptr<ConsistencyRule> make_rule(const std::string& mode) { return rule_registry().make(mode); }

// "worker 1 (clock 3), worker 2 (clock 3)": the workers that count whose clock is below `clock`.
std::string workers_below(const ShardView& shard, long clock);

}  // namespace pslab
