// pslab_worker: the worker binary.
//   train      single-process training (the mainline)
//   ps         one worker of a parameter-server run (bsp, ssp:s, asp)
//   allreduce  one rank of the all-reduce mode
//   eval       the evaluator (PS modes and all-reduce)
//   config     validate a config, write it back with defaults, list the keys, expand a sweep
//   keygen     write a new run key (comm/run_key.h)
//   virtual    a whole run in one process, in simulated time (src/sim/virtual_cluster.h)
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "comm/run_key.h"
#include "run/config.h"
#include "core/data.h"
#include "roles.h"
#include "run/plan.h"
#include "sim/virtual_cluster.h"
#include "backend.h"

using namespace pslab;

namespace {

// Writes `text` to `path`, or throws naming the path and the system's reason (a full disk).
void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out << text;
  if (out) out.close();
  if (!out) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
}

// A role stopped by a signal (the launcher's SIGTERM when another process failed, Ctrl-C) says
// so in its log before it goes: what it was and which signal. The line is made before the
// handler is installed; the handler only write()s it (async-signal-safe) and lets the
// signal end the process as it would have.
char stop_line[160];

extern "C" void on_stop_signal(int sig) {
  char line[sizeof stop_line + 32];
  const char* name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "SIGHUP";
  std::size_t n = 0;
  for (const char* p : std::initializer_list<const char*>{stop_line, name, "\n"})
    for (; *p && n < sizeof line; ++p) line[n++] = *p;
  [[maybe_unused]] const auto w = ::write(STDERR_FILENO, line, n);
  std::signal(sig, SIG_DFL);  // and ends as the signal would have ended it
  std::raise(sig);
}

void say_when_stopped(const std::string& who) {
  std::snprintf(stop_line, sizeof stop_line, "pslab_worker: %s: stopped by ", who.c_str());
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // nothing printed is lost when a signal ends the process
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) std::signal(sig, on_stop_signal);
}

// The subcommands: their options (CLI11), then what each does.
struct Commands {
  explicit Commands(CLI::App& app);
  int run();

  CLI::App *train, *ps, *allreduce, *eval, *virt, *config, *keygen;
  std::string config_path;
  std::vector<std::string> overrides;
  SingleRunOptions single;
  RoleOptions role;
  VirtualOptions vopt;
  std::string servers, backups, resolved_out, expand_dir, plan_out, key_path;
  bool quiet = false, list_keys = false;

 private:
  void add_config(CLI::App* sub) {
    sub->add_option("-c,--config", config_path, "experiment config (TOML)")->required()->check(CLI::ExistingFile);
    sub->add_option("--set", overrides, "override a key: section.key=value (TOML value; repeatable)");
  }
  void add_role(CLI::App* sub);
  int run_train();
  int run_role();
  int run_virtual();
  int run_config();
};

void Commands::add_role(CLI::App* sub) {
  add_config(sub);
  sub->add_option("-o,--out", role.out_dir, "run directory (metrics go to <out>/metrics/)")->capture_default_str();
  sub->add_option("--run-start", role.run_start, "run start, Unix seconds (metric times count from it)");
  sub->add_option("--procs-on-host", role.procs_on_host, "processes sharing this host's cores (sets BLAS threads when train.threads = 0)")
      ->capture_default_str();
  sub->add_option("--gpu-slot", role.gpu_slot, "with train.device = \"cuda\": this process's slot among the GPU processes "
                                                "on its host; it runs on GPU (slot mod the GPUs visible)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("-q,--quiet", quiet, "no progress lines");
  sub->add_option("--auth-key", role.auth_key, "the run's key file (mode 0600, made by the launcher): peers authenticate");
  sub->add_flag("--resume", role.resume, "a resumed run: go on where it stopped (ps: from the clock the servers' "
                                         "checkpoints hold for this worker; allreduce: from --checkpoint), append to the metrics");
}

Commands::Commands(CLI::App& app) {
  train = app.add_subcommand("train", "train on this process alone; metrics to <out>/metrics/worker0.jsonl");
  add_config(train);
  train->add_option("-o,--out", single.out_dir, "run directory")->capture_default_str();
  train->add_option("--run-start", single.run_start, "run start, Unix seconds (metrics times count from it)");
  train->add_flag("-q,--quiet", quiet, "no progress lines");

  const char* servers_help = "server endpoints in shard order, comma-separated (e.g. tcp://127.0.0.1:5555,tcp://127.0.0.1:5556)";
  ps = app.add_subcommand("ps", "one worker of a parameter-server run (bsp, ssp:s, asp, ...): pull, compute, push every step");
  add_role(ps);
  ps->add_option("--rank", role.rank, "this worker's rank in [0, cluster.workers)")->required();
  ps->add_option("--servers", servers, servers_help)->required();
  const char* backups_help = "cluster.replicas = 2: the servers' backups, in shard order, comma-separated (a silent server's shard goes to its backup)";
  ps->add_option("--backups", backups, backups_help);

  allreduce = app.add_subcommand("allreduce", "one rank of the all-reduce mode: compute, all-reduce the gradient, step");
  add_role(allreduce);
  allreduce->add_option("--rank", role.rank, "this rank in [0, cluster.workers)")->required();
  allreduce->add_option("--coordinator", role.coordinator, "rank 0's rendezvous endpoint, e.g. tcp://127.0.0.1:29500 "
                                                           "(rank 0 listens on it)")->required();
  allreduce->add_option("--checkpoint", role.checkpoint, "rank 0 writes θ and the optimizer's state here every "
                                                         "checkpoint.every_s and at the end; with --resume every rank reads it");
  allreduce->add_option("--snapshots", role.snapshots, "rank 0 pushes θ snapshots to the evaluator listening here");
  allreduce->add_option("--host", role.host, "address this rank's Gloo connections listen on (default: cluster.bind)");

  eval = app.add_subcommand("eval", "the evaluator: test loss and accuracy every eval.interval_s, once more at the end");
  add_role(eval);
  auto* eval_servers = eval->add_option("--servers", servers, std::string("PS modes: ") + servers_help);
  auto* eval_snaps = eval->add_option("--snapshots", role.snapshots, "all-reduce mode: listen here for rank 0's θ snapshots");
  eval_servers->excludes(eval_snaps);
  eval->add_option("--backups", backups, backups_help)->needs(eval_servers);

  virt = app.add_subcommand("virtual", "every worker and server of the run in this process, in simulated time "
                                       "(cluster.launcher = \"virtual\"; [virtual] is the cost model)");
  add_config(virt);
  virt->add_option("-o,--out", vopt.out_dir, "run directory (metrics go to <out>/metrics/)")->capture_default_str();
  virt->add_option("--procs-on-host", vopt.procs_on_host, "BLAS threads as for one process among this many (a replay: "
                                                          "the real run's workers')")->capture_default_str();
  virt->add_flag("-q,--quiet", quiet, "no progress lines");

  config = app.add_subcommand("config", "validate a config; write it back with defaults; expand sweeps");
  config->add_option("-c,--config", config_path, "experiment config (TOML)")->check(CLI::ExistingFile);
  config->add_option("--set", overrides, "override a key: section.key=value (repeatable)");
  config->add_option("--write", resolved_out, "write the validated config, every default filled in, to this file");
  config->add_option("--expand", expand_dir, "write one config per sweep point into this directory; print their paths");
  config->add_flag("--keys", list_keys, "list every key with its default and meaning");
  config->add_option("--plan", plan_out, "write the run plan as JSON to this file (\"-\": standard output): mode, "
                                         "data sizes, steps per epoch and in all, the processes of the run");

  keygen = app.add_subcommand("keygen", "write a new run key (a CURVE key pair) to FILE, mode 0600; the launcher "
                                        "makes one per run and hands it to every process (--auth-key)");
  keygen->add_option("FILE", key_path, "where to write it (must not exist)")->required();
}

int Commands::run() {
  if (*train) return run_train();
  if (*ps || *eval || *allreduce) return run_role();
  if (*virt) return run_virtual();
  if (*keygen) return comm::write_run_key(comm::make_run_key(), key_path), 0;
  return run_config();
}

void print_result(const ExperimentConfig& cfg, double result) {
  std::printf("final test %s: %.4f\n", cfg.data.kind == "least-squares" ? "loss" : "accuracy", result);
}

int Commands::run_train() {
  single.progress = !quiet;
  const ExperimentConfig cfg = load_config(config_path, overrides);
  std::filesystem::create_directories(single.out_dir);
  write_file(single.out_dir + "/config.toml", to_toml(cfg));
  print_result(cfg, run_single(cfg, single));
  return 0;
}

int Commands::run_role() {
  const ExperimentConfig cfg = load_config(config_path, overrides);
  role.progress = !quiet;
  say_when_stopped(*eval ? std::string("evaluator") : (*ps ? "worker " : "rank ") + std::to_string(role.rank));
  for (auto [list, into] : {std::pair{&servers, &role.servers}, std::pair{&backups, &role.backups}})
    for (std::size_t lo = 0; lo <= list->size();) {
      const std::size_t hi = std::min(list->find(',', lo), list->size());
      if (hi > lo) into->push_back(list->substr(lo, hi - lo));
      lo = hi + 1;
    }
  if (!role.backups.empty() && role.backups.size() != role.servers.size())
    throw std::invalid_argument("--backups names " + std::to_string(role.backups.size()) + " addresses, --servers " +
                                std::to_string(role.servers.size()) + ": one backup per server, in shard order");
  if (*ps) return run_ps_worker(cfg, role), 0;
  if (*allreduce) return run_allreduce_worker(cfg, role), 0;
  if (role.servers.empty() && role.snapshots.empty())
    throw std::invalid_argument("eval needs --servers (PS modes) or --snapshots (all-reduce mode)");
  print_result(cfg, run_evaluator(cfg, role));
  return 0;
}

int Commands::run_virtual() {
  std::vector<std::string> virtual_overrides = overrides;  // (the config's own launcher would decide overlap as a
  virtual_overrides.push_back("cluster.launcher=\"virtual\"");  // real run's: pushes left during simulated backward)
  const ExperimentConfig cfg = load_config(config_path, virtual_overrides);
  vopt.progress = !quiet;
  say_when_stopped("virtual cluster");
  print_result(cfg, run_virtual_cluster(cfg, vopt));
  return 0;
}

int Commands::run_config() {
  if (list_keys) return std::cout << describe_keys(), 0;
  if (config_path.empty()) throw ConfigError("config: --config is required (except with --keys)");
  if (!expand_dir.empty()) {
    std::ifstream in(config_path);
    std::stringstream text;
    text << in.rdbuf();
    std::vector<std::string> labels;
    const auto points = expand_sweep(text.str(), config_path, labels, overrides);
    std::filesystem::create_directories(expand_dir);
    for (std::size_t i = 0; i < points.size(); ++i) {
      const ExperimentConfig cfg = parse_config(points[i], config_path + " [" + labels[i] + "]");
      char name[32];
      std::snprintf(name, sizeof name, "%03zu.toml", i);
      const std::string path = expand_dir + "/" + name;
      write_file(path, to_toml(cfg));
      std::cout << path << "\t" << (labels[i].empty() ? "-" : labels[i]) << "\n";
    }
    return 0;
  }
  const ExperimentConfig cfg = load_config(config_path, overrides);
  if (!plan_out.empty()) {
    const std::string plan = run_plan(cfg).dump(2) + "\n";
    if (plan_out == "-") std::cout << plan;
    else write_file(plan_out, plan);
  }
  if (!resolved_out.empty()) write_file(resolved_out, to_toml(cfg));
  else if (plan_out.empty()) std::cout << to_toml(cfg);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pslab::use_best_cpu_runtime(argv);  // (may re-execute this program: first)
  CLI::App app{"pslab worker: trains a model alone or as one rank of a distributed run"};
  app.require_subcommand(1);
  Commands commands(app);
  CLI11_PARSE(app, argc, argv);
  try {
    return commands.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pslab_worker: error: %s\n", e.what());
    return 1;
  }
}
