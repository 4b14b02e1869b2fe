// pslab_server: one parameter server of a run. Owns shard --shard of θ and serves it on
// --bind until every worker has said Bye (and, with --wait-for-shutdown, until the evaluator
// or the launcher sends Shutdown). Metrics: --metrics FILE (JSON lines).
#include <CLI/CLI.hpp>

#include <atomic>
#include <csignal>
#include <cstdio>

#include "run/config.h"
#include "run/metrics.h"
#include "run/setup.h"
#include "server.h"
#include "backend.h"

using namespace pslab;

namespace {
std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  pslab::use_best_cpu_runtime(argv);  // (may re-execute this program: first)
  CLI::App app{"pslab parameter server: serves one shard of the parameters to the workers of a run"};
  std::string config_path;
  std::vector<std::string> overrides;
  ServerOptions opt;
  app.add_option("-c,--config", config_path, "experiment config (TOML), the same file every process of the run reads")
      ->required()->check(CLI::ExistingFile);
  app.add_option("--set", overrides, "override a key: section.key=value (repeatable)");
  app.add_option("--shard", opt.shard, "which shard of θ this server owns, in [0, cluster.servers)")->required();
  app.add_option("--bind", opt.endpoint, "address to listen on, of the run's cluster.transport: tcp://HOST:PORT "
                                         "or ipc:///PATH")->required();
  app.add_option("--metrics", opt.metrics_path, "write metrics as JSON lines to this file");
  app.add_option("--run-start", opt.run_start, "run start, Unix seconds (metric times count from it)");
  app.add_option("--procs-on-host", opt.procs_on_host,
                 "processes sharing this host's cores (sets the server's threads when cluster.server_threads = 0)");
  app.add_option("--servers-on-host", opt.servers_on_host,
                 "of them servers and backups (train.device = \"cuda\": the servers share the cores the GPU processes "
                 "leave, one each)");
  std::string auth_key;
  app.add_option("--auth-key", auth_key, "the run's key file (mode 0600, made by the launcher): peers authenticate");
  app.add_flag("--wait-for-shutdown", opt.wait_for_shutdown, "after every worker's Bye, serve until a Shutdown arrives");
  app.add_flag("--trace-pulls", opt.record_pulls, "write a metrics line for every served pull (clock, slowest clock)");
  app.add_option("--checkpoint", opt.checkpoint_path,
                 "write the shard's checkpoint to this file every checkpoint.every_s and when the server stops");
  app.add_option("--trace", opt.trace_path, "record the order of applied pushes and served pulls here "
                                          "(RUN_DIR/trace/server<k>.txt; launch.py replay re-executes it)");
  app.add_option("--resume", opt.resume_path, "go on from this checkpoint (written by --checkpoint of the same run)")
      ->check(CLI::ExistingFile);
  app.add_flag("--restarted", opt.restarted,
               "a server of a run under way, restarted without a checkpoint (it died before its first): no start barrier; "
               "it begins from the run's initial θ, and the updates of its shard so far are lost (counted as workers rejoin)")
      ->excludes("--resume");
  app.add_option("--backup-of", opt.backup_of,
                 "cluster.replicas = 2: be the backup of the shard's primary listening at this address (it sends every "
                 "update here before it answers; this server takes over when a worker or the evaluator comes to it)")
      ->excludes("--resume")->excludes("--restarted");
  CLI11_PARSE(app, argc, argv);

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  opt.stop = &g_stop;
  try {
    const ExperimentConfig cfg = load_config(config_path, overrides);
    if (opt.shard < 0 || opt.shard >= cfg.cluster.servers)
      throw std::invalid_argument("--shard " + std::to_string(opt.shard) + " is not in [0, cluster.servers = " +
                                  std::to_string(cfg.cluster.servers) + ")");
    set_cpu_backend_threads(1);  // a server's updates are memory-bound: one BLAS thread
    const auto transport = run_transport(cfg, auth_key);
    Server server(*transport, cfg, opt);
    std::fprintf(stderr, "[server %d%s] %s: shard [%zu, %zu) of θ, %s, %d workers, %d update thread(s), listening on %s\n",
                 opt.shard, opt.backup_of.empty() ? "" : " backup", cfg.name.c_str(), server.range().offset, server.range().offset + server.range().length,
                 cfg.cluster.mode.c_str(), cfg.cluster.workers, server.state().options().threads, opt.endpoint.c_str());
    server.run();
    const auto& c = server.counters();
    std::fprintf(stderr, "[server %d] done: version %ld, %ld pushes, %ld pulls (%ld held), %ld bad messages, %ld replies dropped, "
                 "%ld peers refused\n", opt.shard, server.state().version(), c.pushes, c.pulls, c.pulls_held, c.bad_total(),
                 c.dropped_replies, transport->peers_refused());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pslab_server: error: %s\n", e.what());
    return 1;
  }
}
