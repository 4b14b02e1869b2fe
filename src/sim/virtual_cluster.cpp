#include "sim/virtual_cluster.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>

#include "core/replica.h"
#include "core/sampler.h"
#include "roles.h"
#include "run/setup.h"
#include "server.h"
#include "sim/replay.h"
#include "sim/sim_transport.h"

namespace pslab {

namespace {

using sim::Scheduler;

// A worker's step at the config's batch on this machine: the median of a few real ones.
double measure_compute_s(const ExperimentConfig& cfg, const DataSplit& data, int procs_on_host) {
  auto be = make_cpu_backend(blas_threads(cfg, procs_on_host));
  Replica replica(*be, model_spec(cfg), data.train, cfg.train.batch);
  replica.model().init(cfg.seed);
  // Batches of the whole training set (a rank's shard of many workers' may hold fewer samples
  // than a batch), each time taken as that of train.batch samples.
  ShardSampler sampler(std::size_t(data.train.n), 1, 0, cfg.seed);
  sampler.set_epoch(0);
  std::vector<double> times;
  for (int i = 0; i < 25; ++i) {
    const auto idx = sampler.batch(i % std::max(1L, sampler.steps_per_epoch(cfg.train.batch)), cfg.train.batch);
    const auto t0 = wall_clock().now();
    replica.compute_gradient(idx);
    if (i >= 5) times.push_back(seconds_between(t0, wall_clock().now()) * cfg.train.batch / double(std::max<std::size_t>(1, idx.size())));
  }
  std::nth_element(times.begin(), times.begin() + long(times.size() / 2), times.end());
  return times[times.size() / 2];
}

// One metrics file per process, open for the whole run: 1024 workers need more than the usual
// soft limit of 1024 descriptors.
void raise_file_limit() {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
}

// The roles of one run, as threads of the simulation.
class VirtualCluster {
 public:
  VirtualCluster(const ExperimentConfig& cfg, const VirtualOptions& opt, const sim::Costs& costs, DataSplit data)
      : cfg_(cfg), opt_(opt), net_(s_, costs), data_(std::move(data)) {
    if (!cfg.virtual_cluster.replay.empty())
      net_.set_policy(sim::make_replay_policy(s_, cfg.virtual_cluster.replay, server_addresses(), cfg.cluster.workers));
  }
  double run() {
    const bool servers = cfg_.uses_servers();
    if (servers)
      for (int k = 0; k < cfg_.cluster.servers; ++k) start_server(k);
    s_.spawn("evaluator", [this] { result_ = run_evaluator(cfg_, role(-1)); });
    const auto start = Scheduler::epoch() + std::chrono::duration_cast<Scheduler::duration>(
                                                std::chrono::duration<double>(cfg_.virtual_cluster.startup_ms * 1e-3));
    for (int r = 0; r < cfg_.cluster.workers; ++r)
      s_.spawn("worker " + std::to_string(r), [this, r, servers] {
        if (servers) run_ps_worker(cfg_, role(r));
        else run_allreduce_worker(cfg_, role(r));
      }, start);
    const auto* replay = dynamic_cast<const sim::ReplayPolicy*>(net_.policy());
    try {
      s_.run();
    } catch (const std::runtime_error& e) {  // a wait that ran out: where the replay stood says why
      const std::string where = replay ? replay->stopped(e.what()) : "";
      if (where.empty()) throw;
      throw std::runtime_error(where);
    }
    if (replay) replay->check_complete();
    return result_;
  }

 private:
  std::vector<std::string> server_addresses() const {
    std::vector<std::string> a;
    for (int k = 0; cfg_.uses_servers() && k < cfg_.cluster.servers; ++k) a.push_back("sim://server" + std::to_string(k));
    return a;
  }

  void start_server(int k) {
    ServerOptions o;
    o.endpoint = server_addresses()[std::size_t(k)];
    o.shard = k;
    o.metrics_path = opt_.out_dir + "/metrics/server" + std::to_string(k) + ".jsonl";
    o.run_start = sim::SimClock::kRunStart;
    o.wait_for_shutdown = true;  // the evaluator takes the final θ, then ends the run
    o.procs_on_host = opt_.procs_on_host;
    net_.apply_at(o.endpoint);
    s_.spawn("server " + std::to_string(k), [this, o] {
      Server server(net_, cfg_, o);
      server.run();
    });
  }

  // What the launcher would tell worker `rank` (-1: the evaluator).
  RoleOptions role(int rank) {
    RoleOptions o;
    o.rank = std::max(0, rank);
    o.servers = server_addresses();
    if (!cfg_.uses_servers()) o.coordinator = "sim://coordinator", o.snapshots = "sim://evaluator";
    o.out_dir = opt_.out_dir;
    o.run_start = sim::SimClock::kRunStart;
    o.procs_on_host = opt_.procs_on_host;
    o.progress = opt_.progress;
    o.transport = &net_;
    o.data = &data_;
    o.evaluate_inline = true;
    if (rank < 0 && !cfg_.uses_servers()) o.servers.clear();
    return o;
  }

  const ExperimentConfig& cfg_;
  const VirtualOptions& opt_;
  Scheduler s_;
  sim::SimTransport net_;  // after the scheduler: the roles' connections go first
  DataSplit data_;
  double result_ = 0.0;
};

}  // namespace

double run_virtual_cluster(const ExperimentConfig& cfg, const VirtualOptions& opt) {
  raise_file_limit();
  sim::Costs costs = sim::Costs::of(cfg);
  const bool replay = !cfg.virtual_cluster.replay.empty();
  const int S = cfg.uses_servers() ? cfg.cluster.servers : 0;
  if (replay && S == 0)
    throw std::invalid_argument("virtual.replay: an allreduce run has no order to replay (it is deterministic)");
  DataSplit data = load_data(cfg);
  if (costs.compute_s <= 0 && !replay) {
    costs.compute_s = measure_compute_s(cfg, data, opt.procs_on_host);
    std::fprintf(stderr, "[virtual] a worker's step measured here: %.3f ms at batch %d (virtual.compute_ms)\n",
                 costs.compute_s * 1e3, cfg.train.batch);
  }
  if (replay)
    std::fprintf(stderr, "[virtual] replaying the order of %s: %d workers, %d servers\n", cfg.virtual_cluster.replay.c_str(),
                 cfg.cluster.workers, S);
  else
    std::fprintf(stderr, "[virtual] %s: %d workers, %d servers, simulated (compute %.3f ms/step, latency %.0f us, %.2f GB/s "
                 "per link, servers apply %.2f GB/s)\n", cfg.cluster.mode.c_str(), cfg.cluster.workers, S,
                 costs.compute_s * 1e3, costs.latency_s * 1e6, costs.bytes_per_s * 1e-9, costs.apply_bytes_per_s * 1e-9);
  VirtualCluster cluster(cfg, opt, costs, std::move(data));
  return cluster.run();
}

}  // namespace pslab
