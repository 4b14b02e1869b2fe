// One rank of the synchronous all-reduce mode: a full replica per rank, no servers.
//
//   broadcast θ from rank 0
//   every step: forward + backward on the local batch with the loss scaled by
//   1 / global batch, so that the all-reduce SUM of the flat gradient is the global mean
//   (weighted by each rank's batch size, with no extra pass); local optimizer step.
//
// Every rank runs the same number of steps (the sampler gives each the same count; a rank
// whose shard is shorter contributes a smaller or empty last batch), so no rank waits on a
// step that another will never take.
#include <chrono>
#include <cstdio>

#include "comm/collective.h"
#include "comm/net.h"
#include "core/optimizer.h"
#include "core/replica.h"
#include "roles.h"
#include "core/sampler.h"
#include "run/setup.h"
#include "snapshots.h"
#include "straggler.h"
#include "train_log.h"

namespace pslab {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

std::vector<float> run_allreduce_worker(const ExperimentConfig& cfg, const RoleOptions& opt) {
  const int W = cfg.cluster.workers;
  if (opt.rank < 0 || opt.rank >= W)
    throw std::invalid_argument("--rank " + std::to_string(opt.rank) + " is not in [0, cluster.workers = " + std::to_string(W) + ")");
  if (opt.coordinator.empty()) throw std::invalid_argument("the all-reduce mode needs --coordinator (rank 0's rendezvous endpoint)");
  auto be = make_role_backend(cfg, opt);
  const DataSplit data = load_data(cfg);
  Replica replica(*be, model_spec(cfg), data.train, cfg.train.batch);
  Model& model = replica.model();
  const std::size_t P = model.num_params();
  model.init(cfg.seed);

  std::unique_ptr<zmq::context_t> own_ctx;
  zmq::context_t& ctx = opt.ctx ? *opt.ctx : *(own_ctx = std::make_unique<zmq::context_t>(1));
  const auto timeout = std::chrono::milliseconds(long(cfg.cluster.timeout_s * 1000));
  std::unique_ptr<Coordinator> coordinator;
  if (opt.rank == 0) coordinator = std::make_unique<Coordinator>(ctx, net::bind_endpoint(opt.coordinator), W, timeout);
  RendezvousClient rv(ctx, opt.coordinator, opt.rank, W, timeout);
  std::unique_ptr<Collective> coll =
      make_collective(*be, rv, opt.host.empty() ? cfg.cluster.bind : opt.host);
  coll->broadcast(model.params(), P, 0);

  Optimizer optimizer(*be, cfg.optimizer, P);
  ShardSampler sampler(std::size_t(data.train.n), W, opt.rank, cfg.seed);
  const int b = cfg.train.batch;
  const long spe = sampler.steps_per_epoch(b);
  const long steps = total_steps(cfg, spe);
  const ScheduleConfig schedule = schedule_for_run(cfg, spe);
  MetricsWriter metrics(opt.out_dir + "/metrics/worker" + std::to_string(opt.rank) + ".jsonl", opt.run_start);
  Progress progress("rank " + std::to_string(opt.rank), opt.progress && opt.rank == 0);
  TrainLog log(metrics, progress, opt.rank, cfg.train.log_every, steps);
  Straggler straggler(cfg.straggler, cfg.seed, opt.rank);
  std::unique_ptr<SnapshotSender> snapshots;
  std::vector<float> theta_host;
  if (opt.rank == 0 && !opt.snapshots.empty()) {
    snapshots = std::make_unique<SnapshotSender>(ctx, opt.snapshots, cfg.eval.interval_s, cfg.cluster.timeout_s);
    if (be->device() != Device::cpu) theta_host.resize(P);
  }
  auto send_snapshot = [&](long step, long samples, bool final) {
    if (theta_host.empty()) return snapshots->send(model.params(), P, step, samples, final);
    be->copy_to_host(theta_host.data(), model.params(), P * sizeof(float));
    snapshots->send(theta_host.data(), P, step, samples, final);
  };
  if (opt.rank == 0 || straggler.active())
    std::fprintf(stderr, "[rank %d] %s on %s; allreduce over %s; %ld steps of batch %d%s\n", opt.rank,
                 model.describe().c_str(), be->describe().c_str(), coll->describe().c_str(), steps, b,
                 straggler.active() ? "; straggler" : "");

  long samples = 0;  // all ranks together
  for (long step = 0; step < steps; ++step) {
    sampler.set_epoch(step / spe);
    const long s = step % spe;
    const auto idx = sampler.batch(s, b);
    const long global_batch = sampler.global_batch_size(s, b);
    const auto t0 = Clock::now();
    StepRecord rec;
    rec.loss = replica.compute_gradient(idx, 1.0f / float(global_batch));
    be->synchronize();
    rec.compute_s = since(t0);
    rec.delay_s = straggler.sleep_after(rec.compute_s);
    rec.samples = int(idx.size());
    rv.report_step(step);

    const auto t1 = Clock::now();
    coll->allreduce_sum(model.grads(), P, step);
    rec.comm_s = since(t1);
    rec.allreduce_bytes = long(P * sizeof(float));
    rec.lr = learning_rate(schedule, cfg.optimizer.lr, W * b, double(samples) / data.train.n);
    optimizer.step(model.params(), model.grads(), rec.lr);
    samples += global_batch;
    const bool last = step == steps - 1;
    log.add(step, double(samples) / data.train.n, rec, last || s == spe - 1);
    if (snapshots && (last || snapshots->due())) {
      be->synchronize();
      send_snapshot(step + 1, samples, last);
    }
  }
  std::vector<float> final_theta(P);
  model.store_params(final_theta.data());
  char sum[24];
  std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(wire::checksum(final_theta.data(), P)));
  metrics.write({{"kind", "final"}, {"worker", opt.rank}, {"steps", steps}, {"params_checksum", sum}});
  metrics.flush();
  rv.bye();
  return final_theta;
}

}  // namespace pslab
