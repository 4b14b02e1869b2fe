// Workers in the parameter-server modes (worker/), against real servers in one process (threads
// over one transport): each consistency mode checked exactly against a single-process reference,
// on every transport (tcp, ipc, shm; with and without overlap; auto mixing shm and TCP).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "comm/half.h"
#include "core/optimizer.h"
#include "core/replica.h"
#include "core/sampler.h"
#include "harness.h"
#include "roles/local_worker.h"
#include "ps/client.h"
#include "roles.h"
#include "run/config.h"
#include "run/setup.h"
#include "server.h"
#include "straggler.h"

using namespace pslab;
namespace fs = std::filesystem;
using test::Cluster;
using test::run_threads;
using test::temp_dir;

namespace {

// ---- bsp == single-process SGD on the union of the workers' batches ----

struct BspCase {
  int workers, servers;
};
class BspEqualsUnionBatch : public ::testing::TestWithParam<std::tuple<BspCase, std::string>> {};

// One process, one optimizer (the model's layers for layer-wise kinds), batch = the union of the
// W workers' batches of each step: what bsp over servers must equal.
std::vector<float> union_batch_reference(const ExperimentConfig& cfg) {
  const int W = cfg.cluster.workers;
  auto be = make_cpu_backend(1);
  const DataSplit data = load_data(cfg);
  const int b = cfg.train.batch;
  Replica ref(*be, model_spec(cfg), data.train, W * b);
  ref.model().init(cfg.seed);
  const std::size_t P = ref.model().num_params();
  Optimizer opt(*be, cfg.optimizer, P, layer_sizes(model_spec(cfg), 0, P));
  std::vector<ShardSampler> samplers;
  for (int r = 0; r < W; ++r) samplers.emplace_back(std::size_t(data.train.n), W, r, cfg.seed);
  const long spe = samplers[0].steps_per_epoch(b);
  long samples = 0;
  std::vector<std::uint32_t> batch;
  for (long step = 0; step < cfg.train.steps; ++step) {
    batch.clear();
    for (auto& s : samplers) {
      s.set_epoch(step / spe);
      const auto part = s.batch(step % spe, b);
      batch.insert(batch.end(), part.begin(), part.end());
    }
    ref.compute_gradient(batch);
    opt.step(ref.model().params(), ref.model().grads(),
             learning_rate(schedule_for_run(cfg, spe), cfg.optimizer.lr, W * b, double(samples) / data.train.n));
    samples += long(batch.size());
  }
  std::vector<float> single(P);
  ref.model().store_params(single.data());
  return single;
}

// bsp over servers, then its θ against union_batch_reference: equal within 1e-5 relative.
void expect_bsp_equals_union_batch(const ExperimentConfig& cfg) {
  const fs::path dir = temp_dir("bsp");
  Cluster cluster(cfg);
  test::run_ps_workers(cfg, cluster, dir);
  cluster.join();
  cluster.rethrow();
  const std::vector<float> ps = cluster.params();
  const std::vector<float> single = union_batch_reference(cfg);
  ASSERT_EQ(ps.size(), single.size());
  double scale = 0, worst = 0;
  long wrong = 0;
  for (std::size_t i = 0; i < ps.size(); ++i) scale = std::max(scale, double(std::abs(single[i])));
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const double d = std::abs(double(ps[i]) - single[i]);
    worst = std::max(worst, d);
    wrong += d > 1e-5 * std::max(double(std::abs(single[i])), 0.1 * scale);  // relative, floored at 10% of max|θ|
  }
  EXPECT_EQ(wrong, 0) << "worst abs difference " << worst << ", largest |θ| " << scale;
  EXPECT_NE(ps, initial_params(model_spec(cfg), cfg.seed)) << "training moved θ";
  for (const auto& s : cluster.servers) EXPECT_EQ(s->state().version(), cfg.train.steps);
  fs::remove_all(dir);
}

TEST_P(BspEqualsUnionBatch, ParametersWithin1e5RelativeAfter50Steps) {
  const auto [W, S] = std::get<0>(GetParam());
  expect_bsp_equals_union_batch(test::small_config("bsp", W, S, std::get<1>(GetParam())));
}

// The layer-wise optimizers take a trust ratio per layer: servers hold whole layers, so that
// bsp over two servers is the one process's update (a shard boundary through the first layer
// gave each half a ratio of its own).
TEST(BspEqualsUnionBatchLayerWise, LarsAndLambOverTwoServers) {
  for (const char* kind : {"lars", "lamb"}) {
    SCOPED_TRACE(kind);
    ExperimentConfig cfg = test::small_config("bsp", 2, 2);
    cfg.optimizer.kind = kind;
    cfg.optimizer.trust = 0.02;
    cfg.optimizer.lr = std::string(kind) == "lamb" ? 0.01 : 0.1;
    expect_bsp_equals_union_batch(cfg);
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, BspEqualsUnionBatch,
                         ::testing::Combine(::testing::Values(BspCase{1, 1}, BspCase{3, 2}, BspCase{4, 2}),
                                            ::testing::ValuesIn(test::exact_variants())),
                         [](const auto& i) {
                           const BspCase c = std::get<0>(i.param);
                           return "W" + std::to_string(c.workers) + "S" + std::to_string(c.servers) + "_" +
                                  std::get<1>(i.param);
                         });

// ---- local:H and easgd: the workers' own models, averaged or pulled toward a centre ----

// Runs a PS-mode `cfg` (workers as threads) and returns θ as the servers hold it at the end.
std::vector<float> run_ps(const ExperimentConfig& cfg) {
  const fs::path dir = temp_dir("ps");
  Cluster cluster(cfg);
  test::run_ps_workers(cfg, cluster, dir);
  cluster.join();
  cluster.rethrow();
  fs::remove_all(dir);
  return cluster.params();
}

// How many of `got` differ from `want` by more than `tol` relative (floored at 10% of max|θ|).
long count_differing(const std::vector<float>& got, const std::vector<float>& want, double tol, double* worst) {
  double scale = 0;
  long wrong = 0;
  *worst = 0;
  for (float w : want) scale = std::max(scale, double(std::abs(w)));
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(double(got[i]) - want[i]);
    *worst = std::max(*worst, d);
    wrong += d > tol * std::max(double(std::abs(want[i])), 0.1 * scale);
  }
  return wrong;
}

// A worker as the reference computes it: its replica, optimizer and sampler, one step at a time.
struct RefWorker {
  RefWorker(Backend& be, const ExperimentConfig& cfg, const DataSplit& data, int rank)
      : replica(be, model_spec(cfg), data.train, cfg.train.batch),
        optimizer(be, cfg.optimizer, replica.model().num_params()),
        sampler(std::size_t(data.train.n), cfg.cluster.workers, rank, cfg.seed) {
    replica.model().init(cfg.seed);
  }
  void step(long step, int batch, double lr) {
    const long spe = sampler.steps_per_epoch(batch);
    sampler.set_epoch(step / spe);
    replica.compute_gradient(sampler.batch(step % spe, batch));
    optimizer.step(replica.model().params(), replica.model().grads(), lr);
  }
  float* theta() { return replica.model().params(); }
  Replica replica;
  Optimizer optimizer;
  ShardSampler sampler;
};

class LocalSgd : public ::testing::TestWithParam<std::string> {};

// With plain SGD, one local step then the average of the W models is one bsp step: the same θ
// within 1e-6 of its largest entry (float rounding differs: a worker sends (θ - lr g) - θ).
TEST_P(LocalSgd, LocalOneIsBspWithin1e6) {
  ExperimentConfig cfg = test::small_config("bsp", 3, 2, GetParam());
  cfg.optimizer.kind = "sgd";
  const std::vector<float> bsp = run_ps(cfg);
  cfg.cluster.mode = "local:1";
  const std::vector<float> local = run_ps(cfg);
  ASSERT_EQ(local.size(), bsp.size());
  double scale = 0, worst = 0;
  for (std::size_t i = 0; i < bsp.size(); ++i)
    scale = std::max(scale, double(std::abs(bsp[i]))), worst = std::max(worst, double(std::abs(local[i] - bsp[i])));
  EXPECT_LE(worst, 1e-6 * scale) << "largest |θ| " << scale;
  EXPECT_NE(local, initial_params(model_spec(cfg), cfg.seed)) << "training moved θ";
}

// local:4 with momentum: each worker 4 steps of its own optimizer (its momentum kept across
// averages), then θ = the mean of the W models; the 50 steps end with a partial period of 2.
TEST_P(LocalSgd, LocalFourIsTheAverageOfReplicasThatEachTookFourSteps) {
  ExperimentConfig cfg = test::small_config("local:4", 2, 2, GetParam());
  const std::vector<float> ps = run_ps(cfg);

  auto be = make_cpu_backend(1);
  const DataSplit data = load_data(cfg);
  const int W = cfg.cluster.workers, b = cfg.train.batch;
  std::vector<std::unique_ptr<RefWorker>> ws;
  for (int r = 0; r < W; ++r) ws.push_back(std::make_unique<RefWorker>(*be, cfg, data, r));
  const std::size_t P = ws[0]->replica.model().num_params();
  for (long step = 0; step < cfg.train.steps; ++step) {
    for (auto& w : ws) w->step(step, b, cfg.optimizer.lr);  // constant schedule, no scaling
    if ((step + 1) % 4 == 0 || step == cfg.train.steps - 1)
      for (std::size_t i = 0; i < P; ++i) {
        float mean = 0;
        for (auto& w : ws) mean += w->theta()[i];
        mean /= float(W);
        for (auto& w : ws) w->theta()[i] = mean;
      }
  }
  const std::vector<float> ref(ws[0]->theta(), ws[0]->theta() + P);
  double worst = 0;
  EXPECT_EQ(count_differing(ps, ref, 1e-5, &worst), 0) << "worst abs difference " << worst;
  EXPECT_NE(ps, initial_params(model_spec(cfg), cfg.seed));
}

// One worker, easgd:0.3, an exchange every 3 steps (and after the last): its local SGD steps and
// the exchanges by hand, against the servers' centre.
TEST_P(LocalSgd, EasgdWithOneWorkerIsItsLocalStepsAndExchangesByHand) {
  ExperimentConfig cfg = test::small_config("easgd:0.3", 1, 2, GetParam());
  cfg.cluster.sync_every = 3;
  const std::vector<float> ps = run_ps(cfg);

  auto be = make_cpu_backend(1);
  const DataSplit data = load_data(cfg);
  RefWorker w(*be, cfg, data, 0);
  const std::size_t P = w.replica.model().num_params();
  std::vector<float> centre(w.theta(), w.theta() + P), e(P);
  for (long step = 0; step < cfg.train.steps; ++step) {
    w.step(step, cfg.train.batch, cfg.optimizer.lr);
    if ((step + 1) % 3 == 0 || step == cfg.train.steps - 1) {
      e = centre;
      elastic_exchange(w.theta(), e.data(), P, 0.3f, 1);  // (every batch holds samples)
      for (std::size_t i = 0; i < P; ++i) centre[i] += e[i];
    }
  }
  double worst = 0;
  EXPECT_EQ(count_differing(ps, centre, 1e-6, &worst), 0) << "worst abs difference " << worst;
  EXPECT_NE(ps, initial_params(model_spec(cfg), cfg.seed));
}

INSTANTIATE_TEST_SUITE_P(Transports, LocalSgd, ::testing::ValuesIn(test::exact_transports()),
                         [](const auto& i) { return i.param; });

// ---- straggler delays ----

// straggler.exp_delay_ms draws from (seed, rank, step): a resumed run, which starts at its
// checkpoint's step, draws what the run would have. They came from one stream per rank, which
// a resumed run started over.
TEST(Straggler, ExponentialDelaysAreDrawnFromTheStep) {
  StragglerConfig cfg;
  cfg.exp_delay_ms = 5.0;
  Straggler whole(cfg, 7, 1, wall_clock()), resumed(cfg, 7, 1, wall_clock()), other_rank(cfg, 7, 2, wall_clock());
  std::vector<double> a, b;
  for (long step = 0; step < 10; ++step) {
    whole.start_step(step);
    a.push_back(whole.delay_s(0.0));
  }
  for (long step = 5; step < 10; ++step) {
    resumed.start_step(step);
    b.push_back(resumed.delay_s(0.0));
  }
  EXPECT_EQ(std::vector<double>(a.begin() + 5, a.end()), b);
  other_rank.start_step(5);
  EXPECT_NE(other_rank.delay_s(0.0), a[5]);
}

// ---- train.accumulate: N batches of b per update are one batch of N b ----

struct AccumulateCase {
  const char* mode;
  const char* optimizer;
};
class Accumulate : public ::testing::TestWithParam<AccumulateCase> {};

TEST_P(Accumulate, FourBatchesOfEightPerUpdateAreOneBatchOfThirtyTwo) {
  auto run = [](ExperimentConfig cfg) {
    if (cfg.uses_servers()) return run_ps(cfg);
    const fs::path dir = temp_dir("acc");
    auto theta = test::run_allreduce_workers(cfg, dir);
    fs::remove_all(dir);
    EXPECT_EQ(theta[0], theta[1]) << "the replicas agree";
    return theta[0];
  };
  ExperimentConfig cfg = test::small_config(GetParam().mode, 2, 2);
  cfg.optimizer.kind = GetParam().optimizer;
  cfg.optimizer.trust = 0.02;
  cfg.train.batch = 8;  // each worker's shard: 256 samples, 32 batches of 8 or 8 of 32
  cfg.train.accumulate = 4;
  // A schedule by epochs (samples applied): all-reduce counted the update's own batches as
  // applied already, and ran ahead of bsp and of the batch of 32.
  cfg.schedule.kind = "cosine";
  cfg.schedule.warmup_epochs = 0.5;
  cfg.train.steps = 64;  // two epochs
  const std::vector<float> accumulated = run(cfg);
  cfg.train.batch = 32;
  cfg.train.accumulate = 1;
  cfg.train.steps = 16;
  const std::vector<float> large = run(cfg);
  double worst = 0;
  EXPECT_EQ(count_differing(accumulated, large, 1e-5, &worst), 0) << "worst abs difference " << worst;
  EXPECT_NE(large, initial_params(model_spec(cfg), cfg.seed));
}

INSTANTIATE_TEST_SUITE_P(Modes, Accumulate,
                         ::testing::Values(AccumulateCase{"bsp", "momentum"}, AccumulateCase{"bsp", "lars"},
                                           AccumulateCase{"allreduce", "momentum"},
                                           AccumulateCase{"allreduce", "lamb"}),
                         [](const auto& i) { return std::string(i.param.mode) + "_" + i.param.optimizer; });

// ---- cluster.pull_codec: workers compute on θ rounded to 16 bits; the servers keep f32 ----

class PullCodec : public ::testing::TestWithParam<std::string> {};

// One worker, bsp, two shards: every step's gradient is computed on the servers' θ rounded to
// the pull codec, and the servers apply it to their float32 θ: a reference that rounds θ
// before each gradient and steps a float32 copy gives the same θ (within 1e-5), and the
// evaluator, pulling f32, gets the servers' θ bit for bit.
TEST_P(PullCodec, WorkersComputeOnRoundedThetaAndTheServersKeepFloat32) {
  const std::string codec = GetParam();
  ExperimentConfig cfg = test::small_config("bsp", 1, 2);
  cfg.cluster.pull_codec = codec;
  const fs::path dir = temp_dir("pull");
  Cluster cluster(cfg, /*record_pulls=*/false, /*wait_for_shutdown=*/true);
  test::run_ps_workers(cfg, cluster, dir);
  PsClient evaluator(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::evaluator, wire::kEvaluator));
  evaluator.connect();
  std::vector<float> pulled(count_params(model_spec(cfg)));
  evaluator.pull(0, pulled.data());
  evaluator.shutdown();
  cluster.join();
  cluster.rethrow();
  const std::vector<float> ps = cluster.params();
  EXPECT_EQ(pulled, ps) << "the evaluator pulls float32";

  auto be = make_cpu_backend(1);
  const DataSplit data = load_data(cfg);
  Replica ref(*be, model_spec(cfg), data.train, cfg.train.batch);
  ref.model().init(cfg.seed);
  const std::size_t P = ref.model().num_params();
  std::vector<float> master(ref.model().params(), ref.model().params() + P);
  Optimizer opt(*be, cfg.optimizer, P);
  ShardSampler sampler(std::size_t(data.train.n), 1, 0, cfg.seed);
  const long spe = sampler.steps_per_epoch(cfg.train.batch);
  const HalfFormat f = codec == "f16" ? HalfFormat::f16 : HalfFormat::bf16;
  long rounded = 0;
  for (long step = 0; step < cfg.train.steps; ++step) {
    for (std::size_t i = 0; i < P; ++i) {
      ref.model().params()[i] = from_half(f, to_half(f, master[i]));
      rounded += ref.model().params()[i] != master[i];
    }
    sampler.set_epoch(step / spe);
    ref.compute_gradient(sampler.batch(step % spe, cfg.train.batch));
    opt.step(master.data(), ref.model().grads(), cfg.optimizer.lr);
  }
  EXPECT_GT(rounded, 0) << "rounding changed some values";
  double worst = 0;
  EXPECT_EQ(count_differing(ps, master, 1e-5, &worst), 0) << "worst abs difference " << worst;
  // and it is not the float32 run
  cfg.cluster.pull_codec = "f32";
  EXPECT_GT(count_differing(run_ps(cfg), master, 1e-5, &worst), 0);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Codecs, PullCodec, ::testing::Values("f16", "bf16"), [](const auto& i) { return i.param; });

// ---- ssp:s never serves a worker more than s clocks ahead of the slowest ----

class SspBound : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(SspBound, NoPullServedMoreThanSClocksAheadOfTheSlowest) {
  const int s = std::get<0>(GetParam()), W = 4, S = 2, clocks = 30;
  const ExperimentConfig cfg = test::small_config("ssp:" + std::to_string(s), W, S, std::get<1>(GetParam()));
  Cluster cluster(cfg, /*record_pulls=*/true);
  const std::size_t P = count_params(model_spec(cfg));
  run_threads(W, [&](int r) {
    PsClient c(*cluster.transport, cluster.endpoints_for(r), client_options(cfg, wire::Role::worker, r));
    std::vector<float> theta(P), grad(P, 0.0f);
    c.connect();
    c.pull(0, theta.data());
    for (int k = 0; k < clocks; ++k) {
      if (r == W - 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the straggler (a busy machine: still the slowest)
      test::push(cfg, c, k, 1, grad.data(), k + 1 < clocks ? theta.data() : nullptr);
    }
    c.bye(clocks);
  });
  cluster.join();
  cluster.rethrow();
  for (const auto& srv : cluster.servers) {
    const auto& recs = srv->state().pull_records();
    ASSERT_EQ(recs.size(), std::size_t(W * clocks));  // the first pull and one per push but the last
    long ahead_max = 0;
    for (const PullRecord& p : recs) {
      EXPECT_LE(p.clock - p.min_clock, s) << "worker " << p.worker << " served clock " << p.clock
                                          << " while the slowest was at " << p.min_clock;
      ahead_max = std::max(ahead_max, p.clock - p.min_clock);
    }
    EXPECT_EQ(ahead_max, s) << "fast workers should run exactly s clocks ahead of the straggler";
    EXPECT_GT(srv->counters().pulls_held, 0) << "the straggler must have held someone";
  }
}

INSTANTIATE_TEST_SUITE_P(Staleness, SspBound,
                         ::testing::Combine(::testing::Values(0, 1, 3), ::testing::ValuesIn(test::exact_variants())),
                         [](const auto& i) { return "s" + std::to_string(std::get<0>(i.param)) + "_" + std::get<1>(i.param); });

// ---- asp: no update lost or applied twice ----

class Asp : public ::testing::TestWithParam<std::string> {};

TEST_P(Asp, ThirtyTwoWorkersFourShardsEveryUpdateAppliedExactlyOnce) {
  const int W = 32, S = 4, pushes = 200;
  ExperimentConfig cfg = test::small_config("asp", W, S, GetParam());
  cfg.model.kind = "linear";
  cfg.model.init = "zeros";
  const bool pieces = cfg.cluster.piece_kib > 0;  // then 1024 floats per shard: 4 pieces, streamed (sgd)
  cfg.data.dim = pieces ? 1023 : 63;  // linear dim -> 4: P = 256 (64 per shard), or 4096
  cfg.data.outputs = 4;
  cfg.optimizer.kind = "sgd";
  cfg.optimizer.lr = 1.0;
  Cluster cluster(cfg);
  const std::size_t P = count_params(model_spec(cfg));
  ASSERT_EQ(P, pieces ? 4096u : 256u);
  // Integer-valued gradients: every partial sum is exact in float32, in any order.
  auto g = [](int r, int k, std::size_t i) { return float(int((r * 7 + k * 3 + int(i)) % 5) - 2); };
  run_threads(W, [&](int r) {
    PsClient c(*cluster.transport, cluster.endpoints_for(r), client_options(cfg, wire::Role::worker, r));
    std::vector<float> theta(P), grad(P);
    c.connect();
    c.pull(0, theta.data());
    for (int k = 0; k < pushes; ++k) {
      for (std::size_t i = 0; i < P; ++i) grad[i] = g(r, k, i);
      test::push(cfg, c, k, 1, grad.data(), k + 1 < pushes ? theta.data() : nullptr, 13);
    }
    c.bye(pushes);
  });
  cluster.join();
  cluster.rethrow();
  const std::vector<float> theta = cluster.params();
  long wrong = 0;
  for (std::size_t i = 0; i < P; ++i) {
    long expected = 0;
    for (int r = 0; r < W; ++r)
      for (int k = 0; k < pushes; ++k) expected -= long(g(r, k, i));  // θ = 0 - lr * Σ g
    wrong += theta[i] != float(expected);
  }
  EXPECT_EQ(wrong, 0) << "parameters differing from the exact sum of all updates";
  for (const auto& s : cluster.servers) EXPECT_EQ(s->state().updates_applied(), W * pushes);
}

INSTANTIATE_TEST_SUITE_P(Transports, Asp, ::testing::ValuesIn(test::exact_variants()),
                         [](const auto& i) { return i.param; });

// ---- overlap: pushes leave during backward; the same math ----

// A shard's push leaves as soon as backward has finished the shard, before the rest of the
// gradient is: server 1 has applied it (an evaluator sees its θ move) while server 0 has
// nothing yet.
TEST(Overlap, AShardsPushLeavesAsSoonAsItsRangeIsReady) {
  ExperimentConfig cfg = test::small_config("asp", 1, 2, "tcp_overlap");
  Cluster cluster(cfg, /*record_pulls=*/false, /*wait_for_shutdown=*/true);
  const std::size_t P = count_params(model_spec(cfg));
  PsClient worker(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
  PsClient watcher(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::evaluator, wire::kEvaluator));
  worker.connect();
  watcher.connect();
  std::vector<float> theta(P), before(P), seen(P), grad(P, 1.0f);
  worker.pull(0, theta.data());
  watcher.pull(0, before.data());
  const ShardRange second = worker.shards()[1].range;

  worker.begin_push(0, 1, grad.data(), theta.data());
  worker.push_ready(second.offset + 1);  // not all of shard 1: nothing leaves
  worker.push_ready(second.offset);      // shard 1 is final
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool moved = false;
  while (!moved && std::chrono::steady_clock::now() < deadline) {
    watcher.pull(0, seen.data());
    moved = seen[second.offset] != before[second.offset];
    if (!moved) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(moved) << "shard 1's push did not reach its server before finish_push()";
  EXPECT_TRUE(std::equal(seen.begin(), seen.begin() + long(second.offset), before.begin()))
      << "shard 0 moved before its part of the gradient was final";
  const PullResult r = worker.finish_push();
  EXPECT_EQ(r.min_version, 1);
  worker.bye(1);
  watcher.shutdown();
  cluster.join();
  cluster.rethrow();
}

// A model whose first layer's gradient comes in several pieces and whose shard boundary lies
// inside it (so that shard 1 leaves during backward): logistic 784 -> 64 -> 3.
ExperimentConfig wide_config(const std::string& mode, int W, int S, bool overlap) {
  ExperimentConfig cfg = test::small_config(mode, W, S, overlap ? "shm_overlap" : "shm");
  cfg.data.dim = 784;
  cfg.model.hidden = {64};
  cfg.train.steps = 20;
  return cfg;
}

// One worker, so that the servers' sums do not depend on the order pushes arrive in.
TEST(Overlap, AWorkerGivesBitwiseTheParametersOfARunWithout) {
  std::vector<float> theta[2];
  for (const bool overlap : {false, true}) {
    const ExperimentConfig cfg = wide_config("bsp", 1, 2, overlap);
    const fs::path dir = temp_dir("overlap_bsp");
    Cluster cluster(cfg);
    test::run_ps_workers(cfg, cluster, dir);
    cluster.join();
    cluster.rethrow();
    theta[overlap] = cluster.params();
    fs::remove_all(dir);
  }
  EXPECT_EQ(theta[0], theta[1]);
  EXPECT_NE(theta[0], initial_params(model_spec(wide_config("bsp", 1, 2, false)), 1));
}

}  // namespace
