// One worker of a parameter-server run.
#include <chrono>
#include <cstdio>

#include "comm/net.h"
#include "ps/client.h"
#include "core/replica.h"
#include "roles.h"
#include "core/sampler.h"
#include "run/setup.h"
#include "straggler.h"
#include "train_log.h"

namespace pslab {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

void run_ps_worker(const ExperimentConfig& cfg, const RoleOptions& opt) {
  const int W = cfg.cluster.workers;
  if (opt.rank < 0 || opt.rank >= W)
    throw std::invalid_argument("--rank " + std::to_string(opt.rank) + " is not in [0, cluster.workers = " + std::to_string(W) + ")");
  if (int(opt.servers.size()) != cfg.cluster.servers)
    throw std::invalid_argument(std::to_string(opt.servers.size()) + " server endpoints given, cluster.servers = " +
                                std::to_string(cfg.cluster.servers));
  auto be = make_role_backend(cfg, opt);
  const DataSplit data = load_data(cfg);
  const ModelSpec spec = model_spec(cfg);
  Replica replica(*be, spec, data.train, cfg.train.batch);
  Model& model = replica.model();
  const std::size_t P = model.num_params();

  // θ and ∇θ as host buffers: the model's own on the CPU, staging copies on a GPU.
  const bool on_cpu = be->device() == Device::cpu;
  std::vector<float> theta_stage(on_cpu ? 0 : P), grad_stage(on_cpu ? 0 : P);
  float* theta = on_cpu ? model.params() : theta_stage.data();
  float* grad = on_cpu ? model.grads() : grad_stage.data();

  std::unique_ptr<zmq::context_t> own_ctx;
  zmq::context_t& ctx = opt.ctx ? *opt.ctx : *(own_ctx = std::make_unique<zmq::context_t>(1));
  PsClient client(ctx, opt.servers, wire::Role::worker, opt.rank, P, net::fnv1a(to_toml(cfg)), cfg.cluster.timeout_s);

  ShardSampler sampler(std::size_t(data.train.n), W, opt.rank, cfg.seed);
  const long spe = sampler.steps_per_epoch(cfg.train.batch);
  const long steps = total_steps(cfg, spe);
  MetricsWriter metrics(opt.out_dir + "/metrics/worker" + std::to_string(opt.rank) + ".jsonl", opt.run_start);
  Progress progress("worker " + std::to_string(opt.rank), opt.progress && opt.rank == 0);
  TrainLog log(metrics, progress, opt.rank, cfg.train.log_every, steps);
  Straggler straggler(cfg.straggler, cfg.seed, opt.rank);
  if (opt.rank == 0 || straggler.active())
    std::fprintf(stderr, "[worker %d] %s on %s; %s; %ld steps of batch %d; %zu server(s)%s\n", opt.rank,
                 model.describe().c_str(), be->describe().c_str(), cfg.cluster.mode.c_str(), steps,
                 cfg.train.batch, opt.servers.size(), straggler.active() ? "; straggler" : "");

  client.connect();  // the start barrier: returns when every worker has said Hello
  PullResult pulled = client.pull(0, theta);
  if (!on_cpu) be->copy_from_host(model.params(), theta, P * sizeof(float));

  for (long step = 0; step < steps; ++step) {
    sampler.set_epoch(step / spe);
    const auto idx = sampler.batch(step % spe, cfg.train.batch);
    const auto t0 = Clock::now();
    StepRecord rec;
    rec.loss = replica.compute_gradient(idx);
    if (!on_cpu) be->copy_to_host(grad, model.grads(), P * sizeof(float));
    be->synchronize();
    rec.compute_s = since(t0);
    rec.delay_s = straggler.sleep_after(rec.compute_s);
    rec.samples = int(idx.size());
    rec.version = pulled.min_version;

    const bool last = step == steps - 1;
    const auto t1 = Clock::now();
    pulled = client.push(step, int(idx.size()), grad, last ? nullptr : theta);  // push, then pull clock step+1
    rec.comm_s = since(t1);
    rec.wait_s = last ? 0.0 : pulled.held_us * 1e-6;
    if (!on_cpu && !last) be->copy_from_host(model.params(), theta, P * sizeof(float));
    log.add(step, double(step + 1) / double(spe), rec, last || (step + 1) % spe == 0);
  }
  client.bye(steps);
  metrics.flush();
}

}  // namespace pslab
