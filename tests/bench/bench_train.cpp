// Training throughput of one replica: samples/s of forward + backward + optimizer step,
// batch gathering included, evaluation excluded. Writes JSON.
//
//   bench_train [--model mlp] [--device cpu|cuda] [--batch 64] [--threads N] [--steps 2000]
//               [--runs 5] [--warmup 200] [--conv onednn|im2col] [--cuda-graphs auto|on|off] [--json FILE]
//
// Metric: samples processed / wall time of `steps` consecutive steps, after `warmup` warm-up
// steps; median over `runs` repetitions. Data: Fashion-MNIST when installed, else random
// inputs of the same shape (the arithmetic is the same).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/optimizer.h"
#include "core/replica.h"
#include "core/sampler.h"
#include "run/setup.h"
#include "backend.h"

using namespace pslab;

// Fashion-MNIST where installed, else random inputs of its shape.
DataSplit bench_data(const ExperimentConfig& cfg) {
  DataSplit data;
  try {
    data = load_data(cfg);
  } catch (const DataError&) {
    data.train.n = 60000, data.train.height = 28, data.train.width = 28, data.train.classes = 10;
    data.train.x.resize(std::size_t(60000) * 784);
    data.train.labels.resize(60000);
    Rng rng(1);
    for (auto& v : data.train.x) v = float(rng.normal());
    for (auto& l : data.train.labels) l = std::int32_t(rng.below(10));
  }
  return data;
}

// --profile: the step's passes timed apart over `reps` steps (Replica::profile_step), a table on
// stderr beside the step's time at the median rate (step_ms), and as JSON.
nlohmann::ordered_json profile_passes(Replica& replica, std::span<const std::uint32_t> idx, Optimizer& opt, int reps,
                                      double step_ms) {
  nlohmann::ordered_json passes = nlohmann::ordered_json::array();
  double sum = 0.0;
  std::fprintf(stderr, "%-48s %12s %12s\n", "pass", "forward ms", "backward ms");
  for (const auto& p : replica.profile_step(idx, opt, 0.01, reps)) {
    std::fprintf(stderr, "%-48s %12.4f %12.4f\n", p.pass.c_str(), p.forward_ms, p.backward_ms);
    passes.push_back({{"pass", p.pass}, {"forward_ms", p.forward_ms}, {"backward_ms", p.backward_ms}});
    sum += p.forward_ms + p.backward_ms;
  }
  std::fprintf(stderr, "%-48s %12.4f   (a step at the median rate: %.4f ms)\n", "sum", sum, step_ms);
  return passes;
}

int bench(int argc, char** argv) {
  CLI::App app{"pslab training-throughput benchmark"};
  std::string model = "mlp", json_path, device = "cpu", conv = "onednn", graphs = "auto";
  int batch = 64, threads = 2, runs = 5, depth = 20, max_batch = 0, profile = 0;
  long steps = 2000, warmup = 200;
  bool tf32 = false;
  app.add_option("--model", model)->capture_default_str();
  app.add_option("--device", device)->capture_default_str();
  app.add_option("--depth", depth, "resnet: its depth (6n + 2)")->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--threads", threads, "OpenBLAS threads")->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--runs", runs)->capture_default_str();
  app.add_option("--warmup", warmup, "steps before the timed runs")->capture_default_str();
  app.add_option("--max-batch", max_batch);
  app.add_option("--json", json_path, "write results here");
  app.add_option("--conv", conv, "cpu: convolutions on oneDNN (where built with it) or by im2col and OpenBLAS")
      ->check(CLI::IsMember({"onednn", "im2col"}))
      ->capture_default_str();
  app.add_flag("--tf32", tf32, "cuda: GEMMs may use TF32 tensor cores (train.tf32)");
  app.add_option("--cuda-graphs", graphs, "cuda: each step's forward, backward and optimizer step as one CUDA graph (train.cuda_graphs)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--profile", profile,
                 "after the runs, time the gather, each layer's forward and backward pass, the loss and the update apart "
                 "(synchronized around each), averaged over this many steps; JSON \"passes\"")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  ExperimentConfig cfg;
  cfg.model.kind = model;
  cfg.model.depth = depth;
  cfg.train.batch = batch;
  const DataSplit data = bench_data(cfg);
  auto be = device == "cuda" ? make_backend(Device::cuda, threads)
                             : make_cpu_backend(threads, conv == "im2col" ? CpuConvolutions::im2col : CpuConvolutions::onednn);
  be->allow_tf32(tf32);
  Replica replica(*be, model_spec(cfg), data.train, std::max(batch, max_batch));
  replica.model().init(1);
  replica.use_step_graphs(step_graphs_from(graphs));
  Optimizer opt(*be, cfg.optimizer, replica.model().num_params());
  ShardSampler sampler(std::size_t(data.train.n), 1, 0, 1);
  const long spe = sampler.steps_per_epoch(batch);
  replica.follow(sampler);

  long global = 0;
  auto run_steps = [&](long n) {
    for (long i = 0; i < n; ++i, ++global) {
      sampler.set_epoch(global / spe);
      auto idx = sampler.batch(global % spe, batch);
      if (int(idx.size()) < batch) { sampler.set_epoch(global / spe + 1); idx = sampler.batch(0, batch); }
      replica.train_step(idx, opt, 0.01);
    }
    be->synchronize();
  };
  run_steps(warmup);
  std::vector<double> rates;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run_steps(steps);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(double(steps) * batch / s);
    std::fprintf(stderr, "run %d: %.0f samples/s\n", r, rates.back());
  }
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  nlohmann::ordered_json j{{"benchmark", "train_throughput"}, {"model", replica.model().describe()},
                           {"backend", be->describe()}, {"batch", batch}, {"threads", threads},
                           {"steps_per_run", steps}, {"warmup_steps", warmup}, {"runs", runs}, {"cuda_graphs", graphs},
                           {"graphed_steps", replica.graphed_steps()}, {"samples_per_s", rates},
                           {"median_samples_per_s", sorted[sorted.size() / 2]}};
  if (profile > 0) {
    Optimizer fresh(*be, cfg.optimizer, replica.model().num_params());  // (opt may step by live scalars now)
    sampler.set_epoch(0);
    j["passes"] = profile_passes(replica, sampler.batch(0, batch), fresh, profile, 1e3 * batch / sorted[sorted.size() / 2]);
  }
  std::printf("%s\n", j.dump(2).c_str());
  if (!json_path.empty()) std::ofstream(json_path) << j.dump(2) << "\n";
  return 0;
}

int main(int argc, char** argv) {
  pslab::use_best_cpu_runtime(argv);  // (may re-execute this program: first)
  try {
    return bench(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train: error: %s\n", e.what());
    return 1;
  }
}
