// Optimizer steps and learning-rate schedules against hand-computed values.
#include <gtest/gtest.h>

#include <vector>

#include "backend.h"
#include "core/optimizer.h"
#include "recording_backend.h"

using namespace pslab;

namespace {

// Runs `grads.size()` steps of `cfg` from w = 1 on a one-parameter problem; returns w after each.
std::vector<float> trajectory(const OptimizerConfig& cfg, const std::vector<float>& grads, double lr) {
  auto be = make_cpu_backend(1);
  Optimizer opt(*be, cfg, 1);
  float w = 1.0f;
  std::vector<float> out;
  for (float g : grads) {
    opt.step(&w, &g, lr);
    out.push_back(w);
  }
  return out;
}

OptimizerConfig kind(const char* k, double wd = 0.0) {
  OptimizerConfig c;
  c.kind = k;
  c.weight_decay = wd;
  return c;
}

TEST(Optimizer, Sgd) {
  EXPECT_FLOAT_EQ(trajectory(kind("sgd"), {0.5f}, 0.1)[0], 0.95f);             // 1 - 0.1*0.5
  EXPECT_FLOAT_EQ(trajectory(kind("sgd", 0.01), {0.5f}, 0.1)[0], 0.949f);      // 1 - 0.1*(0.5+0.01)
}

TEST(Optimizer, HeavyBallMomentum) {
  // v1 = 0.5, w1 = 0.95; v2 = 0.9*0.5 + 0.5 = 0.95, w2 = 0.95 - 0.095 = 0.855
  const auto w = trajectory(kind("momentum"), {0.5f, 0.5f}, 0.1);
  EXPECT_FLOAT_EQ(w[0], 0.95f);
  EXPECT_FLOAT_EQ(w[1], 0.855f);
}

TEST(Optimizer, Nesterov) {
  // v1 = 0.5, w1 = 1 - 0.1*(0.5 + 0.9*0.5) = 0.905; v2 = 0.95, w2 = 0.905 - 0.1*(0.5 + 0.855) = 0.7695
  const auto w = trajectory(kind("nesterov"), {0.5f, 0.5f}, 0.1);
  EXPECT_FLOAT_EQ(w[0], 0.905f);
  EXPECT_FLOAT_EQ(w[1], 0.7695f);
}

TEST(Optimizer, AdamWithBiasCorrection) {
  // Step 1: m = 0.05, v = 2.5e-4, mhat = 0.5, vhat = 0.25 -> w = 1 - 0.1 = 0.9.
  // Step 2 (g = -1): m = -0.055, v = 1.24975e-3, mhat = -0.2894737, vhat = 0.6251876
  //   -> w = 0.9 + 0.1 * 0.2894737 / 0.7906883 = 0.9366104.
  const auto w = trajectory(kind("adam"), {0.5f, -1.0f}, 0.1);
  EXPECT_NEAR(w[0], 0.9f, 1e-6);
  EXPECT_NEAR(w[1], 0.9366104f, 1e-6);
}

TEST(Optimizer, StateIsPerParameterAndLengthsAreRespected) {
  auto be = make_cpu_backend(1);
  Optimizer opt(*be, kind("momentum"), 3);
  std::vector<float> w = {1, 1, 1, 7}, g = {1, 0, -1, 100};  // w[3] lies outside the range
  opt.step(w.data(), g.data(), 0.5);
  EXPECT_EQ(w, (std::vector<float>{0.5f, 1.0f, 1.5f, 7.0f}));
  EXPECT_EQ(opt.steps(), 1);
}

TEST(Optimizer, RejectsUnknownKindNamingTheField) {
  auto be = make_cpu_backend(1);
  try {
    Optimizer opt(*be, kind("rmsprop"), 1);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.kind"), std::string::npos);
  }
}

TEST(Schedule, ConstantWarmupStepCosineAndScaling) {
  ScheduleConfig s;
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.1, 64, 3.7), 0.1);

  s.warmup_epochs = 2.0;  // from 0 to lr over two epochs
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.1, 64, 0.5), 0.025);
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.1, 64, 2.0), 0.1);
  s.warmup_start_factor = 0.5;
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.1, 64, 1.0), 0.075);

  ScheduleConfig step;
  step.kind = "step";
  step.milestones = {3, 6};
  EXPECT_DOUBLE_EQ(learning_rate(step, 0.1, 64, 2.9), 0.1);
  EXPECT_NEAR(learning_rate(step, 0.1, 64, 4.0), 0.01, 1e-15);
  EXPECT_NEAR(learning_rate(step, 0.1, 64, 7.0), 0.001, 1e-15);

  ScheduleConfig cos;
  cos.kind = "cosine";
  cos.total_epochs = 10;
  EXPECT_DOUBLE_EQ(learning_rate(cos, 0.1, 64, 0.0), 0.1);
  EXPECT_NEAR(learning_rate(cos, 0.1, 64, 5.0), 0.05, 1e-15);
  EXPECT_NEAR(learning_rate(cos, 0.1, 64, 10.0), 0.0, 1e-15);
  cos.warmup_epochs = 1, cos.min_lr_factor = 0.1;  // decay over epochs 1..10 to 0.01
  EXPECT_NEAR(learning_rate(cos, 0.1, 64, 5.5), 0.1 * (0.1 + 0.9 * 0.5), 1e-15);

  ScheduleConfig scaled;  // Goyal et al.: lr x (global batch / base batch)
  scaled.scale_lr = true;
  scaled.base_batch = 64;
  EXPECT_DOUBLE_EQ(learning_rate(scaled, 0.1, 256, 1.0), 0.4);
}

}  // namespace

namespace {

// Two steps of a layer-wise optimizer on w = {3, 4 | 2} (layers of 2 and 1 floats) with the
// same gradient each time; returns w after each step.
std::vector<std::vector<float>> layer_wise(const OptimizerConfig& cfg, std::vector<float> w, const std::vector<float>& g,
                                           double lr, int steps) {
  auto be = make_cpu_backend(1);
  Optimizer opt(*be, cfg, 3, {2, 1});
  std::vector<std::vector<float>> out;
  for (int s = 0; s < steps; ++s) {
    opt.step(w.data(), g.data(), lr);
    out.push_back(w);
  }
  return out;
}

}  // namespace

// LARS (You et al. 2017): t = η |w| / (|g| + wd |w|) per layer; v = μ v + t (g + wd w); w -= lr v.
TEST(Optimizer, LarsScalesEachLayersStepByItsTrustRatio) {
  OptimizerConfig c = kind("lars", 0.1);
  c.trust = 0.01;
  const auto w = layer_wise(c, {3, 4, 2}, {0.6f, 0.8f, 0.5f}, 2.0, 2);
  // step 1, layer 0: |w| = 5, |g| = 1, t = 0.05 / 1.5; v = t (0.9, 1.2) = (0.03, 0.04) -> (2.94, 3.92)
  //         layer 1: |w| = 2, |g| = 0.5, t = 0.02 / 0.7; v = t 0.7 = 0.02 -> 1.96
  EXPECT_NEAR(w[0][0], 2.94f, 1e-6);
  EXPECT_NEAR(w[0][1], 3.92f, 1e-6);
  EXPECT_NEAR(w[0][2], 1.96f, 1e-6);
  // step 2, layer 0: |w| = 4.9, t = 0.049 / 1.49; t (0.894, 1.192) = (0.0294, 0.0392);
  //   v = (0.027 + 0.0294, 0.036 + 0.0392) -> (2.8272, 3.7696)
  //         layer 1: t (0.5 + 0.196) = 0.0196, v = 0.018 + 0.0196 = 0.0376 -> 1.8848
  EXPECT_NEAR(w[1][0], 2.8272f, 1e-6);
  EXPECT_NEAR(w[1][1], 3.7696f, 1e-6);
  EXPECT_NEAR(w[1][2], 1.8848f, 1e-6);
}

// LAMB (You et al. 2019): r = m̂ / (√v̂ + ε) + wd w; t = |w| / |r| per layer (1 for a zero layer);
// w -= lr t r.
TEST(Optimizer, LambScalesEachLayersAdamStepByItsTrustRatio) {
  const auto w = layer_wise(kind("lamb", 0.1), {3, 4, 0}, {0.6f, -0.8f, 0.5f}, 0.5, 1);
  // m̂ = g, v̂ = g² on the first step: r = sign(g) + 0.1 w = (1.3, -0.6 | 1)
  // layer 0: |w| = 5, |r| = √2.05, t = 3.4921514: (3 - 0.5 t 1.3, 4 + 0.5 t 0.6)
  // layer 1: |w| = 0, t = 1: 0 - 0.5
  EXPECT_NEAR(w[0][0], 0.7301016f, 1e-5);
  EXPECT_NEAR(w[0][1], 5.0476454f, 1e-5);
  EXPECT_NEAR(w[0][2], -0.5f, 1e-6);
}

// A server applies an update in pieces (chunks, threads): the same as one step, for pieces that
// cut layers anywhere.
TEST(Optimizer, ALayerWiseStepInPiecesIsTheWholeStep) {
  auto be = make_cpu_backend(1);
  for (const char* k : {"lars", "lamb"}) {
    const std::vector<float> w0 = {0.3f, -1.2f, 0.7f, 2.0f, -0.4f, 0.9f, 1.1f};
    const std::vector<float> g = {0.1f, 0.5f, -0.3f, 0.2f, 0.05f, -0.6f, 0.4f};
    Optimizer whole(*be, kind(k, 0.01), 7, {3, 4}), pieces(*be, kind(k, 0.01), 7, {3, 4});
    std::vector<float> a = w0, b(7);
    for (int s = 0; s < 3; ++s) {
      whole.step(a.data(), g.data(), 0.5);
      const std::vector<float> cur = s == 0 ? w0 : b;
      pieces.begin_step();
      pieces.prepare(cur.data(), g.data());
      for (auto [lo, hi] : {std::pair<std::size_t, std::size_t>{0, 2}, {2, 5}, {5, 7}})
        pieces.step_range(cur.data() + lo, g.data() + lo, b.data() + lo, lo, hi - lo, 0.5);
      EXPECT_EQ(a, b) << k << " step " << s;
    }
    EXPECT_EQ(whole.trust_ratios().size(), 2u);
    EXPECT_NE(whole.trust_ratios()[0], whole.trust_ratios()[1]);
  }
}

TEST(Optimizer, LayersThatDoNotAddUpToTheRangeAreRefused) {
  auto be = make_cpu_backend(1);
  EXPECT_THROW(Optimizer(*be, kind("lars"), 5, {2, 2}), std::invalid_argument);
}

// Live scalars (a step graph's, Optimizer::use_live_scalars): a schedule's changing rate and
// Adam's bias corrections reach the update through device memory. The same steps as written
// ones: bitwise for the programs, sgd's axpy (which a program replaces) within rounding; a
// constant rate is written once, Adam's scalars every step. Layer-wise kinds cannot record.
TEST(Optimizer, LiveScalarsGiveTheStepsOfWrittenOnes) {
  auto be = make_cpu_backend(1);
  for (const auto& [k, wd] : std::vector<std::pair<const char*, double>>{
           {"sgd", 0.0}, {"sgd", 0.01}, {"momentum", 0.01}, {"nesterov", 0.0}, {"adam", 0.01}}) {
    SCOPED_TRACE(std::string(k) + ", weight decay " + std::to_string(wd));
    std::vector<float> w0 = {0.3f, -1.2f, 0.7f, 2.0f, -0.4f}, g = {0.1f, 0.5f, -0.3f, 0.2f, 0.05f};
    Optimizer written(*be, kind(k, wd), 5), live(*be, kind(k, wd), 5);
    ASSERT_TRUE(live.records());
    live.use_live_scalars();
    std::vector<float> a = w0, b = w0;
    for (int s = 0; s < 4; ++s) {
      const double lr = 0.1 * (1.0 + s);  // a rate that changes every step
      written.step(a.data(), g.data(), lr);
      live.step(b.data(), g.data(), lr);
      g[std::size_t(s)] *= -2.0f;
    }
    EXPECT_EQ(live.steps(), 4);
    if (std::string(k) == "sgd" && wd == 0.0) {
      for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6f) << i;
    } else {
      EXPECT_EQ(a, b);
    }
    EXPECT_THROW(live.step_range(b.data(), g.data(), b.data(), 0, 5, 0.1), std::logic_error);
  }
  for (const char* k : {"lars", "lamb"}) {
    Optimizer o(*be, kind(k), 5);
    EXPECT_FALSE(o.records());
    EXPECT_THROW(o.use_live_scalars(), std::logic_error) << k;
  }
}


TEST(Optimizer, AConstantRateIsWrittenOnceAndAdamsScalarsEveryStep) {
  for (const auto& [k, writes] : std::vector<std::pair<const char*, long>>{{"momentum", 1}, {"adam", 5}}) {
    test::RecordingBackend be;  // (counts write_scalars)
    Optimizer o(be, kind(k), 3);
    o.use_live_scalars();
    std::vector<float> w = {1.0f, 2.0f, 3.0f}, g = {0.5f, -0.5f, 0.25f};
    for (int s = 0; s < 5; ++s) o.step(w.data(), g.data(), 0.1);
    EXPECT_EQ(be.scalar_writes(), writes) << k;
  }
}
