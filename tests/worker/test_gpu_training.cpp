// Training on the CUDA backend against the same run on the CPU backend: the parameter-server
// worker (θ and ∇θ staged through Replica over tcp and ipc) and the all-reduce worker (NCCL).
// θ agrees within 1e-3 * max(1, |θ_cpu|) after 50 steps (the backends' float results differ
// in the last bits per step; see test_gpu_backend.cpp). Skipped without a GPU (tests/support/gpu.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "gpu.h"
#include "harness.h"
#include "run/setup.h"

using namespace pslab;

namespace {

::testing::AssertionResult close(const std::vector<float>& cpu, const std::vector<float>& gpu) {
  if (cpu.size() != gpu.size()) return ::testing::AssertionFailure() << cpu.size() << " vs " << gpu.size() << " parameters";
  long wrong = 0;
  std::size_t worst = 0;
  double worst_err = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double err = std::abs(double(gpu[i]) - cpu[i]) / std::max(1.0, std::abs(double(cpu[i])));
    wrong += err > 1e-3;
    if (err > worst_err) worst_err = err, worst = i;
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " of " << cpu.size() << " parameters off; worst θ[" << worst
                                       << "]: cpu " << cpu[worst] << ", gpu " << gpu[worst];
}

std::vector<float> train_ps(ExperimentConfig cfg, const std::string& device) {
  cfg.train.device = device;
  const auto dir = test::temp_dir("gpu_ps");
  test::Cluster cluster(cfg);
  test::run_ps_workers(cfg, cluster, dir);
  cluster.join();
  cluster.rethrow();
  std::filesystem::remove_all(dir);
  return cluster.params();
}

class GpuPsTraining : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuPsTraining, BspOnCudaMatchesCpu) {
  PSLAB_SKIP_WITHOUT_GPU();
  const ExperimentConfig cfg = test::small_config("bsp", 2, 2, GetParam());
  const std::vector<float> cpu = train_ps(cfg, "cpu"), gpu = train_ps(cfg, "cuda");
  EXPECT_TRUE(close(cpu, gpu));
  EXPECT_NE(cpu, initial_params(model_spec(cfg), cfg.seed));
}

TEST_P(GpuPsTraining, AspOnCudaLosesNoPush) {
  PSLAB_SKIP_WITHOUT_GPU();
  ExperimentConfig cfg = test::small_config("asp", 3, 2, GetParam());
  cfg.train.device = "cuda";
  test::Cluster cluster(cfg);
  const auto dir = test::temp_dir("gpu_asp");
  test::run_ps_workers(cfg, cluster, dir);
  cluster.join();
  cluster.rethrow();
  for (const auto& s : cluster.servers) EXPECT_EQ(s->state().version(), 3L * cfg.train.steps);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Transports, GpuPsTraining, ::testing::ValuesIn(test::exact_transports()),
                         [](const auto& info) { return info.param; });

TEST(GpuAllReduceTraining, OneRankOnNcclMatchesGloo) {
  PSLAB_SKIP_WITHOUT_GPU();
  ExperimentConfig cfg = test::small_config("allreduce", 1, 1);
  const auto dir = test::temp_dir("gpu_ar");
  cfg.train.device = "cpu";
  const auto cpu = test::run_allreduce_workers(cfg, dir);
  cfg.train.device = "cuda";
  const auto gpu = test::run_allreduce_workers(cfg, dir);
  EXPECT_TRUE(close(cpu.at(0), gpu.at(0)));
  std::filesystem::remove_all(dir);
}

}  // namespace
