// The evaluator (worker/evaluator.cpp) beside servers and PS-mode workers in one process
// (threads over one transport): when it ends, and the step it reports.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "run/config.h"

using namespace pslab;
namespace fs = std::filesystem;
using test::Cluster;
using test::temp_dir;

namespace {

// Defect: with eval.interval_s longer than the rest of the run, the evaluator slept until its
// next tick before it saw that training was over, and the run (its servers too) waited with it.
// Now it watches for the end every 20 ms between θs.
TEST(Evaluator, AnIntervalLongerThanTheRunDoesNotHoldUpItsEnd) {
  const fs::path dir = temp_dir("eval_interval");
  ExperimentConfig cfg = test::small_config("asp", 2, 2);
  cfg.eval.interval_s = 600;
  Cluster cluster(cfg, /*record_pulls=*/false, /*wait_for_shutdown=*/true);
  std::atomic<bool> evaluator_done{false};
  std::thread evaluator = test::start_evaluator(cfg, cluster, dir, &evaluator_done);
  test::run_ps_workers(cfg, cluster, dir);
  // Generous against 600 s: the end must be seen at the next poll, not at the next tick.
  for (int i = 0; i < 600 && !evaluator_done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(evaluator_done) << "the evaluator still waits 60 s after the workers finished";
  evaluator.join();
  cluster.join();
  cluster.rethrow();
  std::ifstream f(dir / "metrics" / "evaluator.jsonl");
  std::vector<nlohmann::json> evals;
  for (std::string line; std::getline(f, line);) evals.push_back(nlohmann::json::parse(line));
  ASSERT_GE(evals.size(), 1u);
  ASSERT_LE(evals.size(), 2u) << "at most one evaluation at the start, and the final one";
  EXPECT_EQ(evals.back()["final"], true);
  EXPECT_EQ(evals.back()["step"], cfg.train.steps);
  fs::remove_all(dir);
}

// eval.interval_s while the workers start (or stall): θ that no update changed since the last
// one taken is not taken again (the same θ0 was evaluated at every tick of a slow start).
TEST(Evaluator, ThetaUnchangedSinceTheLastTakenIsNotTakenAgain) {
  const fs::path dir = temp_dir("eval_unchanged");
  ExperimentConfig cfg = test::small_config("asp", 2, 2);
  cfg.eval.interval_s = 0.05;
  Cluster cluster(cfg, /*record_pulls=*/false, /*wait_for_shutdown=*/true);
  std::thread evaluator = test::start_evaluator(cfg, cluster, dir);
  for (int i = 0; i < 300 && !(fs::exists(dir / "metrics" / "evaluator.jsonl") &&
                               fs::file_size(dir / "metrics" / "evaluator.jsonl") > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // (its θ0: a busy machine starts it late)
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // then ten ticks before any worker comes
  test::run_ps_workers(cfg, cluster, dir);
  evaluator.join();
  cluster.join();
  cluster.rethrow();
  std::ifstream f(dir / "metrics" / "evaluator.jsonl");
  int at_start = 0;
  for (std::string line; std::getline(f, line);) at_start += nlohmann::json::parse(line)["epoch"] == 0.0;
  EXPECT_EQ(at_start, 1) << "θ0 evaluated at every tick before the workers came";
  fs::remove_all(dir);
}

// Defect: in PS modes the evaluator reported the smallest shard version as "step" (under asp
// with W workers that is W x the steps), in all-reduce the ranks' step. Now "step" means the
// steps every worker has completed, in every mode; the versions are reported as such.
TEST(Evaluator, ItsStepIsTheWorkersStepsInEveryMode) {
  const fs::path dir = temp_dir("eval_step");
  ExperimentConfig cfg = test::small_config("asp", 2, 2);
  cfg.eval.interval_s = 0.05;
  Cluster cluster(cfg, /*record_pulls=*/false, /*wait_for_shutdown=*/true);
  std::thread evaluator = test::start_evaluator(cfg, cluster, dir);
  test::run_ps_workers(cfg, cluster, dir);
  evaluator.join();
  cluster.join();
  cluster.rethrow();
  std::ifstream f(dir / "metrics" / "evaluator.jsonl");
  std::string line, last;
  while (std::getline(f, line)) last = line;
  const auto j = nlohmann::json::parse(last);
  EXPECT_EQ(j["final"], true) << last;
  EXPECT_EQ(j["step"], cfg.train.steps) << last;
  EXPECT_EQ(j["versions"], (nlohmann::json{2 * cfg.train.steps, 2 * cfg.train.steps})) << last;
  fs::remove_all(dir);
}

}  // namespace
