// Optimizer steps and learning-rate schedules against hand-computed values.
#include <gtest/gtest.h>

#include <vector>

#include "backend.h"
#include "core/optimizer.h"

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
