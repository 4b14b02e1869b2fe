// The push guard (server/push_guard.h): its rules alone, then a server taking pushes from a
// worker that holds the run's key but sends NaN, noise or an absurd batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <tuple>
#include <vector>

#include "expect.h"
#include "harness.h"
#include "ps/client.h"
#include "push_guard.h"
#include "run/config.h"
#include "run/config.h"
#include "run/setup.h"
#include "server.h"

using namespace pslab;
using test::TwoWorkerRun;
using test::expect_refused;

namespace {

TEST(PushGuard, ASmallBatchGetsAWiderNormBound) {
  // cluster.guard_norm_factor (4) as it is from a batch of 32; sqrt(32 / batch) times it below:
  // one unusual sample weighs more in a small batch, and honest norms spike more.
  ExperimentConfig cfg;
  for (auto [batch, accumulate, factor] : {std::tuple{64, 1, 4.0}, {32, 1, 4.0}, {8, 1, 8.0}, {8, 4, 4.0}, {2, 1, 16.0}}) {
    cfg.train.batch = batch;
    cfg.train.accumulate = accumulate;
    EXPECT_DOUBLE_EQ(PushGuard::options_for(cfg).norm_factor, factor) << "batch " << batch << " x " << accumulate;
  }
  cfg.cluster.guard_norm_factor = 0;
  EXPECT_EQ(PushGuard::options_for(cfg).norm_factor, 0.0) << "0: no norm bound, at any batch";
}

TEST(PushGuard, RefusesABatchBeyondThePlanAValueNotFiniteAndAnOutsizedNorm) {
  PushGuard g(PushGuard::Options{64, 10.0, 3}, 2);
  EXPECT_EQ(g.check_batch(64), "");
  EXPECT_EQ(g.check_batch(0), "");
  EXPECT_EQ(g.check_batch(65), "a batch of 65 samples (this run's pushes hold 0 to 64)");
  EXPECT_NE(g.check_batch(-1), "");
  const float nan[] = {0.0f, 1.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_EQ(g.check_values(0, nan, 3, 100, true), "a value that is not finite (nan at float 102 of the shard)");
  const float inf[] = {std::numeric_limits<float>::infinity()};
  EXPECT_NE(g.check_values(0, inf, 1, 0, true), "");
  const float fine[] = {0.5f};
  EXPECT_EQ(g.check_values(0, fine, 1, 0, true), "");
  g.accepted(0);  // worker 0's latest push is fine again
  // No norm bound before 16 accepted pushes; then 10 x their median.
  const float big[] = {30.0f, 40.0f};  // norm 50
  const float one[] = {0.6f, 0.8f};    // norm 1
  EXPECT_EQ(g.check_values(1, big, 2, 0, true), "");
  g.accepted(1);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(g.check_values(1, one, 2, 0, true), "");
    g.accepted(1);
  }
  const float six[] = {6.0f}, nine[] = {9.0f};
  EXPECT_EQ(g.check_values(1, six, 1, 0, true), "") << "6 is within 10 x the median norm (1)";
  EXPECT_EQ(g.check_values(1, nine, 1, 1, false), "a norm of 10.82, over 10 (10 x the median of the last accepted "
                                                  "pushes; cluster.guard_norm_factor)")
      << "the norm accumulates over the push's pieces: |(6, 9)| = 10.8";
  EXPECT_NE(g.check_values(1, big, 2, 0, true), "");
  EXPECT_TRUE(!g.refused(1) && !g.refused(1) && g.refused(1)) << "the third refusal in a row drops";
  EXPECT_EQ(g.refusals(1), 3);
  EXPECT_EQ(g.stats()["refused"]["1"], 3);
}

// The values' pass in wide vectors (64 float lanes, with a tail): the norm it finds, a value
// that is not finite in the lanes or in the tail, and float lanes that overflow (redone in double).
TEST(PushGuard, TheNormOfALongPushIsItsOwnInTheLanesTheTailAndPastFloatRange) {
  PushGuard g(PushGuard::Options{64, 10.0, 0}, 2);  // (worker 1, never refused: the guard does not stand aside)
  const float one[] = {0.6f, 0.8f};  // norm 1: the bound becomes 10
  for (int i = 0; i < 16; ++i) {
    ASSERT_EQ(g.check_values(0, one, 2, 0, true), "");
    g.accepted(0);
  }
  std::vector<float> v(1000);  // 15 rounds of 64 lanes and a tail of 40
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = (i % 3 == 0 ? -0.25f : 0.5f);
  // Σ v² = 334 x 0.0625 + 666 x 0.25 = 187.375: norm 13.69
  EXPECT_EQ(g.check_values(0, v.data(), v.size(), 0, true),
            "a norm of 13.69, over 10 (10 x the median of the last accepted pushes; cluster.guard_norm_factor)");
  std::fill(v.begin(), v.end(), 0.01f);  // Σ = 0.1: within the bound
  EXPECT_EQ(g.check_values(0, v.data(), v.size(), 0, true), "");
  v[700] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(g.check_values(0, v.data(), v.size(), 5, true), "a value that is not finite (nan at float 705 of the shard)");
  v[700] = 0.01f, v[990] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(g.check_values(0, v.data(), v.size(), 0, true), "a value that is not finite (-inf at float 990 of the shard)");
  std::fill(v.begin(), v.end(), 1e20f);  // each square past float's range; the norm is 1e20 x sqrt(1000)
  EXPECT_EQ(g.check_values(0, v.data(), v.size(), 0, true),
            "a norm of 3.162e+21, over 10 (10 x the median of the last accepted pushes; cluster.guard_norm_factor)");
}

// Every worker's latest push refused for its values: the run diverges (too high a learning
// rate), no insider does; the guard stands aside, and the run diverges as it would without it.
TEST(PushGuard, StandsAsideWhenEveryWorkersPushIsRefused) {
  PushGuard g(PushGuard::Options{64, 10.0, 3}, 3);
  const float nan[] = {std::numeric_limits<float>::quiet_NaN()}, fine[] = {0.5f};
  EXPECT_NE(g.check_values(0, nan, 1, 0, true), "");
  EXPECT_EQ(g.check_values(1, fine, 1, 0, true), "");
  g.accepted(1);
  EXPECT_NE(g.check_values(1, nan, 1, 0, true), "");
  g.forget(2);  // worker 2 left the run: it does not count
  EXPECT_EQ(g.check_values(0, nan, 1, 0, true), "") << "every worker still in the run pushes NaN: divergence";
  EXPECT_TRUE(g.stood_aside());
  EXPECT_EQ(g.check_values(1, nan, 1, 0, true), "");
}

// A worker dropped as silent and taken back counts again: without it the guard took one bad
// worker for a diverging run and stood aside for good.
TEST(PushGuard, AWorkerTakenBackCountsAgain) {
  PushGuard g(PushGuard::Options{64, 10.0, 3}, 2);
  const float nan[] = {std::numeric_limits<float>::quiet_NaN()};
  g.forget(0);
  g.readmit(0);
  EXPECT_NE(g.check_values(1, nan, 1, 0, true), "") << "worker 0 is back and pushes nothing bad: worker 1 alone is";
  EXPECT_FALSE(g.stood_aside());
}

// Two workers (test::TwoWorkerRun, asp); worker 1 holds the key and pushes what no honest
// worker would. Each bad push is refused, counted, and changes θ exactly as an empty batch
// does; worker 1 keeps training (its clock moves on) until it is refused guard_drop_after
// times in a row, then it is dropped naming why, and told so.

// Worker 0's honest pushes (20: enough for the norm bound), then worker 1's `bad` pushes
// (batch, values) for clocks 0, 1, 2; returns θ pulled at the end.
std::vector<float> train_with(const ExperimentConfig& cfg, int bad_batch, float bad_value, bool noise, TwoWorkerRun& run) {
  auto& [cluster, P, w0, w1] = run;
  std::vector<float> theta(P), grad(P);
  w0->pull(0, theta.data());
  w1->pull(0, theta.data());
  for (long c = 0; c < 20; ++c) {
    for (std::size_t i = 0; i < P; ++i) grad[i] = 0.01f * std::sin(float(i + 7 * c));
    w0->push(c, cfg.train.batch, grad.data(), theta.data());
  }
  for (long c = 0; c < 3; ++c) {
    for (std::size_t i = 0; i < P; ++i) grad[i] = noise ? ((i + c) % 2 ? bad_value : -bad_value) : bad_value;
    w1->push(c, bad_batch, grad.data(), theta.data());
  }
  w0->pull(20, theta.data());
  return theta;
}

TEST(PushGuardRun, BadPushesAreRefusedCountedAndChangeThetaAsAnEmptyBatch) {
  ExperimentConfig cfg = test::small_config("asp", 2, 2);
  cfg.cluster.guard_drop_after = 4;
  std::vector<float> reference;
  {  // worker 1 pushes empty batches
    TwoWorkerRun run(cfg);
    reference = train_with(cfg, 0, 0.0f, false, run);
    for (const auto& s : run.cluster.servers) EXPECT_EQ(s->guard()->total_refused(), 0);
    run.cluster.stop = true;
    run.cluster.join();
  }
  struct Bad { const char* what; int batch; float value; bool noise; };
  for (const Bad bad : {Bad{"nan", 8, std::numeric_limits<float>::quiet_NaN(), false}, Bad{"noise", 8, 0.5f, true},
                        Bad{"absurd batch", std::numeric_limits<int>::max(), 0.001f, false}}) {
    SCOPED_TRACE(bad.what);
    TwoWorkerRun run(cfg);
    const std::vector<float> theta = train_with(cfg, bad.batch, bad.value, bad.noise, run);
    EXPECT_EQ(std::memcmp(theta.data(), reference.data(), theta.size() * sizeof(float)), 0)
        << "worker 1's refused pushes changed θ otherwise than empty batches";
    for (const auto& s : run.cluster.servers) {
      EXPECT_EQ(s->guard()->refusals(1), 3);
      EXPECT_EQ(s->guard()->refusals(0), 0) << "an honest push was refused";
      EXPECT_EQ(s->workers_lost().size(), 0u);
    }
    run.cluster.stop = true;
    run.cluster.join();
  }
}

// A push in pieces whose last piece holds a NaN, with plain SGD: its first pieces were applied
// (streamed, and their reply pieces sent) before the guard saw the NaN; nothing of it stays,
// and the worker takes the reply that starts again from piece 0.
TEST(PushGuardRun, ABadLastPieceOfAStreamedPushLeavesNoTrace) {
  ExperimentConfig cfg = test::small_config("asp", 2, 1, "tcp_pieces");
  cfg.optimizer.kind = "sgd";
  std::vector<float> after[2];
  for (const bool bad : {false, true}) {
    TwoWorkerRun run(cfg);
    auto& [cluster, P, w0, w1] = run;
    ASSERT_GT(cluster.servers[0]->state().pieces(), 2u);
    std::vector<float> theta(P), grad(P, 0.01f);
    w0->pull(0, theta.data());
    w1->pull(0, theta.data());
    w0->push(0, cfg.train.batch, grad.data(), theta.data());
    if (bad) grad[P - 1] = std::numeric_limits<float>::quiet_NaN();
    const PullResult r = w1->push(0, bad ? cfg.train.batch : 0, bad ? grad.data() : std::vector<float>(P, 0.0f).data(),
                                  theta.data());
    EXPECT_TRUE(std::all_of(theta.begin(), theta.end(), [](float x) { return std::isfinite(x); }));
    after[bad] = theta;
    EXPECT_EQ(cluster.servers[0]->guard()->refusals(1), bad ? 1 : 0);
    EXPECT_EQ(r.min_version, cluster.servers[0]->state().version());
    cluster.stop = true;
    cluster.join();
  }
  EXPECT_EQ(std::memcmp(after[0].data(), after[1].data(), after[0].size() * sizeof(float)), 0);
}

TEST(PushGuardRun, AWorkerRefusedTooOftenInARowIsDroppedAndToldWhy) {
  ExperimentConfig cfg = test::small_config("asp", 2, 1);
  cfg.cluster.guard_drop_after = 3;
  TwoWorkerRun run(cfg);
  auto& [cluster, P, w0, w1] = run;
  std::vector<float> theta(P), nan(P, std::numeric_limits<float>::quiet_NaN()), grad(P, 0.01f);
  w0->pull(0, theta.data());
  w1->pull(0, theta.data());
  w1->push(0, cfg.train.batch, nan.data(), theta.data());
  w1->push(1, cfg.train.batch, grad.data(), theta.data());  // an honest push ends the streak
  w1->push(2, cfg.train.batch, nan.data(), theta.data());
  w1->push(3, cfg.train.batch, nan.data(), theta.data());
  expect_refused([&] { w1->push(4, cfg.train.batch, nan.data(), theta.data()); },
                 "worker 1 was dropped from this run: refused 3 pushes in a row by the push guard (a value that is not finite",
                 "the third refusal in a row did not drop worker 1");
  const auto lost = cluster.servers[0]->workers_lost();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0]["worker"], 1);
  EXPECT_EQ(lost[0]["refused"], 4);
  w0->push(0, cfg.train.batch, grad.data(), theta.data());  // worker 0 trains on
  w0->bye(1);
  cluster.join();
  cluster.rethrow();
}

// Where the run cannot go on without the worker (bsp; cluster.on_worker_loss = "fail"), the
// guard does not drop it: its pushes go on being refused as empty batches, and the others train
// on. The server ended the run instead ("bsp cannot train on without it").
TEST(PushGuardRun, AWorkerTheRunCannotLoseIsRefusedOnNotDropped) {
  ExperimentConfig cfg = test::small_config("bsp", 2, 1);
  cfg.cluster.guard_drop_after = 3;
  TwoWorkerRun run(cfg);
  auto& [cluster, P, w0, w1] = run;
  std::vector<float> theta0(P), theta1(P), nan(P, std::numeric_limits<float>::quiet_NaN()), grad(P, 0.01f);
  std::thread honest([&] {
    w0->pull(0, theta0.data());
    for (long c = 0; c < 5; ++c) w0->push(c, cfg.train.batch, grad.data(), theta0.data());
    w0->bye(5);
  });
  w1->pull(0, theta1.data());
  for (long c = 0; c < 5; ++c) w1->push(c, cfg.train.batch, nan.data(), theta1.data());
  w1->bye(5);
  honest.join();
  cluster.join();
  cluster.rethrow();
  EXPECT_EQ(cluster.servers[0]->guard()->refusals(1), 5);
  EXPECT_TRUE(cluster.servers[0]->workers_lost().empty());
  EXPECT_EQ(cluster.servers[0]->state().version(), 5);
  EXPECT_TRUE(std::all_of(theta1.begin(), theta1.end(), [](float x) { return std::isfinite(x); }));
}

}  // namespace
