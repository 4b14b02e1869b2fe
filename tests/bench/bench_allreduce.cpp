// All-reduce benchmark: W rank processes on this machine (Gloo over TCP loopback).
//
//   bench_allreduce [--ranks 2] [--runs 5] [--steps 500] [--json FILE]
//
// Metrics (median over runs; each run after a warm-up):
//   allreduce_ms   one all-reduce (sum) of n floats, n = 235146 (the MLP), 1M, 4M
//   train          the MLP 784-256-128-10, batch 64 per rank, 1 BLAS thread per rank: step time
//                  (compute, all-reduce, optimizer step) and samples/s of all ranks together,
//                  the same loop as `pslab_worker allreduce` (Fashion-MNIST when installed)
#include <CLI/CLI.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "collective.h"
#include "optimizer.h"
#include "replica.h"
#include "sampler.h"
#include "setup.h"

using namespace pslab;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int free_port() {
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::router);
  s.bind("tcp://127.0.0.1:*");
  const std::string ep = s.get(zmq::sockopt::last_endpoint);
  return std::stoi(ep.substr(ep.rfind(':') + 1));
}

nlohmann::ordered_json run_rank(int rank, int W, const std::string& ep, int runs, long steps) {
  zmq::context_t ctx(1);
  std::unique_ptr<Coordinator> coord;
  if (rank == 0) coord = std::make_unique<Coordinator>(ctx, ep, W);
  RendezvousClient rv(ctx, ep, rank, W, std::chrono::seconds(60));
  auto coll = make_gloo_collective(rv, "127.0.0.1");
  nlohmann::ordered_json out;

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

  ExperimentConfig cfg = parse_config("name = \"bench\"\n", "bench");
  DataSplit data;
  try {
    data = load_data(cfg);
  } catch (const DataError&) {
    data.train.n = 60000, data.train.height = 28, data.train.width = 28, data.train.classes = 10;
    data.train.x.assign(std::size_t(60000) * 784, 0.5f);
    data.train.labels.assign(60000, 1);
  }
  auto be = make_cpu_backend(1);
  Replica replica(*be, model_spec(cfg), data.train, 64);
  Model& model = replica.model();
  model.init(1);
  const std::size_t P = model.num_params();
  Optimizer opt(*be, cfg.optimizer, P);
  ShardSampler sampler(std::size_t(data.train.n), W, rank, 1);
  const long spe = sampler.steps_per_epoch(64);
  long global = 0;
  double compute_s = 0, comm_s = 0;
  auto step = [&] {
    sampler.set_epoch(global / spe);
    const long s = global % spe;
    const auto t0 = Clock::now();
    replica.compute_gradient(sampler.batch(s, 64), 1.0f / float(sampler.global_batch_size(s, 64)));
    const auto t1 = Clock::now();
    coll->allreduce_sum(model.grads(), P, global);
    const auto t2 = Clock::now();
    opt.step(model.params(), model.grads(), 0.1);
    compute_s += std::chrono::duration<double>(t1 - t0).count() + std::chrono::duration<double>(Clock::now() - t2).count();
    comm_s += std::chrono::duration<double>(t2 - t1).count();
    ++global;
  };
  for (int i = 0; i < 100; ++i) step();
  std::vector<double> rate, step_ms, comp_ms, ar_ms;
  for (int r = 0; r < runs; ++r) {
    coll->barrier();
    compute_s = comm_s = 0;
    const auto t0 = Clock::now();
    for (long i = 0; i < steps; ++i) step();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    rate.push_back(double(W) * 64 * double(steps) / s);
    step_ms.push_back(1e3 * s / double(steps));
    comp_ms.push_back(1e3 * compute_s / double(steps));
    ar_ms.push_back(1e3 * comm_s / double(steps));
  }
  out["train"] = {{"samples_per_s", median(rate)}, {"step_ms", median(step_ms)}, {"compute_ms", median(comp_ms)},
                  {"allreduce_ms", median(ar_ms)}, {"samples_per_s_runs", rate}};
  coll->barrier();
  rv.bye();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pslab all-reduce benchmark (Gloo over TCP loopback, one process per rank)"};
  int ranks = 2, runs = 5;
  long steps = 500;
  std::string json_path;
  app.add_option("--ranks", ranks)->capture_default_str();
  app.add_option("--runs", runs)->capture_default_str();
  app.add_option("--steps", steps, "training steps per run")->capture_default_str();
  app.add_option("--json", json_path, "write results here");
  CLI11_PARSE(app, argc, argv);

  const std::string ep = "tcp://127.0.0.1:" + std::to_string(free_port());
  std::vector<pid_t> children;
  for (int r = 1; r < ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        run_rank(r, ranks, ep, runs, steps);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 1;
      }
      _exit(code);
    }
    children.push_back(pid);
  }
  nlohmann::ordered_json r0 = run_rank(0, ranks, ep, runs, steps);
  int failed = 0;
  for (pid_t c : children) {
    int st = 0;
    ::waitpid(c, &st, 0);
    failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  nlohmann::ordered_json out{{"benchmark", "allreduce"}, {"ranks", ranks}, {"runs", runs},
                             {"metric", "medians over runs; samples_per_s counts all ranks"},
                             {"collective", "gloo allreduce (tcp, 127.0.0.1)"}};
  for (auto& [k, v] : r0.items()) out[k] = v;
  std::printf("%s\n", out.dump(2).c_str());
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return failed ? 1 : 0;
}
