// Step graphs in Replica (train.cuda_graphs, core/replica.h) on a CPU backend that records as a
// GPU's does (tests/support/recording_backend.h): a graphed step gives bitwise the ordinary
// step's loss and gradient; the second step of a shape is recorded and the later ones replayed,
// an epoch's smaller batch runs as usual; a stale graph is dropped and recorded again; a step that cannot be
// recorded falls back under "auto" (said once) and is an error under "on"; a listener hears
// ready(0) after a replay, and "auto" leaves a listened step over 4 MiB to overlap.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/replica.h"
#include "recording_backend.h"

using namespace pslab;

namespace {

Dataset images(int n) {
  Dataset d;
  d.n = n, d.channels = 3, d.height = 8, d.width = 8, d.classes = 5;
  d.x.resize(std::size_t(n) * d.features());
  d.labels.resize(std::size_t(n));
  Rng rng(11);
  for (auto& v : d.x) v = float(rng.normal());
  for (auto& l : d.labels) l = std::int32_t(rng.below(5));
  return d;
}

ModelSpec spec_of(const std::string& kind) {
  ModelSpec s;
  s.kind = kind, s.channels = 3, s.height = 8, s.width = 8, s.outputs = 5;
  s.hidden = {32, 16}, s.conv_channels = {4, 8}, s.depth = 8, s.stage_width = 4;
  return s;
}

// What a run of steps of these batch sizes leaves: each step's loss, then θ (SGD between steps).
struct Trained {
  std::vector<double> losses;
  std::vector<float> theta;
  long recordings = 0, graphed = 0;
};

Trained train(test::RecordingBackend& be, const ModelSpec& spec, const Dataset& d, StepGraphs graphs,
              const std::vector<int>& sizes, bool augment = false, long move_buffers_at = -1) {
  Replica replica(be, spec, d, 16);
  replica.model().init(3);
  if (augment) replica.augment(5, 2);
  replica.use_step_graphs(graphs);
  Trained t;
  std::vector<std::uint32_t> idx(16);
  int at = 0;
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    if (long(s) == move_buffers_at) be.move_buffers();
    replica.set_epoch(long(s / 4));
    for (int k = 0; k < sizes[s]; ++k) idx[std::size_t(k)] = std::uint32_t((at + 7 * k) % d.n);
    at += sizes[s];
    t.losses.push_back(replica.compute_gradient({idx.data(), std::size_t(sizes[s])}));
    be.axpy(replica.model().num_params(), -0.05f, replica.model().grads(), replica.model().params());
  }
  t.theta.resize(replica.model().num_params());
  replica.model().store_params(t.theta.data());
  t.recordings = replica.recordings(), t.graphed = replica.graphed_steps();
  return t;
}

const std::vector<int> kSizes = {16, 16, 16, 10, 16, 16, 16, 16};  // an epoch's smaller batch 4th

}  // namespace

TEST(StepGraphs, GraphedStepsGiveBitwiseTheOrdinaryOnes) {
  const Dataset d = images(100);
  for (const std::string kind : {"mlp", "cnn", "resnet"}) {
    SCOPED_TRACE(kind);
    test::RecordingBackend off_be, on_be;
    const Trained off = train(off_be, spec_of(kind), d, StepGraphs::off, kSizes, kind == "cnn");
    const Trained on = train(on_be, spec_of(kind), d, StepGraphs::on, kSizes, kind == "cnn");
    EXPECT_EQ(off.recordings, 0);
    EXPECT_EQ(on.recordings, 1) << "the second step of the full batch, once";
    EXPECT_EQ(on.graphed, 6) << "steps 2-3 and 5-8: the first of a shape and the smaller batch run as usual";
    EXPECT_EQ(on_be.replays(), 6);
    EXPECT_TRUE(on.losses == off.losses);
    EXPECT_TRUE(on.theta == off.theta) << "the graphs changed θ";
  }
}

TEST(StepGraphs, AGraphWhoseBuffersMovedIsRecordedAgain) {
  const Dataset d = images(100);
  test::RecordingBackend off_be, on_be;
  const Trained off = train(off_be, spec_of("mlp"), d, StepGraphs::off, kSizes);
  const Trained on = train(on_be, spec_of("mlp"), d, StepGraphs::on, kSizes, false, /*move_buffers_at*/ 5);
  EXPECT_EQ(on.recordings, 2);
  EXPECT_EQ(on.graphed, 5) << "steps 2-3 and 5, then (the 6th refused, run as usual) 7-8";
  EXPECT_TRUE(on.theta == off.theta);
}

TEST(StepGraphs, AStepThatCannotBeRecordedRunsWithoutUnderAutoAndFailsUnderOn) {
  const Dataset d = images(100);
  test::RecordingBackend off_be, auto_be;
  auto_be.refuse_while_recording("relu_forward");
  const Trained off = train(off_be, spec_of("mlp"), d, StepGraphs::off, kSizes);
  testing::internal::CaptureStderr();
  const Trained fell_back = train(auto_be, spec_of("mlp"), d, StepGraphs::automatic, kSizes);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(fell_back.graphed, 0);
  EXPECT_TRUE(fell_back.theta == off.theta) << "the step cut short by the refusal ran as usual";
  EXPECT_NE(said.find("steps run without CUDA graphs"), std::string::npos) << said;
  EXPECT_NE(said.find("relu_forward"), std::string::npos) << said;
  EXPECT_EQ(said.find("steps run without", said.find("steps run without") + 1), std::string::npos) << "said once: " << said;

  test::RecordingBackend on_be;
  on_be.refuse_while_recording("relu_forward");
  try {
    train(on_be, spec_of("mlp"), d, StepGraphs::on, kSizes);
    FAIL() << "a step that cannot be recorded went on under \"on\"";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("train.cuda_graphs = \"on\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("relu_forward"), std::string::npos) << e.what();
  }
}

namespace {
struct Ears final : GradListener {
  std::vector<std::size_t> heard;
  void ready(std::size_t lo) override { heard.push_back(lo); }
};
}  // namespace

TEST(StepGraphs, AListenerHearsTheWholeGradientAfterAReplayAndAutoLeavesALargeOneToOverlap) {
  const Dataset d = images(100);
  std::vector<std::uint32_t> idx(16);
  for (int k = 0; k < 16; ++k) idx[std::size_t(k)] = std::uint32_t(k);
  for (const bool large : {false, true}) {
    ModelSpec spec = spec_of("mlp");
    if (large) spec.hidden = {8192, 16};  // 192 x 8192 + ...: over 4 MiB of ∇θ
    test::RecordingBackend be;
    Replica replica(be, spec, d, 16);
    ASSERT_EQ(replica.model().num_params() * sizeof(float) > Replica::kGraphsBeforeOverlapBytes, large);
    replica.use_step_graphs(StepGraphs::automatic);
    Ears ears;
    replica.compute_gradient({idx.data(), 16}, -1.0f, &ears);
    const std::size_t ordinary = ears.heard.size();  // what a step run as usual says (its last: 0)
    ASSERT_GE(ordinary, 2u);
    for (int s = 0; s < 2; ++s) replica.compute_gradient({idx.data(), 16}, -1.0f, &ears);
    EXPECT_EQ(replica.graphed_steps(), large ? 0 : 2) << (large ? "large" : "small");
    if (large) {
      EXPECT_EQ(ears.heard.size(), 3 * ordinary) << "every step heard as it went";
    } else {
      ASSERT_EQ(ears.heard.size(), ordinary + 2) << "a replayed step says ready once";
      EXPECT_EQ(ears.heard[ordinary], 0u);
      EXPECT_EQ(ears.heard[ordinary + 1], 0u);
    }
  }
}

// ---- the optimizer's update in the step's graph (Replica::train_step) ----------------------

namespace {
// The same run as train(), each step a train_step() with `cfg`'s optimizer at a rate that
// changes every step (or a constant one); live: the optimizer's scalars live from the start
// even without graphs (what a graphed run's optimizer uses).
struct Updated : Trained {
  long optimizer_steps = 0;
  bool live = false;
};
Updated train_updating(test::RecordingBackend& be, const ModelSpec& spec, const Dataset& d, StepGraphs graphs,
                       const OptimizerConfig& cfg, bool live, bool constant_lr = false) {
  Replica replica(be, spec, d, 16);
  replica.model().init(3);
  replica.use_step_graphs(graphs);
  Optimizer opt(be, cfg, replica.model().num_params());
  if (live) opt.use_live_scalars();
  Updated t;
  std::vector<std::uint32_t> idx(16);
  int at = 0;
  for (std::size_t s = 0; s < kSizes.size(); ++s) {
    for (int k = 0; k < kSizes[s]; ++k) idx[std::size_t(k)] = std::uint32_t((at + 7 * k) % d.n);
    at += kSizes[s];
    const double lr = constant_lr ? 0.05 : 0.05 / (1.0 + 0.3 * double(s));
    t.losses.push_back(replica.train_step({idx.data(), std::size_t(kSizes[s])}, opt, lr));
  }
  t.theta.resize(replica.model().num_params());
  replica.model().store_params(t.theta.data());
  t.recordings = replica.recordings(), t.graphed = replica.graphed_steps();
  t.optimizer_steps = opt.steps(), t.live = opt.live_scalars();
  return t;
}

OptimizerConfig optimizer(const char* kind, double wd) {
  OptimizerConfig c;
  c.kind = kind, c.weight_decay = wd;
  return c;
}
}  // namespace

// The update recorded with forward and backward replays with each step's rate (and Adam's
// bias corrections): bitwise the steps of the same optimizer run without graphs.
TEST(StepGraphs, TheUpdateInTheGraphReadsEachStepsScalars) {
  const Dataset d = images(100);
  for (const auto& [kind, wd] : std::vector<std::pair<const char*, double>>{
           {"sgd", 0.0}, {"sgd", 1e-3}, {"momentum", 1e-3}, {"nesterov", 0.0}, {"adam", 1e-3}}) {
    for (const std::string model : {"mlp", "cnn"}) {
      SCOPED_TRACE(std::string(kind) + ", weight decay " + std::to_string(wd) + ", " + model);
      test::RecordingBackend off_be, on_be;
      const Updated off = train_updating(off_be, spec_of(model), d, StepGraphs::off, optimizer(kind, wd), /*live*/ true);
      const Updated on = train_updating(on_be, spec_of(model), d, StepGraphs::on, optimizer(kind, wd), /*live*/ false);
      EXPECT_TRUE(on.live) << "train_step gave the optimizer live scalars";
      EXPECT_EQ(on.recordings, 1);
      EXPECT_EQ(on.graphed, 6);
      EXPECT_EQ(on.optimizer_steps, 8);
      EXPECT_EQ(on_be.scalar_writes(), 8) << "a rate that changes every step is written every step";
      EXPECT_TRUE(on.losses == off.losses);
      EXPECT_TRUE(on.theta == off.theta) << "the update in the graph used a rate other than its step's";
    }
  }
}

// Against the same optimizer with written scalars (no graphs, the CPU's way): bitwise but for
// sgd without weight decay, whose written update is the BLAS's axpy (within rounding); a
// constant rate is written once.
TEST(StepGraphs, TheUpdateInTheGraphGivesTheStepsOfAnOptimizerWithoutGraphs) {
  const Dataset d = images(100);
  for (const auto& [kind, wd] : std::vector<std::pair<const char*, double>>{{"sgd", 0.0}, {"momentum", 0.0}, {"adam", 0.0}}) {
    SCOPED_TRACE(kind);
    test::RecordingBackend off_be, on_be;
    const Updated off = train_updating(off_be, spec_of("mlp"), d, StepGraphs::off, optimizer(kind, wd), false, true);
    const Updated on = train_updating(on_be, spec_of("mlp"), d, StepGraphs::on, optimizer(kind, wd), false, true);
    EXPECT_FALSE(off.live);
    EXPECT_EQ(off_be.scalar_writes(), 0);
    EXPECT_EQ(on_be.scalar_writes(), std::string(kind) == "adam" ? 8 : 1) << "a constant rate written once";
    ASSERT_EQ(on.theta.size(), off.theta.size());
    if (std::string(kind) == "sgd") {
      for (std::size_t i = 0; i < on.theta.size(); ++i) ASSERT_NEAR(on.theta[i], off.theta[i], 1e-5f) << i;
    } else {
      EXPECT_TRUE(on.theta == off.theta);
    }
  }
}

// lars and lamb read norms back on the host: their update runs after the step's graph.
TEST(StepGraphs, ALayerWiseUpdateRunsAfterTheGraph) {
  const Dataset d = images(100);
  for (const char* kind : {"lars", "lamb"}) {
    SCOPED_TRACE(kind);
    test::RecordingBackend off_be, on_be;
    const Updated off = train_updating(off_be, spec_of("mlp"), d, StepGraphs::off, optimizer(kind, 1e-3), false);
    const Updated on = train_updating(on_be, spec_of("mlp"), d, StepGraphs::on, optimizer(kind, 1e-3), false);
    EXPECT_FALSE(on.live);
    EXPECT_EQ(on.graphed, 6) << "forward and backward still as graphs";
    EXPECT_EQ(on.optimizer_steps, 8);
    EXPECT_TRUE(on.theta == off.theta);
  }
}
