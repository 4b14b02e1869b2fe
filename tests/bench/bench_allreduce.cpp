// All-reduce benchmark: W rank processes on this machine, reducing as cluster.transport
// `--transport` makes them (auto and shm: one shared segment; tcp: Gloo over TCP loopback).
//
//   bench_allreduce [--ranks 2] [--runs 5] [--steps 500] [--transport auto] [--overlap [--bucket-kb 256]] [--json FILE]
//
// Metrics (median over runs; each run after a warm-up):
//   allreduce_ms   one all-reduce (sum) of n floats, n = 235146 (the MLP), 1M, 4M
//   train          the MLP 784-256-128-10 on Fashion-MNIST, batch 64 per rank, 1 BLAS thread per
//                  rank, run by the real all-reduce worker (run_allreduce_worker): samples/s of all
//                  ranks together, compute and all-reduce time per step, medians over windows
//                  of --steps steps (--runs windows)
#include <CLI/CLI.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/collective.h"
#include "roles.h"
#include "run/setup.h"
#include "backend.h"

using namespace pslab;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {  // (of an even count: the mean of the middle two)
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}


nlohmann::ordered_json run_rank(int rank, int W, const std::string& ep, const std::string& ep_train, int runs, long steps,
                                const std::string& how, bool overlap, int bucket_kb) {
  const auto transport = comm::make_transport("tcp");
  std::unique_ptr<Coordinator> coord;
  if (rank == 0) coord = std::make_unique<Coordinator>(*transport, ep, W);
  RendezvousClient rv(*transport, ep, rank, W, std::chrono::seconds(60));
  const auto cpu = make_cpu_backend(1);
  auto coll = make_collective(*cpu, rv, "127.0.0.1", how, "auto");
  nlohmann::ordered_json out;
  out["collective"] = coll->describe();

  for (std::size_t n : {std::size_t(235146), std::size_t(1) << 20, std::size_t(4) << 20}) {
    std::vector<float> x(n, 1.0f);
    const long iters = std::max(20L, long((64u << 20) / (n * 4)));
    for (long i = 0; i < iters / 4; ++i) coll->allreduce_sum(x.data(), n, i);
    std::vector<double> ms;
    for (int r = 0; r < runs; ++r) {
      coll->barrier();
      const auto t0 = Clock::now();
      for (long i = 0; i < iters; ++i) coll->allreduce_sum(x.data(), n, i);
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / double(iters));
    }
    out["allreduce_ms"][std::to_string(n)] = {{"median", median(ms)}, {"runs", ms}};
  }

  coll->barrier();
  rv.bye();
  coord.reset();

  // Training: the real all-reduce worker (pslab_worker allreduce), `runs` windows of `steps`
  // steps after a 200-step warm-up window; medians over the windows of its own metrics.
  ExperimentConfig cfg = parse_config("name = \"bench\"\n[cluster]\nmode = \"allreduce\"\n", "bench");
  cfg.cluster.workers = W;
  cfg.cluster.transport = how;
  cfg.cluster.overlap.value = overlap ? AutoBool::on : AutoBool::off;
  cfg.cluster.bucket_kb = bucket_kb;
  cfg.train.threads = 1;
  cfg.train.log_every = int(steps);
  cfg.train.steps = 200 + long(runs) * steps;
  cfg.train.epochs = 1000;
  RoleOptions o;
  o.rank = rank;
  o.coordinator = ep_train;
  o.out_dir = "/tmp/pslab_bench_allreduce_rank" + std::to_string(rank) + "_" + std::to_string(::getpid());
  o.progress = false;
  // The rank's own transport, as pslab_worker makes it from cluster.transport: its name picks the
  // host collective (shm, auto: shared memory; tcp, ipc: Gloo).
  const auto train_transport = comm::make_transport(how);
  o.transport = train_transport.get();
  run_allreduce_worker(cfg, o);
  std::vector<double> rate, compute, comm;
  std::ifstream f(o.out_dir + "/metrics/worker" + std::to_string(rank) + ".jsonl");
  long window_start = 0;  // (a window ends at `steps` steps or at an epoch's end: those that began after the warm-up)
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "train") continue;
    const long began = window_start;
    window_start = j["step"].get<long>();
    if (began < 200) continue;
    rate.push_back(j["samples_per_s"].get<double>() * W);  // every rank runs the same steps
    compute.push_back(j["compute_ms"].get<double>());
    comm.push_back(j["comm_ms"].get<double>());
  }
  std::filesystem::remove_all(o.out_dir);
  out["train"] = {{"samples_per_s", median(rate)}, {"compute_ms", median(compute)}, {"allreduce_ms", median(comm)},
                  {"step_ms", 1e3 * 64 * W / median(rate)}, {"samples_per_s_windows", rate}};
  return out;

}

}  // namespace

int main(int argc, char** argv) {
  pslab::use_best_cpu_runtime(argv);  // (may re-execute this program: first)
  CLI::App app{"pslab all-reduce benchmark (one process per rank on this machine)"};
  int ranks = 2, runs = 5, rank = -1, bucket_kb = 256;
  long steps = 500;
  bool overlap = false;
  std::string json_path, endpoint, endpoint_train, rank_out, how = "auto";
  app.add_option("--ranks", ranks)->capture_default_str();
  app.add_option("--runs", runs)->capture_default_str();
  app.add_option("--steps", steps, "training steps per run")->capture_default_str();
  app.add_option("--json", json_path, "write results here");
  app.add_option("--transport", how, "cluster.transport: auto and shm reduce in shared memory, tcp with Gloo")
      ->check(CLI::IsMember({"auto", "shm", "tcp", "ipc"}))
      ->capture_default_str();
  app.add_flag("--overlap", overlap, "cluster.overlap: buckets all-reduced as backward finishes them");
  app.add_option("--bucket-kb", bucket_kb, "cluster.bucket_kb, with --overlap")->capture_default_str();
  // Internal: the benchmark starts one fresh process per rank (exec, not just fork, so that
  // every rank initialises OpenBLAS and ZeroMQ itself, as pslab_worker does).
  app.add_option("--rank", rank)->group("");
  app.add_option("--endpoint", endpoint)->group("");
  app.add_option("--endpoint-train", endpoint_train)->group("");
  app.add_option("--rank-out", rank_out)->group("");
  CLI11_PARSE(app, argc, argv);

  if (rank >= 0) {
    try {
      const auto r = run_rank(rank, ranks, endpoint, endpoint_train, runs, steps, how, overlap, bucket_kb);
      if (!rank_out.empty()) std::ofstream(rank_out) << r.dump() << "\n";
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      return 1;
    }
  }
  // Addresses only: the collectives' rendezvous over TCP, the training ranks' over `how` (kept
  // alive until the ranks are done: an ipc address's directory is the transport's).
  const auto transport = comm::make_transport("tcp");
  const auto train_transport = comm::make_transport(how);
  const std::string ep = transport->local_address("coordinator");
  const std::string ep_train = train_transport->local_address("coordinator-train");
  const std::string out0 = "/tmp/pslab_bench_allreduce_" + std::to_string(::getpid()) + ".json";
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> args = {"/proc/self/exe", "--rank", std::to_string(r), "--ranks", std::to_string(ranks),
                                     "--runs", std::to_string(runs), "--steps", std::to_string(steps), "--transport", how,
                                     "--endpoint", ep, "--endpoint-train", ep_train, "--rank-out", r == 0 ? out0 : "",
                                     "--bucket-kb", std::to_string(bucket_kb)};
    if (overlap) args.push_back("--overlap");
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::vector<char*> argv2;
      for (auto& a : args) argv2.push_back(a.data());
      argv2.push_back(nullptr);
      ::execv("/proc/self/exe", argv2.data());
      _exit(127);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t c : children) {
    int st = 0;
    ::waitpid(c, &st, 0);
    failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  if (failed) return 1;
  std::ifstream in(out0);
  const auto r0 = nlohmann::ordered_json::parse(in);
  std::remove(out0.c_str());
  nlohmann::ordered_json out{{"benchmark", "allreduce"}, {"ranks", ranks}, {"runs", runs},
                             {"metric", "medians over runs; samples_per_s counts all ranks"}, {"transport", how},
                             {"overlap", overlap}, {"bucket_kb", bucket_kb}};
  for (auto& [k, v] : r0.items()) out[k] = v;
  std::printf("%s\n", out.dump(2).c_str());
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
