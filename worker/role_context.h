// The one setup of every role of the worker binary (single-process training, PS worker,
// all-reduce rank, evaluator): compute backend, data, model replica, metrics, the transport,
// and for the training roles the sampler, step counts, progress, train log and straggler.
// Each role's file is then only its loop.
//
// Threading: one role's thread.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "backend.h"
#include "comm/transport/transport.h"
#include "core/replica.h"
#include "core/sampler.h"
#include "progress.h"
#include "roles.h"
#include "run/metrics.h"
#include "straggler.h"
#include "train_log.h"

namespace pslab {

enum class RoleKind { single, ps_worker, allreduce_rank, evaluator };

// The most samples a role's replica takes at once: train.batch, and eval.batch where it
// evaluates; a model with batch norm is evaluated after measuring its statistics in batches of
// Replica::kStatisticsBatch, whatever eval.batch (the same θ, the same accuracy in every mode).
int replica_batch(const ExperimentConfig& cfg, RoleKind kind);

class RoleContext {
 public:
  // Checks the rank (distributed training roles), then builds everything the role uses.
  RoleContext(const ExperimentConfig& cfg, const RoleOptions& opt, RoleKind kind);
  ~RoleContext();

  const ExperimentConfig& cfg;
  const RoleOptions& opt;
  const RoleKind kind;

  Backend& backend() { return *backend_; }
  const DataSplit& data() const { return *data_; }
  Replica& replica() { return *replica_; }
  Model& model() { return replica_->model(); }
  MetricsWriter& metrics() { return *metrics_; }
  // The run's transport: opt.transport, or one made from cluster.transport on first use.
  comm::Transport& transport();
  // The role's clock: its transport's (simulated in the virtual cluster); the wall clock for
  // single-process training.
  RunClock& clock() { return *clock_; }
  // Seconds since `t` on the role's clock.
  double since(RunClock::time_point t) const { return seconds_between(t, clock_->now()); }

  // ---- training roles ----
  long steps_per_epoch() const { return steps_per_epoch_; }
  long total_steps() const { return total_steps_; }
  // The sample indices of this worker's batch at `step` (0-based, over the whole run).
  std::span<const std::uint32_t> batch(long step);
  // The global batch at `step`: every worker's batch together.
  long global_batch(long step) const { return sampler_->global_batch_size(step % steps_per_epoch_, cfg.train.batch); }
  TrainLog& log() { return *log_; }
  Progress& progress() { return *progress_; }
  Straggler& straggler() { return *straggler_; }
  // The role's first line on stderr: "[worker 0] mlp(...) on cpu (...); <what>; N steps of
  // batch B", printed by rank 0 and by stragglers.
  void announce(const std::string& what);

 private:
  RunClock* clock_ = nullptr;
  std::unique_ptr<Backend> backend_;
  DataSplit own_data_;                  // unless opt.data shares one
  const DataSplit* data_ = nullptr;
  std::unique_ptr<comm::PayloadMemory> grad_memory_;  // PS workers: ∇θ as it is pushed (the transport's)
  std::unique_ptr<Replica> replica_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<comm::Transport> own_transport_;
  std::optional<ShardSampler> sampler_;
  long steps_per_epoch_ = 0, total_steps_ = 0;
  std::optional<Progress> progress_;
  std::optional<TrainLog> log_;
  std::optional<Straggler> straggler_;
};

}  // namespace pslab
