// Single-process training: determinism and convergence on synthetic problems with a known
// optimum (fast, exact), through the same Replica + Optimizer the trainer uses.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <fstream>
#include <thread>

#include "run/config.h"
#include "core/optimizer.h"
#include "core/replica.h"
#include "core/sampler.h"
#include "run/setup.h"
#include "role_context.h"
#include "roles.h"
#include "train_log.h"

using namespace pslab;

namespace {

// θ after `steps` SGD steps of `cfg` on its data, through Replica and Optimizer.
std::vector<float> train_params(const ExperimentConfig& cfg, long steps) {
  auto be = make_cpu_backend(1);
  const DataSplit data = load_data(cfg);
  Replica r(*be, model_spec(cfg), data.train, cfg.train.batch);
  r.model().init(cfg.seed);
  Optimizer opt(*be, cfg.optimizer, r.model().num_params());
  ShardSampler s(std::size_t(data.train.n), 1, 0, cfg.seed);
  const long spe = s.steps_per_epoch(cfg.train.batch);
  for (long k = 0; k < steps; ++k) {
    s.set_epoch(k / spe);
    r.compute_gradient(s.batch(k % spe, cfg.train.batch));
    opt.step(r.model().params(), r.model().grads(), cfg.optimizer.lr);
  }
  std::vector<float> theta(r.model().num_params());
  r.model().store_params(theta.data());
  return theta;
}

ExperimentConfig synthetic(const char* data_kind, const char* model_kind) {
  return parse_config(std::string("name = \"t\"\n[data]\nkind = \"") + data_kind +
                          "\"\ndim = 16\noutputs = 3\ntrain_samples = 1024\ntest_samples = 512\n"
                          "[model]\nkind = \"" + model_kind + "\"\nhidden = [32]\n[train]\nbatch = 32\n",
                      "synthetic");
}

// The replica gathers a step's batch where the data set lives (on the CPU its own arrays) and
// evaluates contiguous slices in place: bitwise what a host gather and the model give, for a
// classification and a regression data set.
TEST(Training, TheReplicaGathersBatchesFromTheDataSetItself) {
  for (const char* kind : {"logistic", "least-squares"}) {
    const ExperimentConfig cfg = synthetic(kind, kind == std::string("logistic") ? "mlp" : "linear");
    auto be = make_cpu_backend(1);
    const DataSplit data = load_data(cfg);
    Replica r(*be, model_spec(cfg), data.train, 100);
    r.model().init(cfg.seed);
    const Dataset& d = data.train;
    const std::vector<std::uint32_t> idx = {5, 900, 5, 17, 1023, 0, 64};
    const double loss = r.compute_gradient(idx);
    const std::vector<float> grad(r.model().grads(), r.model().grads() + r.model().num_params());

    Model m(*be, model_spec(cfg), 100);
    m.init(cfg.seed);
    std::vector<float> x(idx.size() * std::size_t(d.features())), t(idx.size() * std::size_t(d.target_dim));
    std::vector<std::int32_t> y(idx.size());
    gather_batch(d, idx, x.data(), y.data(), t.data());
    EXPECT_EQ(loss, m.forward_backward(x.data(), y.data(), t.data(), int(idx.size()))) << kind;
    EXPECT_EQ(grad, std::vector<float>(m.grads(), m.grads() + m.num_params())) << kind;

    // Evaluation in slices of max_batch (100) over 512 test samples, against one pass.
    const EvalCounts e = r.evaluate(data.test);
    Model whole(*be, model_spec(cfg), data.test.n);
    whole.init(cfg.seed);
    EvalCounts want;
    for (int lo = 0; lo < data.test.n; lo += 100) {
      const int n = std::min(100, data.test.n - lo);
      const EvalCounts c = whole.evaluate(data.test.x.data() + std::size_t(lo) * data.test.features(),
                                          d.classes > 0 ? data.test.labels.data() + lo : nullptr,
                                          d.classes > 0 ? nullptr : data.test.targets.data() + std::size_t(lo) * data.test.target_dim, n);
      want.loss_sum += c.loss_sum, want.correct += c.correct, want.samples += c.samples;
    }
    EXPECT_EQ(e.samples, data.test.n) << kind;
    EXPECT_EQ(e.loss_sum, want.loss_sum) << kind;
    EXPECT_EQ(e.correct, want.correct) << kind;
  }
}

// Batch norm at evaluation: the replica measures the running statistics for the θ it evaluates
// (Replica::measure_statistics), so the evaluator's accuracy depends on θ alone, not on the
// replica's history, and equals a recomputation from the saved θ and statistics.
TEST(Training, AResNetsEvaluationIsARecomputationFromItsThetaAndStatistics) {
  const ExperimentConfig cfg = parse_config(
      "name = \"t\"\n[data]\ntrain_samples = 2048\ntest_samples = 1000\n[model]\nkind = \"resnet\"\ndepth = 8\n"
      "width = 4\n[train]\nbatch = 64\n[optimizer]\nlr = 0.1\n", "resnet");
  const std::vector<float> theta = train_params(cfg, 60);
  auto be = make_cpu_backend(1);
  const DataSplit data = load_data(cfg);
  Replica evaluator(*be, model_spec(cfg), data.train, 256);
  evaluator.model().load_params(theta.data());
  const EvalCounts e = evaluator.evaluate(data.test);
  EXPECT_GT(double(e.correct) / e.samples, 0.25) << "60 steps of a ResNet-8 on Fashion-MNIST (chance: 10%)";
  std::vector<float> stats(evaluator.model().state_floats());
  evaluator.model().store_state(stats.data());

  // Another replica that trained first (its running statistics its own) evaluates the same θ alike.
  Replica other(*be, model_spec(cfg), data.train, 256);
  other.model().init(99);
  for (int k = 0; k < 5; ++k) other.compute_gradient(std::vector<std::uint32_t>{1, 2, 3, 5, 8, 13, 21, 34});
  other.model().load_params(theta.data());
  const EvalCounts o = other.evaluate(data.test);
  EXPECT_EQ(o.loss_sum, e.loss_sum);
  EXPECT_EQ(o.correct, e.correct);

  // The saved θ and statistics in a bare model, evaluated without measuring anything.
  Model saved(*be, model_spec(cfg), 1000);
  saved.load_params(theta.data());
  saved.load_state(stats.data());
  const EvalCounts r = saved.evaluate(data.test.x.data(), data.test.labels.data(), nullptr, data.test.n);
  EXPECT_EQ(r.correct, e.correct);
  EXPECT_NEAR(r.loss_sum, e.loss_sum, 1e-6 * e.loss_sum) << "(batches of 1000 here, 256 in the replica)";
  saved.reset_state();
  EXPECT_NE(saved.evaluate(data.test.x.data(), data.test.labels.data(), nullptr, data.test.n).loss_sum, r.loss_sum)
      << "the statistics made no difference";
}

// Who evaluates a model with batch norm measures its statistics in batches of 256 whatever
// eval.batch: an evaluator of eval.batch = 128 measured them in batches of 128, a single process
// (train.batch 256) in batches of 256, and the same θ scored differently.
TEST(Training, StatisticsAreMeasuredInBatchesOf256WhateverEvalBatch) {
  ExperimentConfig cfg = parse_config("name = \"t\"\n[model]\nkind = \"resnet\"\ndepth = 8\n[eval]\nbatch = 128\n", "r");
  EXPECT_EQ(replica_batch(cfg, RoleKind::evaluator), 256);
  EXPECT_EQ(replica_batch(cfg, RoleKind::single), 256);
  EXPECT_EQ(replica_batch(cfg, RoleKind::ps_worker), 64);  // (a worker evaluates nothing)
  cfg.model.kind = "mlp";  // no statistics: eval.batch as it is
  EXPECT_EQ(replica_batch(cfg, RoleKind::evaluator), 128);
}

TEST(Training, SameSeedGivesBitwiseIdenticalParameters) {
  ExperimentConfig cfg = synthetic("logistic", "mlp");
  cfg.optimizer.kind = "adam";
  cfg.optimizer.lr = 0.01;
  const auto a = train_params(cfg, 100), b = train_params(cfg, 100);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  cfg.seed = 2;
  EXPECT_NE(train_params(cfg, 100), a);
}

TEST(Training, LeastSquaresConvergesToTheKnownOptimum) {
  ExperimentConfig cfg = synthetic("least-squares", "linear");
  LinearTruth truth;
  make_least_squares(1024, 512, 16, 3, cfg.seed, &truth);
  const auto theta = train_params(cfg, 3000);
  // Linear layout: W (16, 3) then b (3), exactly the truth's layout.
  double worst = 0;
  for (std::size_t i = 0; i < truth.w.size(); ++i) worst = std::max(worst, double(std::abs(theta[i] - truth.w[i])));
  for (std::size_t i = 0; i < truth.b.size(); ++i)
    worst = std::max(worst, double(std::abs(theta[truth.w.size() + i] - truth.b[i])));
  EXPECT_LT(worst, 1e-3);
}

TEST(Training, RunSingleLearnsLogisticAndWritesMetrics) {
  const auto dir = std::filesystem::temp_directory_path() / ("pslab_train_" + std::to_string(::getpid()));
  ExperimentConfig cfg = synthetic("logistic", "linear");
  cfg.train.epochs = 5;
  cfg.optimizer.lr = 0.5;
  const double acc = run_single(cfg, SingleRunOptions{dir.string(), 0.0, false});
  EXPECT_GT(acc, 0.9);
  std::ifstream f(dir / "metrics/worker0.jsonl");
  std::string line;
  int train_lines = 0, eval_lines = 0;
  std::vector<nlohmann::json> starts;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("t"));
    if (j["kind"] == "start") starts.push_back(j);
    if (j["kind"] == "train") {
      if (train_lines == 0) {  // the first step began before the first window ended, after the start-up
        ASSERT_EQ(starts.size(), 1u);
        EXPECT_EQ(starts[0]["step"], 0);
        EXPECT_LT(starts[0]["t"].get<double>(), j["t"].get<double>());
        EXPECT_GT(starts[0]["t"].get<double>(), 0.0);
      }
      ++train_lines;
      EXPECT_TRUE(j.contains("samples_per_s"));
    }
    if (j["kind"] == "eval") {
      ++eval_lines;
      EXPECT_TRUE(j.contains("test_acc"));
    }
  }
  EXPECT_EQ(eval_lines, 5);
  EXPECT_GE(train_lines, 5);
  EXPECT_EQ(starts.size(), 1u);
  std::filesystem::remove_all(dir);
}

// A window's loss is the mean over its samples (an empty batch's 0 and a partial batch weighed
// as much as they hold; a window without samples has none), lr the last applied, the first
// window's samples/s counts from the first step (not the start-up before it), and the start line
// is when that step began: its end less compute, comm (which holds wait) and delay.
TEST(Training, TrainLinesWeighLossBySamplesAndCountFromTheFirstStep) {
  const std::string path = ::testing::TempDir() + "pslab_train_log.jsonl";
  {
    MetricsWriter metrics(path, unix_now_s());
    Progress progress("worker 0", false);
    TrainLog log(metrics, progress, 0, 3, 6);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the start-up: data, connections, barrier
    StepRecord r;
    r.loss = 1.0, r.samples = 10, r.compute_s = 0.001, r.comm_s = 0.002, r.wait_s = 0.0015, r.lr = 0.1;
    log.add(0, 0.1, r);
    StepRecord empty;  // an epoch's empty last batch (loss 0), no update applied (lr -1: accumulating)
    log.add(1, 0.1, empty);
    StepRecord partial;
    partial.loss = 4.0, partial.samples = 5;
    log.add(2, 0.15, partial);
    log.add(3, 0.15, empty, /*force=*/true);
  }
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  std::remove(path.c_str());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["kind"], "start");
  EXPECT_NEAR(lines[0]["t"].get<double>(), lines[1]["t"].get<double>() - 0.003, 0.15) << "began at its end less 3 ms";  // (not 0.2 s before)
  EXPECT_DOUBLE_EQ(lines[1]["loss"].get<double>(), 2.0);  // (1 x 10 + 0 + 4 x 5) / 15
  EXPECT_DOUBLE_EQ(lines[1]["lr"].get<double>(), 0.1);
  EXPECT_GT(lines[1]["samples_per_s"].get<double>(), 150.0) << "the start-up counted: 15 samples over 0.2 s";
  EXPECT_TRUE(lines[2]["loss"].is_null()) << lines[2];
  EXPECT_DOUBLE_EQ(lines[2]["lr"].get<double>(), 0.1);
}

TEST(Training, DivergenceIsReportedOnceInTheMetrics) {
  const auto dir = std::filesystem::temp_directory_path() / ("pslab_diverge_" + std::to_string(::getpid()));
  ExperimentConfig cfg = synthetic("logistic", "linear");
  cfg.train.epochs = 2;
  cfg.optimizer.lr = 1e38;  // the logits overflow within a few steps
  run_single(cfg, SingleRunOptions{dir.string(), 0.0, false});
  std::ifstream f(dir / "metrics/worker0.jsonl");
  std::string line;
  std::vector<nlohmann::json> diverged;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "diverged") diverged.push_back(j);
  }
  ASSERT_EQ(diverged.size(), 1u);
  EXPECT_EQ(diverged[0]["worker"], 0);
  EXPECT_GE(diverged[0]["step"].get<long>(), 1);
  EXPECT_GT(diverged[0]["epoch"].get<double>(), 0.0);
  std::filesystem::remove_all(dir);
}

}  // namespace
