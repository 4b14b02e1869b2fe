// One rank of the synchronous all-reduce mode: a full replica per rank, no servers.
//
//   broadcast θ from rank 0
//   every step: forward + backward on the local batch with the loss scaled by
//   1 / global batch, so that the all-reduce SUM of the flat gradient is the global mean
//   (weighted by each rank's batch size, with no extra pass); local optimizer step. With
//   train.accumulate = N the all-reduce and the step come every N batches, on their mean.
//   With cluster.overlap the all-reduce goes in buckets, each started as soon as backward
//   has finished it (BucketedAllreduce).
//
// Every rank runs the same number of steps (the sampler gives each the same count; a rank
// whose shard is shorter contributes a smaller or empty last batch), so no rank waits on a
// step that another will never take.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "bucketed_allreduce.h"
#include "grad_accumulator.h"
#include "comm/collective.h"
#include "comm/rendezvous.h"
#include "ps/checkpoint.h"
#include "core/optimizer.h"
#include "role_context.h"
#include "run/setup.h"
#include "eval_schedule.h"
#include "snapshots.h"

namespace pslab {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The power of two nearest a global batch: a 16-bit wire carries the gradient times it (the
// gradient summed over the batch, about), out of f16's subnormals; exact both ways.
float wire_scale(double global_batch) { return global_batch >= 1 ? std::exp2(std::round(std::log2(float(global_batch)))) : 1.0f; }

// cluster.codec in allreduce mode: the gradient all-reduced in 16 bits (f16, bf16) or float32.
std::optional<HalfFormat> wire_format(const std::string& codec) {
  if (codec == "f16") return HalfFormat::f16;
  if (codec == "bf16") return HalfFormat::bf16;
  return std::nullopt;  // f32 (the config refuses the others)
}
}  // namespace

std::vector<float> run_allreduce_worker(const ExperimentConfig& cfg, const RoleOptions& opt) {
  if (opt.coordinator.empty()) throw std::invalid_argument("the all-reduce mode needs --coordinator (rank 0's rendezvous endpoint)");
  RoleContext ctx(cfg, opt, RoleKind::allreduce_rank);
  const int W = cfg.cluster.workers;
  Replica& replica = ctx.replica();
  Model& model = replica.model();
  const std::size_t P = model.num_params();
  model.init(cfg.seed);

  const auto timeout = std::chrono::milliseconds(long(cfg.cluster.timeout_s * 1000));
  std::unique_ptr<Coordinator> coordinator;
  if (opt.rank == 0) coordinator = std::make_unique<Coordinator>(ctx.transport(), opt.coordinator, W, timeout);
  RendezvousClient rv(ctx.transport(), opt.coordinator, opt.rank, W, timeout);
  Optimizer optimizer(ctx.backend(), cfg.optimizer, P, layer_sizes(model.spec(), 0, P));
  long first = 0, samples = 0;  // where a resumed run goes on (samples: all ranks together)
  if (opt.resume) {
    if (opt.checkpoint.empty()) throw std::invalid_argument("--resume needs --checkpoint (the file rank 0 wrote)");
    const ShardCheckpoint c = read_checkpoint(opt.checkpoint);
    if (c.length != P || c.config_hash != config_fingerprint(cfg))
      throw std::runtime_error("cannot resume from " + opt.checkpoint + ": it was written by a run with another " +
                               (c.length != P ? "model (" + std::to_string(c.length) + " parameters)" : std::string("config")));
    ctx.backend().copy_from_host(model.params(), c.theta.data(), P * sizeof(float));
    optimizer.restore(c.optimizer_steps, c.optimizer);
    first = c.version;
    samples = c.samples_applied;
    std::fprintf(stderr, "[rank %d] resumed from %s at step %ld\n", opt.rank, opt.checkpoint.c_str(), first);
    ctx.metrics().write({{"kind", "resumed"}, {"worker", opt.rank}, {"step", first}, {"lost_pushes", 0}});
  }
  std::unique_ptr<Collective> coll = make_collective(ctx.backend(), rv, opt.host.empty() ? cfg.cluster.bind : opt.host,
                                                     cfg.cluster.transport, cfg.cluster.collective);
  coll->broadcast(model.params(), P, 0);
  // A rank silent for cluster.heartbeat_s (stopped, hung, its host gone) is named by every other
  // rank within about that time. No step can complete without it and the training thread is
  // blocked in the collective, so the watch's thread ends the process (exit code 1).
  auto watch = std::make_unique<GroupWatch>(
      ctx.transport(), opt.coordinator, opt.rank, W, std::chrono::duration<double>(cfg.cluster.heartbeat_s),
      [rank = opt.rank](const std::string& lost) {
        std::fprintf(stderr, "pslab_worker: error: all-reduce rank %d: %s; allreduce cannot train on without it\n",
                     rank, lost.c_str());
        std::fflush(nullptr);
        std::_Exit(1);
      });

  const long spe = ctx.steps_per_epoch(), steps = ctx.total_steps();
  const ScheduleConfig schedule = schedule_for_run(cfg, spe);
  const int b = cfg.train.batch;
  const double n_train = ctx.data().train.n;
  std::unique_ptr<SnapshotSender> snapshots;
  EpochTicks ticks(cfg.eval.every_epochs);  // eval.every_epochs: snapshots by epochs, not by time
  if (opt.rank == 0 && !opt.snapshots.empty())
    snapshots = std::make_unique<SnapshotSender>(ctx.transport(), opt.snapshots, cfg.eval.interval_s, cfg.cluster.timeout_s);
  const std::optional<HalfFormat> wire = wire_format(cfg.cluster.codec);
  if (wire && !coll->reduces_half())
    throw std::invalid_argument("cluster.codec = \"" + cfg.cluster.codec + "\": " + coll->describe() +
                                " all-reduces float32 only; set cluster.codec = \"f32\", or cluster.collective = \"gloo\" "
                                "(through host memory)");
  std::unique_ptr<BucketedAllreduce> buckets;
  if (cfg.cluster.overlap)
    buckets = std::make_unique<BucketedAllreduce>(*coll, model.grads(), P, std::size_t(cfg.cluster.bucket_kb) * 1024 / sizeof(float),
                                                  cfg.cluster.timeout_s, wire);
  // A slowed rank's buckets start as late as on a slower machine (Straggler::paced).
  GradListener* listener = buckets ? ctx.straggler().paced(buckets.get()) : nullptr;
  ctx.announce("allreduce over " + coll->describe() + (wire ? ", gradients in " + cfg.cluster.codec : std::string()) +
               (buckets ? ", " + std::to_string(buckets->buckets()) + (buckets->buckets() == 1 ? " bucket" : " buckets") +
                             " overlapped with backward"
                       : std::string()));

  // Rank 0's checkpoint: every replica holds the same θ and optimizer state after a step.
  const bool checkpoints = opt.rank == 0 && !opt.checkpoint.empty();
  const auto checkpoint_every = std::chrono::duration<double>(cfg.checkpoint.every_s);
  auto last_checkpoint = Clock::now();
  auto write_checkpoint_at = [&](long step_done, const char* why) {
    const auto t = Clock::now();
    ShardCheckpoint c;
    c.length = P;
    c.config_hash = config_fingerprint(cfg);
    c.version = step_done;
    c.samples_applied = samples;
    c.clocks.assign(std::size_t(W), step_done);
    c.lost.assign(std::size_t(W), 0);
    const float* theta = replica.download_params();  // synchronizes
    c.theta.assign(theta, theta + P);
    c.optimizer_steps = optimizer.steps();
    c.optimizer = optimizer.state();
    write_checkpoint(opt.checkpoint, c);
    ctx.metrics().write({{"kind", "checkpoint"}, {"why", why}, {"version", step_done}, {"ms", since(t) * 1e3}});
    last_checkpoint = Clock::now();
  };
  GradAccumulator acc(ctx.backend(), cfg.train.accumulate, P);  // train.accumulate: N batches per all-reduce
  const int N = acc.batches();
  for (long step = first; step < steps; ++step) {
    const auto idx = ctx.batch(step);
    const long global_batch = ctx.global_batch(step);
    // Reported before the step's first all-reduce call (with overlap: during backward).
    rv.report_step(step);
    if (buckets) buckets->start(step, wire_scale(double(global_batch)));
    const auto t0 = Clock::now();
    ctx.straggler().start_step();
    StepRecord rec;
    rec.loss = replica.compute_gradient(idx, 1.0f / float(global_batch), listener);
    ctx.backend().synchronize();
    rec.compute_s = since(t0) - ctx.straggler().paced_s();
    rec.delay_s = ctx.straggler().sleep_after(rec.compute_s);
    rec.samples = int(idx.size());

    const bool last = step == steps - 1;
    // Each rank's batch-mean gradient carries the global batch as its weight, so that the sum
    // over ranks of the accumulated means is the mean over every sample of the update.
    const bool due = acc.add(model.grads(), double(global_batch), last);
    if (due) {
      float* grad = acc.mean();
      const auto t1 = Clock::now();
      if (buckets) buckets->finish();  // what is left after backward: the exposed communication
      else if (wire) coll->allreduce_sum_half(grad, P, *wire, wire_scale(acc.weight()), step / N);
      else coll->allreduce_sum(grad, P, step / N);
      rec.comm_s = since(t1);
      rec.allreduce_bytes = long(P * (wire ? 2 : sizeof(float)));
      rec.lr = learning_rate(schedule, cfg.optimizer.lr, W * b * N, double(samples) / n_train);
      optimizer.step(model.params(), grad, rec.lr);
    }
    samples += global_batch;
    ctx.log().add(step, double(samples) / n_train, rec, last || (step + 1) % spe == 0);
    if (snapshots && (last || (ticks.on() ? ticks.due(double(samples) / n_train) : snapshots->due()))) {
      const float* theta = replica.download_params();  // synchronizes
      snapshots->send(theta, P, step + 1, samples, last);
    }
    if (checkpoints && due && (last || (checkpoint_every.count() > 0 && Clock::now() - last_checkpoint >= checkpoint_every)))
      write_checkpoint_at(step + 1, last ? "final" : "periodic");
  }
  std::vector<float> final_theta(P);
  model.store_params(final_theta.data());
  char sum[24];
  std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(wire::checksum(final_theta.data(), P)));
  ctx.metrics().write({{"kind", "final"}, {"worker", opt.rank}, {"steps", steps}, {"params_checksum", sum}});
  ctx.metrics().flush();
  watch.reset();  // done: a rank that says Bye is not watched for
  rv.bye();
  return final_theta;
}

}  // namespace pslab
