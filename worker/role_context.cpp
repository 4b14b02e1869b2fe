#include "role_context.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "run/setup.h"

namespace pslab {

namespace {

bool trains(RoleKind k) { return k != RoleKind::evaluator; }

std::unique_ptr<Backend> backend_for(const ExperimentConfig& cfg, const RoleOptions& opt, RoleKind kind) {
  const Device d = cfg.train.device == "cuda" ? Device::cuda : Device::cpu;
  // Single-process training has the host to itself; the roles of a run share it.
  const int procs = kind == RoleKind::single ? 1 : opt.procs_on_host;
  auto be = make_backend(d, blas_threads(cfg, procs), opt.gpu_slot);
  be->allow_tf32(cfg.train.tf32);
  return be;
}

std::string who(RoleKind kind, int rank) {
  switch (kind) {
    case RoleKind::single: return "train";
    case RoleKind::ps_worker: return "worker " + std::to_string(rank);
    case RoleKind::allreduce_rank: return "rank " + std::to_string(rank);
    case RoleKind::evaluator: return "evaluator";
  }
  return "?";
}

}  // namespace

int replica_batch(const ExperimentConfig& cfg, RoleKind kind) {
  const int statistics = kind != RoleKind::evaluator && kind != RoleKind::single ? 0
                         : has_state(model_spec(cfg))                            ? Replica::kStatisticsBatch
                                                                                 : 0;
  switch (kind) {
    case RoleKind::evaluator: return std::max(cfg.eval.batch, statistics);
    case RoleKind::single: return std::max({cfg.train.batch, cfg.eval.batch, statistics});  // it evaluates too
    default: return cfg.train.batch;
  }
}

RoleContext::RoleContext(const ExperimentConfig& c, const RoleOptions& o, RoleKind k) : cfg(c), opt(o), kind(k) {
  if (cfg.model.kind == "external")
    throw std::invalid_argument("model.kind = \"external\": its workers are your own (libpslab_client.so, worker/python/pslab); "
                                "pslab_worker trains and evaluates only the models it has built in");
  const int W = kind == RoleKind::single ? 1 : cfg.cluster.workers;
  const int rank = kind == RoleKind::single ? 0 : opt.rank;
  if (trains(kind) && (rank < 0 || rank >= W))
    throw std::invalid_argument("--rank " + std::to_string(rank) + " is not in [0, cluster.workers = " + std::to_string(W) + ")");
  clock_ = kind == RoleKind::single ? &wall_clock() : &transport().clock();
  backend_ = backend_for(cfg, opt, kind);
  if (!opt.data) own_data_ = load_data(cfg);
  data_ = opt.data ? opt.data : &own_data_;
  // A PS worker's gradient lives in memory its transport pushes from without a copy (shm).
  if (kind == RoleKind::ps_worker) grad_memory_ = transport().payload_memory(count_params(model_spec(cfg)) * sizeof(float));
  replica_ = std::make_unique<Replica>(*backend_, model_spec(cfg), data_->train, replica_batch(cfg, kind),
                                       grad_memory_ ? static_cast<float*>(grad_memory_->data()) : nullptr);
  const std::string file = kind == RoleKind::evaluator ? "evaluator" : "worker" + std::to_string(rank);
  metrics_ = std::make_unique<MetricsWriter>(opt.out_dir + "/metrics/" + file + ".jsonl", opt.run_start, opt.resume, *clock_);
  if (!trains(kind)) return;
  if (cfg.data.augment != "none") replica_->augment(cfg.seed, cfg.data.augment_pad);  // (crop-flip)
  replica_->use_step_graphs(step_graphs_from(cfg.train.cuda_graphs));
  sampler_.emplace(std::size_t(data_->train.n), W, rank, cfg.seed);
  replica_->follow(*sampler_);  // (GPU: a shard's indices cross once per epoch)
  steps_per_epoch_ = sampler_->steps_per_epoch(cfg.train.batch);
  total_steps_ = pslab::total_steps(cfg, steps_per_epoch_);
  progress_.emplace(who(kind, rank), opt.progress && rank == 0);
  log_.emplace(*metrics_, *progress_, rank, cfg.train.log_every, total_steps_);
  straggler_.emplace(cfg.straggler, cfg.seed, rank, *clock_);
}

RoleContext::~RoleContext() = default;

comm::Transport& RoleContext::transport() {
  if (opt.transport) return *opt.transport;
  if (!own_transport_) own_transport_ = run_transport(cfg, opt.auth_key);
  return *own_transport_;
}

std::span<const std::uint32_t> RoleContext::batch(long step) {
  sampler_->set_epoch(step / steps_per_epoch_);
  replica_->set_epoch(step / steps_per_epoch_);  // (data.augment's draws)
  return sampler_->batch(step % steps_per_epoch_, cfg.train.batch);
}

void RoleContext::announce(const std::string& what) {
  const int rank = kind == RoleKind::single ? 0 : opt.rank;
  if (rank != 0 && !(straggler_ && straggler_->active())) return;
  std::fprintf(stderr, "[%s] %s on %s; %s; %ld steps of batch %d (%ld per epoch)%s%s\n", who(kind, rank).c_str(),
               model().describe().c_str(), backend_->describe().c_str(), what.c_str(), total_steps_, cfg.train.batch,
               steps_per_epoch_, replica_->step_graphs() != StepGraphs::off ? "; steps as CUDA graphs" : "",
               !(straggler_ && straggler_->active()) ? ""
               : kind == RoleKind::single          ? "; [straggler] ignored: one process, no one to wait for it"
                                                   : "; straggler");
}

}  // namespace pslab
