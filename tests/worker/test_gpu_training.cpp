// Training on the CUDA backend against the same run on the CPU backend: the parameter-server
// worker (θ and ∇θ staged through Replica over tcp, ipc and shm, with overlap and without) and the all-reduce worker (NCCL).
// θ agrees within 1e-3 * max(1, |θ_cpu|) after 50 steps (the backends' float results differ
// in the last bits per step; see test_gpu_backend.cpp). Skipped without a GPU (tests/support/gpu.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "gpu.h"
#include "harness.h"
#include "core/replica.h"
#include "core/sampler.h"
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

// Every layer of a ResNet (convolutions without bias, batch norm, residual blocks with identity
// and projection shortcuts, average pooling, the head) on the GPU against the CPU: one step's
// loss and ∇θ, the running statistics it leaves, and an evaluation in inference mode.
TEST(GpuResNet, AStepAndAnEvaluationAgreeWithTheCpu) {
  PSLAB_SKIP_WITHOUT_GPU();
  ModelSpec spec;
  spec.kind = "resnet", spec.depth = 14, spec.stage_width = 4;
  spec.channels = 3, spec.height = 12, spec.width = 12, spec.outputs = 5;
  const int B = 16;
  std::vector<float> x(std::size_t(B) * 3 * 12 * 12);
  std::vector<std::int32_t> y(B);
  Rng rng(3);
  for (auto& v : x) v = float(rng.normal());
  for (auto& l : y) l = std::int32_t(rng.below(5));
  std::vector<float> grads[2], state[2];
  double loss[2], eval_loss[2];
  for (int k = 0; k < 2; ++k) {
    const std::unique_ptr<Backend> be = k == 0 ? make_cpu_backend(1) : make_cuda_backend(0);
    Model m(*be, spec, B);
    m.init(7);
    DeviceBuffer<float> bx(*be, x.size());
    DeviceBuffer<std::int32_t> by(*be, y.size());
    be->copy_from_host(bx.data(), x.data(), bx.bytes());
    be->copy_from_host(by.data(), y.data(), by.bytes());
    loss[k] = m.forward_backward(bx.data(), by.data(), nullptr, B);
    grads[k].resize(m.num_params());
    be->copy_to_host(grads[k].data(), m.grads(), grads[k].size() * sizeof(float));
    state[k].resize(m.state_floats());
    m.store_state(state[k].data());
    eval_loss[k] = m.evaluate(bx.data(), by.data(), nullptr, B).loss_sum;
  }
  EXPECT_NEAR(loss[1], loss[0], 1e-4 * std::max(1.0, std::abs(loss[0])));
  EXPECT_TRUE(close(grads[0], grads[1])) << "∇θ";
  EXPECT_TRUE(close(state[0], state[1])) << "running statistics";
  EXPECT_NEAR(eval_loss[1], eval_loss[0], 1e-4 * std::max(1.0, std::abs(eval_loss[0])));
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

// Each transport, and with overlap: ∇θ downloaded on the copy engine as backward finishes it
// (GradStager), θ's reply pieces uploaded as they arrive.
INSTANTIATE_TEST_SUITE_P(Transports, GpuPsTraining,
                         ::testing::Values("tcp", "ipc", "shm", "tcp_overlap", "shm_overlap", "shm_overlap_pieces"),
                         [](const auto& info) { return info.param; });

// Overlap on a GPU changes when ∇θ leaves, not what: one worker (the servers' sums independent
// of arrival order), a model whose ∇θ comes down in several copies (MLP 784-512-512-3, 665K
// parameters, copies of >= 256K floats) and whose shard boundary lies inside the first layer,
// bitwise the θ of the same run without overlap.
TEST(GpuOverlap, AWorkerGivesBitwiseTheParametersOfARunWithout) {
  PSLAB_SKIP_WITHOUT_GPU();
  for (const std::string transport : {"shm", "tcp"}) {
    std::vector<float> theta[2];
    for (const bool overlap : {false, true}) {
      ExperimentConfig cfg = test::small_config("bsp", 1, 2, transport + (overlap ? "_overlap_pieces" : "_pieces"));
      cfg.data.dim = 784;
      cfg.model.hidden = {512, 512};
      cfg.train.steps = 20;
      cfg.cluster.piece_kib = 512;
      theta[overlap] = train_ps(cfg, "cuda");
    }
    EXPECT_TRUE(theta[0] == theta[1]) << transport << ": overlap changed θ";
    EXPECT_TRUE(close(theta[0], theta[1])) << transport;
  }
}

// The step-graph tests' data: 300 random 3x12x12 images of 5 classes.
Dataset step_graph_images(std::uint64_t seed) {
  Dataset d;
  d.n = 300, d.channels = 3, d.height = 12, d.width = 12, d.classes = 5;
  d.x.resize(std::size_t(d.n) * d.features());
  d.labels.resize(std::size_t(d.n));
  Rng rng(seed);
  for (auto& v : d.x) v = float(rng.normal());
  for (auto& l : d.labels) l = std::int32_t(rng.below(5));
  return d;
}

// train.cuda_graphs (core/replica.h): steps whose forward and backward are one recorded CUDA
// graph give bitwise the θ and losses of the same steps run op by op, for an MLP, a CNN on
// augmented images and a ResNet with batch norm (cuDNN where it loads), with an epoch's smaller
// last batch in between (run op by op) and SGD between the steps; the counts say that the second
// step of the full batch was recorded and the later ones of its size replayed.
TEST(GpuStepGraphs, GraphedStepsGiveBitwiseTheOrdinaryOnes) {
  PSLAB_SKIP_WITHOUT_GPU();
  const Dataset d = step_graph_images(11);
  std::vector<int> sizes = {64, 64, 64, 40, 64, 64, 64, 64};
  for (const std::string kind : {"mlp", "cnn", "resnet"}) {
    ModelSpec spec;
    spec.kind = kind, spec.channels = 3, spec.height = 12, spec.width = 12, spec.outputs = 5;
    spec.hidden = {64, 32}, spec.conv_channels = {4, 8}, spec.depth = 8, spec.stage_width = 4;
    std::vector<float> theta[2];
    std::vector<double> losses[2];
    for (const StepGraphs graphs : {StepGraphs::off, StepGraphs::on}) {
      SCOPED_TRACE(kind + (graphs == StepGraphs::on ? ", graphs on" : ", graphs off"));
      const std::unique_ptr<Backend> be = make_cuda_backend(0);
      Replica replica(*be, spec, d, 64);
      replica.model().init(3);
      if (kind == "cnn") replica.augment(5, 2);
      replica.use_step_graphs(graphs);
      std::vector<std::uint32_t> idx(64);
      int at = 0;
      for (std::size_t s = 0; s < sizes.size(); ++s) {
        replica.set_epoch(long(s / 4));
        for (int k = 0; k < sizes[s]; ++k) idx[std::size_t(k)] = std::uint32_t((at + 37 * k) % d.n);
        at += sizes[s];
        losses[graphs == StepGraphs::on].push_back(replica.compute_gradient({idx.data(), std::size_t(sizes[s])}));
        be->axpy(replica.model().num_params(), -0.05f, replica.model().grads(), replica.model().params());
      }
      theta[graphs == StepGraphs::on].resize(replica.model().num_params());
      replica.model().store_params(theta[graphs == StepGraphs::on].data());
      if (graphs == StepGraphs::on) {
        // Steps 2-3 and 5-8 replayed; or, where the smaller batch's cuDNN plan grew the workspace
        // the graph used, step 5 run as usual and recorded again at step 6.
        EXPECT_GE(replica.graphed_steps(), 5);
        EXPECT_EQ(replica.graphed_steps() + replica.recordings(), 7);
      } else {
        EXPECT_EQ(replica.graphed_steps() + replica.recordings(), 0);
      }
    }
    EXPECT_TRUE(losses[0] == losses[1]) << kind << ": the graphs changed a loss";
    EXPECT_TRUE(theta[0] == theta[1]) << kind << ": the graphs changed θ";
    EXPECT_TRUE(close(theta[0], theta[1])) << kind;
  }
}

// The optimizer's update in the step's graph (Replica::train_step, live scalars): momentum and
// Adam at a rate that changes every step give bitwise the θ and losses of the same optimizer run
// op by op (its scalars live too), for an MLP and a ResNet.
TEST(GpuStepGraphs, TheUpdateInTheGraphGivesBitwiseTheStepsWithout) {
  PSLAB_SKIP_WITHOUT_GPU();
  const Dataset d = step_graph_images(12);
  const std::vector<int> sizes = {64, 64, 64, 40, 64, 64, 64, 64};
  for (const std::string kind : {"mlp", "resnet"})
    for (const std::string opt_kind : {"momentum", "adam"}) {
      ModelSpec spec;
      spec.kind = kind, spec.channels = 3, spec.height = 12, spec.width = 12, spec.outputs = 5;
      spec.hidden = {64, 32}, spec.depth = 8, spec.stage_width = 4;
      std::vector<float> theta[2];
      std::vector<double> losses[2];
      for (const StepGraphs graphs : {StepGraphs::off, StepGraphs::on}) {
        SCOPED_TRACE(kind + ", " + opt_kind + (graphs == StepGraphs::on ? ", graphs on" : ", graphs off"));
        const bool on = graphs == StepGraphs::on;
        const std::unique_ptr<Backend> be = make_cuda_backend(0);
        Replica replica(*be, spec, d, 64);
        replica.model().init(3);
        replica.use_step_graphs(graphs);
        OptimizerConfig oc;
        oc.kind = opt_kind, oc.weight_decay = 1e-3;
        Optimizer opt(*be, oc, replica.model().num_params());
        opt.use_live_scalars();
        std::vector<std::uint32_t> idx(64);
        int at = 0;
        for (std::size_t s = 0; s < sizes.size(); ++s) {
          for (int k = 0; k < sizes[s]; ++k) idx[std::size_t(k)] = std::uint32_t((at + 37 * k) % d.n);
          at += sizes[s];
          losses[on].push_back(replica.train_step({idx.data(), std::size_t(sizes[s])}, opt, 0.05 / (1.0 + 0.3 * double(s))));
        }
        theta[on].resize(replica.model().num_params());
        replica.model().store_params(theta[on].data());
        EXPECT_EQ(opt.steps(), 8);
        if (on) {
          EXPECT_GE(replica.graphed_steps(), 5);
        }
      }
      EXPECT_TRUE(losses[0] == losses[1]) << kind << ", " << opt_kind << ": the graphs changed a loss";
      EXPECT_TRUE(theta[0] == theta[1]) << kind << ", " << opt_kind << ": the graphs changed θ";
      EXPECT_TRUE(close(theta[0], theta[1])) << kind << ", " << opt_kind;
    }
}

// A PS worker whose steps are graphs (train.cuda_graphs = "on", a listener hearing ready(0) after
// each replay where overlap is on) gives bitwise the θ of the same run without them.
TEST(GpuStepGraphs, APsWorkerGivesBitwiseTheParametersOfARunWithout) {
  PSLAB_SKIP_WITHOUT_GPU();
  for (const bool overlap : {false, true}) {
    std::vector<float> theta[2];
    for (const bool graphs : {false, true}) {
      ExperimentConfig cfg = test::small_config("bsp", 1, 2, overlap ? "shm_overlap_pieces" : "shm_pieces");
      cfg.data.dim = 784;
      cfg.model.hidden = {512, 512};
      cfg.train.steps = 20;
      cfg.train.cuda_graphs = graphs ? "on" : "off";
      theta[graphs] = train_ps(cfg, "cuda");
    }
    EXPECT_TRUE(theta[0] == theta[1]) << (overlap ? "overlap: " : "") << "the graphs changed θ";
    EXPECT_TRUE(close(theta[0], theta[1]));
  }
}

// A backend that records no graphs: "on" is refused naming the key, "auto" runs op by op.
// A replica that follows its sampler (Replica::follow: each epoch's shard of indices crosses
// once, a step's gathers read a slice of it) trains over three epochs of a rank-1 shard, with
// step graphs and augmented images, to bitwise the θ and losses of one whose batches upload
// their own indices.
TEST(GpuBatchIndices, AFollowedSamplerGivesBitwiseTheStepsOfIndicesUploadedPerBatch) {
  PSLAB_SKIP_WITHOUT_GPU();
  const Dataset d = step_graph_images(13);
  for (const std::string kind : {"mlp", "cnn"}) {
    ModelSpec spec;
    spec.kind = kind, spec.channels = 3, spec.height = 12, spec.width = 12, spec.outputs = 5;
    spec.hidden = {64, 32}, spec.conv_channels = {4, 8};
    std::vector<float> theta[2];
    std::vector<double> losses[2];
    for (const bool follow : {false, true}) {
      const std::unique_ptr<Backend> be = make_cuda_backend(0);
      Replica replica(*be, spec, d, 64);
      replica.model().init(3);
      if (kind == "cnn") replica.augment(5, 2);
      replica.use_step_graphs(StepGraphs::on);
      ShardSampler sampler(std::size_t(d.n), 2, 1, 7);
      if (follow) replica.follow(sampler);
      const long spe = sampler.steps_per_epoch(64);  // 64, 64, 22 samples
      for (long step = 0; step < 3 * spe; ++step) {
        sampler.set_epoch(step / spe);
        replica.set_epoch(step / spe);
        losses[follow].push_back(replica.compute_gradient(sampler.batch(step % spe, 64)));
        be->axpy(replica.model().num_params(), -0.05f, replica.model().grads(), replica.model().params());
      }
      theta[follow].resize(replica.model().num_params());
      replica.model().store_params(theta[follow].data());
    }
    EXPECT_TRUE(losses[0] == losses[1]) << kind << ": following the sampler changed a loss";
    EXPECT_TRUE(theta[0] == theta[1]) << kind << ": following the sampler changed θ";
  }
}

TEST(StepGraphs, TheCpuRefusesOnAndRunsAutoWithout) {
  const std::unique_ptr<Backend> be = make_cpu_backend(1);
  Dataset d;
  d.n = 8, d.width = 4, d.classes = 2;
  d.x.assign(32, 0.5f);
  d.labels.assign(8, 1);
  ModelSpec spec;
  spec.kind = "linear", spec.height = 1, spec.width = 4, spec.outputs = 2;
  Replica replica(*be, spec, d, 4);
  try {
    replica.use_step_graphs(StepGraphs::on);
    FAIL() << "on was taken on the CPU";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("train.cuda_graphs"), std::string::npos) << e.what();
  }
  replica.use_step_graphs(StepGraphs::automatic);
  const std::uint32_t idx[4] = {0, 1, 2, 3};
  for (int s = 0; s < 3; ++s) replica.compute_gradient({idx, 4});
  EXPECT_EQ(replica.graphed_steps(), 0);
}

// Two ranks sharing the GPU, all-reducing through host memory: with overlap (∇θ downloaded as
// backward finishes it, buckets reduced on the host as they land, the sum uploaded once) bitwise
// the θ of the same run without, on both ranks.
TEST(GpuAllReduceTraining, OverlapThroughHostMemoryGivesBitwiseTheParametersWithout) {
  PSLAB_SKIP_WITHOUT_GPU();
  std::vector<std::vector<float>> theta[2];
  for (const bool overlap : {false, true}) {
    ExperimentConfig cfg = test::small_config("allreduce", 2, 1, overlap ? "shm_overlap" : "shm");
    cfg.train.device = "cuda";
    cfg.cluster.collective = "gloo";
    cfg.data.dim = 784;
    cfg.model.hidden = {512, 512};
    cfg.train.steps = 20;
    cfg.cluster.bucket_kb = 256;
    const auto dir = test::temp_dir("gpu_ar_overlap");
    theta[overlap] = test::run_allreduce_workers(cfg, dir);
    std::filesystem::remove_all(dir);
  }
  ASSERT_EQ(theta[1].size(), 2u);
  EXPECT_TRUE(theta[0].at(0) == theta[1].at(0)) << "overlap changed θ";
  EXPECT_TRUE(theta[1].at(0) == theta[1].at(1)) << "the ranks' replicas differ";
}

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
