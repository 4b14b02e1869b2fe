// One rank of the synchronous all-reduce mode: a full replica per rank, no servers.
//
//   broadcast θ from rank 0
//   every step: forward + backward on the local batch with the loss scaled by
//   1 / global batch, so that the all-reduce SUM of the flat gradient is the global mean
//   (weighted by each rank's batch size, with no extra pass); local optimizer step. With
//   train.accumulate = N the all-reduce and the step come every N batches, on their mean.
//   With overlap (cluster.overlap, run/setup.h: overlaps()) the all-reduce goes in buckets,
//   each started as soon as backward has finished it (BucketedAllreduce); on GPU ranks that
//   all-reduce through host memory, ∇θ comes down to the host on the copy engine as backward
//   finishes it (GradStager), its buckets are reduced there as they land, and the sum goes
//   back up once.
//
// Every rank runs the same number of steps (the sampler gives each the same count; a rank
// whose shard is shorter contributes a smaller or empty last batch), so no rank waits on a
// step that another will never take.
//
// The rank's concerns, one member each of AllreduceRank: the group (rendezvous, collective,
// the watch that names a silent rank), resuming from rank 0's checkpoint, the step (compute,
// all-reduce, optimizer), θ snapshots for the evaluator, and rank 0's checkpoints.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "comm/bucketed_allreduce.h"
#include "comm/collective.h"
#include "comm/rendezvous.h"
#include "comm/snapshots.h"
#include "core/optimizer.h"
#include "eval_schedule.h"
#include "grad_accumulator.h"
#include "grad_stager.h"
#include "ps/checkpoint.h"
#include "role_context.h"
#include "run/setup.h"

namespace pslab {

namespace {

// The power of two nearest a global batch: a 16-bit wire carries the gradient times it (the
// gradient summed over the batch, about), out of f16's subnormals; exact both ways.
float wire_scale(double global_batch) { return global_batch >= 1 ? std::exp2(std::round(std::log2(float(global_batch)))) : 1.0f; }

// cluster.codec in allreduce mode: the gradient all-reduced in 16 bits (f16, bf16) or float32.
std::optional<HalfFormat> wire_format(const std::string& codec) {
  if (codec == "f16") return HalfFormat::f16;
  if (codec == "bf16") return HalfFormat::bf16;
  return std::nullopt;  // f32 (the config refuses the others)
}

class AllreduceRank {
 public:
  AllreduceRank(const ExperimentConfig& cfg, const RoleOptions& opt);
  // Runs the steps left; returns the final θ (host copy).
  std::vector<float> run();

 private:
  void join_group();
  bool group_overlaps();
  void overlap_buckets();  // buckets_ (and on a GPU stager_, host_grads_)
  void say_if_saturated(long step, float scale, const float* sum);
  void agree_on_resume();
  void resume();
  void step(long step);
  void write_checkpoint_at(long step_done, const char* why);
  std::vector<float> finish();

  RoleContext ctx_;
  const ExperimentConfig& cfg_;
  const RoleOptions& opt_;
  Model& model_;
  const std::size_t P_;
  Optimizer optimizer_;
  GradAccumulator acc_;  // train.accumulate: N batches per all-reduce
  const std::optional<HalfFormat> wire_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0
  std::unique_ptr<RendezvousClient> rv_;
  std::unique_ptr<Collective> coll_;
  std::unique_ptr<GroupWatch> watch_;
  HostBuffer<float> host_grads_;                 // overlap through host memory (GPU): ∇θ's host copy, reduced there
  std::unique_ptr<BucketedAllreduce> buckets_;  // overlap (declared after host_grads_: its thread, joined when it is
                                                // destroyed, may still reduce into them on an error's way out)
  std::unique_ptr<GradStager> stager_;           // ... which it comes down to as backward finishes it
  GradListener* listener_ = nullptr;             // the buckets (or the stager), paced for a straggler
  std::unique_ptr<SnapshotSender> snapshots_;    // rank 0, when an evaluator listens
  EpochTicks ticks_;                             // eval.every_epochs: snapshots by epochs, not by time
  bool tick_owed_ = false;                       // a tick's snapshot not sent yet (the evaluator was behind)
  const ScheduleConfig schedule_;
  long first_ = 0, samples_ = 0;  // where a resumed run goes on (samples: all ranks together)
  bool said_saturated_ = false;
  RunClock::time_point last_checkpoint_;
};

AllreduceRank::AllreduceRank(const ExperimentConfig& cfg, const RoleOptions& opt)
    : ctx_(cfg, opt, RoleKind::allreduce_rank), cfg_(cfg), opt_(opt), model_(ctx_.model()), P_(model_.num_params()),
      optimizer_(ctx_.backend(), cfg.optimizer, P_, layer_sizes(model_.spec(), 0, P_)),
      acc_(ctx_.backend(), cfg.train.accumulate, P_), wire_(wire_format(cfg.cluster.codec)), ticks_(cfg.eval.every_epochs),
      schedule_(schedule_for_run(cfg, ctx_.steps_per_epoch())), last_checkpoint_(ctx_.clock().now()) {
  model_.init(cfg.seed);
  const auto timeout = std::chrono::milliseconds(long(cfg.cluster.timeout_s * 1000));
  if (opt.rank == 0) coordinator_ = std::make_unique<Coordinator>(ctx_.transport(), opt.coordinator, cfg.cluster.workers, timeout);
  rv_ = std::make_unique<RendezvousClient>(ctx_.transport(), opt.coordinator, opt.rank, cfg.cluster.workers, timeout);
  if (opt.resume) resume(), agree_on_resume();
  join_group();
  if (opt.rank == 0 && !opt.snapshots.empty())
    snapshots_ = std::make_unique<SnapshotSender>(ctx_.transport(), opt.snapshots, cfg.eval.interval_s, cfg.cluster.timeout_s);
  if (group_overlaps()) overlap_buckets();
  // A slowed rank's buckets start as late as on a slower machine (Straggler::paced).
  listener_ = stager_ ? ctx_.straggler().paced(stager_.get()) : buckets_ ? ctx_.straggler().paced(buckets_.get()) : nullptr;
  ctx_.announce("allreduce over " + coll_->describe() + (wire_ ? ", gradients in " + cfg.cluster.codec : std::string()) +
                (buckets_ ? ", " + std::to_string(buckets_->buckets()) + (buckets_->buckets() == 1 ? " bucket" : " buckets") +
                                " overlapped with backward"
                          : std::string()));
}

// cluster.overlap, or on "auto" whether every rank's host says so (its cores and processes): the
// answers go round the rendezvous, for ranks that bucketed apart would all-reduce sizes that
// do not match.
bool AllreduceRank::group_overlaps() {
  const bool mine = overlaps(cfg_, opt_.procs_on_host);
  if (!cfg_.cluster.overlap.is_auto() || cfg_.cluster.launcher == "virtual") return mine;
  rv_->set("overlap/" + std::to_string(opt_.rank), {char(mine)});
  for (int q = 0; q < cfg_.cluster.workers; ++q)
    if (rv_->get("overlap/" + std::to_string(q)) != std::vector<char>{char(1)}) return false;
  return true;
}

void AllreduceRank::overlap_buckets() {
  const std::size_t bucket = std::size_t(cfg_.cluster.bucket_kb) * 1024 / sizeof(float);
  Backend& be = ctx_.backend();
  if (be.device() == Device::cpu) {
    buckets_ = std::make_unique<BucketedAllreduce>(*coll_, model_.grads(), P_, bucket, cfg_.cluster.timeout_s, wire_);
    return;
  }
  Collective* host = coll_->host_side();
  if (!host && cfg_.cluster.overlap.is_auto()) return;  // NCCL: no overlap yet
  if (!host)
    throw std::invalid_argument("cluster.overlap: GPU ranks overlap an all-reduce through host memory only; " +
                                coll_->describe() + " does not overlap yet (set cluster.overlap = false, or "
                                "cluster.collective = \"gloo\")");
  host_grads_ = HostBuffer<float>(be, P_);
  buckets_ = std::make_unique<BucketedAllreduce>(*host, host_grads_.data(), P_, bucket, cfg_.cluster.timeout_s, wire_);
  stager_ = std::make_unique<GradStager>(be, model_.grads(), host_grads_.data(), P_, bucket, *buckets_);
}

void AllreduceRank::resume() {
  if (opt_.checkpoint.empty()) throw std::invalid_argument("--resume needs --checkpoint (the file rank 0 wrote)");
  const ShardCheckpoint c = read_checkpoint(opt_.checkpoint);
  if (c.length != P_ || c.config_hash != config_fingerprint(cfg_))
    throw std::runtime_error("cannot resume from " + opt_.checkpoint + ": it was written by a run with another " +
                             (c.length != P_ ? "model (" + std::to_string(c.length) + " parameters)" : std::string("config")));
  ctx_.backend().copy_from_host(model_.params(), c.theta.data(), P_ * sizeof(float));
  optimizer_.restore(c.optimizer_steps, c.optimizer);
  first_ = c.version;
  samples_ = c.samples_applied;
  std::fprintf(stderr, "[rank %d] resumed from %s at step %ld\n", opt_.rank, opt_.checkpoint.c_str(), first_);
  ctx_.metrics().write({{"kind", "resumed"}, {"worker", opt_.rank}, {"step", first_}, {"lost_pushes", 0}});
}

// Each rank read its own --checkpoint (on hosts without a shared file system, its own copy): the
// ranks go on only from the same step and samples, else they would all-reduce gradients of other
// batches at other learning rates, and part (their step counts apart) at the end.
void AllreduceRank::agree_on_resume() {
  const std::string mine = std::to_string(first_) + " " + std::to_string(samples_);
  rv_->set("resume/" + std::to_string(opt_.rank), std::vector<char>(mine.begin(), mine.end()));
  for (int q = 0; q < cfg_.cluster.workers; ++q) {
    const auto got = rv_->get("resume/" + std::to_string(q));
    const std::string theirs(got.begin(), got.end());
    if (theirs != mine)
      throw std::runtime_error("cannot resume: rank " + std::to_string(q) + "'s checkpoint is at step and samples " + theirs +
                               ", this rank's (" + opt_.checkpoint + ") at " + mine +
                               ": the ranks must resume from one file (rank 0 writes it; copy it to every host that "
                               "has no shared file system with it)");
  }
}

void AllreduceRank::join_group() {
  coll_ = make_collective(ctx_.backend(), *rv_, opt_.host.empty() ? cfg_.cluster.bind : opt_.host, ctx_.transport().name(),
                          cfg_.cluster.collective);
  coll_->broadcast(model_.params(), P_, 0);
  // A rank silent for cluster.heartbeat_s (stopped, hung, its host gone) is named by every other
  // rank within about that time. No step can complete without it and the training thread is
  // blocked in the collective, so the watch's thread ends the process (exit code 1).
  watch_ = std::make_unique<GroupWatch>(
      ctx_.transport(), opt_.coordinator, opt_.rank, cfg_.cluster.workers, std::chrono::duration<double>(cfg_.cluster.heartbeat_s),
      [rank = opt_.rank](const std::string& lost) {
        std::fprintf(stderr, "pslab_worker: error: all-reduce rank %d: %s; allreduce cannot train on without it\n", rank,
                     lost.c_str());
        std::fflush(nullptr);
        std::_Exit(1);
      });
  if (wire_ && !coll_->reduces_half())
    throw std::invalid_argument("cluster.codec = \"" + cfg_.cluster.codec + "\": " + coll_->describe() +
                                " all-reduces float32 only; set cluster.codec = \"f32\", or cluster.collective = \"gloo\" "
                                "(through host memory)");
}

std::vector<float> AllreduceRank::run() {
  // eval.every_epochs: a point at the start too, θ before the first update (as the PS modes' evaluator
  // pulls it; the first tick came after step 1, and the curves began apart).
  // (It waits for the evaluator, which may still be starting: sent at once, it was lost then.)
  if (snapshots_ && ticks_.on() && ticks_.due(double(samples_) / double(ctx_.data().train.n)))
    snapshots_->send(ctx_.replica().download_params(), P_, first_, samples_, false, /*wait=*/true);
  for (long s = first_; s < ctx_.total_steps(); ++s) step(s);
  return finish();
}

void AllreduceRank::step(long step) {
  const long steps = ctx_.total_steps(), spe = ctx_.steps_per_epoch();
  const auto idx = ctx_.batch(step);
  const long global_batch = ctx_.global_batch(step);
  rv_->report_step(step);  // before the step's first all-reduce call (with overlap: during backward)
  if (buckets_) buckets_->start(step, wire_scale(double(global_batch)));
  if (stager_) stager_->start();
  const auto t0 = ctx_.clock().now();
  ctx_.straggler().start_step(step);
  StepRecord rec;
  rec.loss = ctx_.replica().compute_gradient(idx, 1.0f / float(global_batch), listener_);
  ctx_.backend().synchronize();
  rec.compute_s = ctx_.clock().computed(t0, long(idx.size())) - ctx_.straggler().paced_s();
  rec.delay_s = ctx_.straggler().sleep_after(rec.compute_s);
  rec.samples = int(idx.size());

  const bool last = step == steps - 1;
  // Each rank's batch-mean gradient carries the global batch as its weight, so that the sum
  // over ranks of the accumulated means is the mean over every sample of the update.
  const bool due = acc_.add(model_.grads(), double(global_batch), last);
  const int N = acc_.batches();
  // The accumulator's sums and scales are queued on the backend's stream; NCCL reduces on its
  // own, which nothing orders after them (a GPU: the mean read half-scaled). (N = 1: nothing queued.)
  if (due && N > 1) ctx_.backend().synchronize();
  if (due) {
    float* grad = acc_.mean();
    const auto t1 = ctx_.clock().now();
    if (buckets_) {
      buckets_->finish();  // what is left after backward: the exposed communication
      if (stager_) ctx_.backend().copy_from_host(grad, host_grads_.data(), P_ * sizeof(float));  // the sum, back up once
    } else if (wire_) coll_->allreduce_sum_half(grad, P_, *wire_, wire_scale(acc_.weight()), step);  // (the step as
    else coll_->allreduce_sum(grad, P_, step);  // reported to the rendezvous: a timeout names the ranks behind it)
    rec.comm_s = ctx_.since(t1);
    rec.allreduce_bytes = long(P_ * (wire_ ? 2 : sizeof(float)));
    if (wire_ == HalfFormat::f16) say_if_saturated(step, buckets_ ? wire_scale(double(global_batch)) : wire_scale(acc_.weight()),
                                                   stager_ ? host_grads_.data() : grad);
    // The schedule's epoch: samples applied before this update (as the servers count them), not
    // its own accumulated batches (samples_ holds all but the last of them).
    const double applied = double(samples_) - (acc_.weight() - double(global_batch));
    rec.lr = learning_rate(schedule_, cfg_.optimizer.lr, cfg_.cluster.workers * cfg_.train.batch * N,
                           applied / double(ctx_.data().train.n));
    optimizer_.step(model_.params(), grad, rec.lr);
  }
  samples_ += global_batch;
  const double epoch = double(samples_) / double(ctx_.data().train.n);
  ctx_.log().add(step, epoch, rec, last || (step + 1) % spe == 0);
  // An epoch tick the evaluator had no room for goes later (late, not lost: as the PS modes'
  // evaluator takes a tick once it has room), tried again every eval.interval_s (each try copies
  // θ from the device); an interval's is skipped.
  const bool tick = snapshots_ && ticks_.on() && ticks_.due(epoch);
  tick_owed_ = tick_owed_ || tick;
  if (snapshots_ && (last || tick || (tick_owed_ && snapshots_->due()) || (!ticks_.on() && snapshots_->due()))) {
    if (snapshots_->send(ctx_.replica().download_params(), P_, step + 1, samples_, last)) tick_owed_ = false;  // (download synchronizes)
  } else if (snapshots_) {
    snapshots_->keep_alive(step + 1, samples_);
  }
  // Rank 0's checkpoint: every replica holds the same θ and optimizer state after a step.
  const auto every = std::chrono::duration<double>(cfg_.checkpoint.every_s);
  if (opt_.rank == 0 && !opt_.checkpoint.empty() && due &&
      (last || (every.count() > 0 && ctx_.clock().now() - last_checkpoint_ >= every)))
    write_checkpoint_at(step + 1, last ? "final" : "periodic");
}

// An f16 wire carries the gradient times the scale: values past 65504 were clipped to it, on the
// way or in a sum, which no later figure shows (a run comparing codecs reads "f16 trains worse").
// Said once, on the first update that had any. (Host memory only: a GPU's ∇θ without overlap is
// not looked at.)
void AllreduceRank::say_if_saturated(long step, float scale, const float* sum) {
  if (said_saturated_ || (sum != host_grads_.data() && ctx_.backend().device() != Device::cpu)) return;
  const std::size_t k = saturated_half(HalfFormat::f16, sum, P_, scale);
  if (k == 0) return;
  said_saturated_ = true;
  std::fprintf(stderr, "[worker %d] warning: the f16 all-reduce of step %ld clipped %zu of %zu values (the ranks' gradients "
               "times %g, summed, passed f16's largest, 65504); cluster.codec = \"bf16\" keeps float32's range\n",
               opt_.rank, step + 1, k, P_, double(scale));
}

void AllreduceRank::write_checkpoint_at(long step_done, const char* why) {
  const auto t = ctx_.clock().now();
  ShardCheckpoint c;
  c.length = P_;
  c.config_hash = config_fingerprint(cfg_);
  c.version = step_done;
  c.samples_applied = samples_;
  c.clocks.assign(std::size_t(cfg_.cluster.workers), step_done);
  c.lost.assign(std::size_t(cfg_.cluster.workers), 0);
  const float* theta = ctx_.replica().download_params();  // synchronizes
  c.theta.assign(theta, theta + P_);
  c.optimizer_steps = optimizer_.steps();
  c.optimizer = optimizer_.state();
  last_checkpoint_ = ctx_.clock().now();
  try {  // (as a server's: a full disk costs the checkpoint, not the run; the one before stays whole)
    write_checkpoint(opt_.checkpoint, c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank 0] %s checkpoint not written: %s\n", why, e.what());
    return;
  }
  ctx_.metrics().write({{"kind", "checkpoint"}, {"why", why}, {"version", step_done}, {"ms", ctx_.since(t) * 1e3}});
}

std::vector<float> AllreduceRank::finish() {
  std::vector<float> final_theta(P_);
  model_.store_params(final_theta.data());
  char sum[24];
  std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(wire::checksum(final_theta.data(), P_)));
  ctx_.metrics().write({{"kind", "final"}, {"worker", opt_.rank}, {"steps", ctx_.total_steps()}, {"params_checksum", sum}});
  ctx_.metrics().flush();
  watch_.reset();  // done: a rank that says Bye is not watched for
  rv_->bye();
  return final_theta;
}

}  // namespace

std::vector<float> run_allreduce_worker(const ExperimentConfig& cfg, const RoleOptions& opt) {
  if (opt.coordinator.empty()) throw std::invalid_argument("the all-reduce mode needs --coordinator (rank 0's rendezvous endpoint)");
  AllreduceRank rank(cfg, opt);
  return rank.run();
}

}  // namespace pslab
