// Parameter servers and workers in one process (threads over one transport): each consistency
// mode checked exactly, on every transport (tcp, ipc), and bad input refused without touching θ.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <zmq.hpp>

#include "comm/half.h"
#include "comm/transport/shm/shm_transport.h"
#include "run/config.h"
#include "harness.h"
#include "local_worker.h"
#include "raw_packets.h"
#include "core/optimizer.h"
#include "ps/client.h"
#include "core/replica.h"
#include "core/rng.h"
#include "roles.h"
#include "core/sampler.h"
#include "server.h"
#include "run/setup.h"
#include "wire_generated.h"

using namespace pslab;
namespace fs = std::filesystem;

namespace {

using test::Cluster;
using test::run_threads;
using test::temp_dir;

ExperimentConfig make_config(const std::string& mode, int workers, int servers, const std::string& transport = "tcp") {
  return test::small_config(mode, workers, servers, transport);
}

// f() must throw a std::runtime_error whose message contains `says`; `unless` says what went
// wrong if it returns instead.
template <typename F>
void expect_refused(F&& f, const std::string& says, const char* unless) {
  try {
    f();
    ADD_FAILURE() << unless;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}


// ---- bsp == single-process SGD on the union of the workers' batches ----

struct BspCase {
  int workers, servers;
};
class BspEqualsUnionBatch : public ::testing::TestWithParam<std::tuple<BspCase, std::string>> {};

TEST_P(BspEqualsUnionBatch, ParametersWithin1e5RelativeAfter50Steps) {
  const auto [W, S] = std::get<0>(GetParam());
  const ExperimentConfig cfg = make_config("bsp", W, S, std::get<1>(GetParam()));
  const fs::path dir = temp_dir("bsp");
  Cluster cluster(cfg);
  test::run_ps_workers(cfg, cluster, dir);
  cluster.join();
  cluster.rethrow();
  const std::vector<float> ps = cluster.params();

  // Reference: one process, one optimizer, batch = union of the W workers' batches.
  auto be = make_cpu_backend(1);
  const DataSplit data = load_data(cfg);
  const int b = cfg.train.batch;
  Replica ref(*be, model_spec(cfg), data.train, W * b);
  ref.model().init(cfg.seed);
  Optimizer opt(*be, cfg.optimizer, ref.model().num_params());
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
  std::vector<float> single(ref.model().num_params());
  ref.model().store_params(single.data());

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
  ExperimentConfig cfg = make_config("bsp", 3, 2, GetParam());
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
  ExperimentConfig cfg = make_config("local:4", 2, 2, GetParam());
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
  ExperimentConfig cfg = make_config("easgd:0.3", 1, 2, GetParam());
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
      elastic_exchange(w.theta(), e.data(), P, 0.3f);
      for (std::size_t i = 0; i < P; ++i) centre[i] += e[i];
    }
  }
  double worst = 0;
  EXPECT_EQ(count_differing(ps, centre, 1e-6, &worst), 0) << "worst abs difference " << worst;
  EXPECT_NE(ps, initial_params(model_spec(cfg), cfg.seed));
}

INSTANTIATE_TEST_SUITE_P(Transports, LocalSgd, ::testing::ValuesIn(test::exact_transports()),
                         [](const auto& i) { return i.param; });

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
  ExperimentConfig cfg = make_config(GetParam().mode, 2, 2);
  cfg.optimizer.kind = GetParam().optimizer;
  cfg.optimizer.trust = 0.02;
  cfg.train.batch = 8;  // each worker's shard: 256 samples, 32 batches of 8 or 8 of 32
  cfg.train.accumulate = 4;
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
  ExperimentConfig cfg = make_config("bsp", 1, 2);
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
  const ExperimentConfig cfg = make_config("ssp:" + std::to_string(s), W, S, std::get<1>(GetParam()));
  Cluster cluster(cfg, /*record_pulls=*/true);
  const std::size_t P = count_params(model_spec(cfg));
  run_threads(W, [&](int r) {
    PsClient c(*cluster.transport, cluster.endpoints_for(r), client_options(cfg, wire::Role::worker, r));
    std::vector<float> theta(P), grad(P, 0.0f);
    c.connect();
    c.pull(0, theta.data());
    for (int k = 0; k < clocks; ++k) {
      if (r == W - 1) std::this_thread::sleep_for(std::chrono::milliseconds(3));  // the straggler
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
  ExperimentConfig cfg = make_config("asp", W, S, GetParam());
  cfg.model.kind = "linear";
  cfg.model.init = "zeros";
  cfg.data.dim = 63;  // linear 63 -> 4: P = 256, 64 per shard
  cfg.data.outputs = 4;
  cfg.optimizer.kind = "sgd";
  cfg.optimizer.lr = 1.0;
  Cluster cluster(cfg);
  const std::size_t P = count_params(model_spec(cfg));
  ASSERT_EQ(P, 256u);
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
  ExperimentConfig cfg = make_config("asp", 1, 2, "tcp_overlap");
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

// ---- bad input: counted, answered, θ untouched, server keeps serving ----

// A raw peer speaks to the server: a ZeroMQ socket for tcp and ipc; for shm a Unix packet socket
// (its header channel) whose payloads are references to shared-memory slots.
class BadInput : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    cfg = make_config("asp", 1, 1, GetParam());
    cfg.optimizer.kind = "sgd";
    cfg.optimizer.lr = 1.0;
    cluster = std::make_unique<Cluster>(cfg);
    P = count_params(model_spec(cfg));
    if (GetParam() == "shm") {
      slots = std::make_unique<comm::ShmSlots>();
      packets = std::make_unique<test::RawPackets>(cluster->endpoints[0]);
    } else {
      raw = std::make_unique<zmq::socket_t>(raw_ctx, zmq::socket_type::dealer);
      raw->set(zmq::sockopt::linger, 0);
      raw->set(zmq::sockopt::sndtimeo, 10000);  // a server that stopped reading fails the test, not hangs it
      raw->connect(cluster->endpoints[0]);
    }
    evaluator = std::make_unique<PsClient>(*cluster->transport, cluster->endpoints,
                                           client_options(cfg, wire::Role::evaluator, wire::kEvaluator));
    evaluator->connect();
  }
  void TearDown() override {
    evaluator.reset();
    raw.reset();
    packets.reset();
    cluster.reset();
  }
  // Sends frames on the raw socket and returns the Error code of the reply.
  std::string send_expect_error(std::vector<zmq::message_t> frames) {
    std::string head;
    if (packets) {
      std::vector<std::string> parts;
      for (const auto& f : frames) parts.emplace_back(static_cast<const char*>(f.data()), f.size());
      packets->send(parts);
      head = packets->recv_header(5000);
      if (head.empty()) return "(no reply)";
    } else {
      for (std::size_t i = 0; i < frames.size(); ++i)
        raw->send(frames[i], i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      zmq::pollitem_t item{raw->handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(5000));
      zmq::message_t reply;
      if (!raw->recv(reply, zmq::recv_flags::dontwait)) return "(no reply)";
      head.assign(static_cast<const char*>(reply.data()), reply.size());
      while (reply.more()) {  // a PullReply's payload follows its header
        zmq::message_t rest;
        (void)raw->recv(rest);
        if (!rest.more()) break;
      }
    }
    std::string why;
    auto h = wire::decode(head.data(), head.size(), why);
    if (!h) return "(malformed reply: " + why + ")";
    if (const auto* e = std::get_if<wire::Error>(&h->body)) return wire::error_code_name(e->code);
    return std::string("(") + wire::body_name(h->body) + ")";
  }
  zmq::message_t header(const wire::Body& b, int sender = 0, int shard = 0) {
    const auto bytes = enc.encode(wire::Header{sender, shard, b});
    return zmq::message_t(bytes.data(), bytes.size());
  }
  // A payload frame: the bytes, or (shm) a reference to a slot holding them.
  zmq::message_t floats(const std::vector<float>& v) {
    if (!slots) return zmq::message_t(v.data(), v.size() * sizeof(float));
    comm::ShmRef ref{};
    EXPECT_TRUE(slots->put(v.data(), v.size() * sizeof(float), ref));
    return zmq::message_t(&ref, sizeof ref);
  }
  std::vector<zmq::message_t> msg(zmq::message_t a) {
    std::vector<zmq::message_t> v;
    v.push_back(std::move(a));
    return v;
  }
  std::vector<zmq::message_t> msg(zmq::message_t a, zmq::message_t b) {
    auto v = msg(std::move(a));
    v.push_back(std::move(b));
    return v;
  }
  std::vector<float> theta() {
    std::vector<float> t(P);
    evaluator->pull(0, t.data());
    return t;
  }

  ExperimentConfig cfg;
  std::unique_ptr<Cluster> cluster;
  std::size_t P = 0;
  zmq::context_t raw_ctx{1};
  std::unique_ptr<zmq::socket_t> raw;
  std::unique_ptr<PsClient> evaluator;
  std::unique_ptr<comm::ShmSlots> slots;  // shm
  std::unique_ptr<test::RawPackets> packets;  // shm
  wire::Encoder enc;
};

TEST_P(BadInput, EveryKindIsCountedAnsweredAndLeavesThetaBitwiseUnchanged) {
  const std::vector<float> before = theta();
  const std::uint64_t hash = config_fingerprint(cfg);
  std::vector<float> g(P, 0.5f);
  const std::uint64_t gsum = wire::checksum(g.data(), P);

  // Before Hello.
  EXPECT_EQ(send_expect_error(msg(zmq::message_t(std::string("garbage, not a header")))), "malformed");
  zmq::message_t pull = header(wire::Pull{0});
  EXPECT_EQ(send_expect_error(msg(zmq::message_t(pull.data(), pull.size() / 2))), "malformed");  // truncated
  {
    flatbuffers::FlatBufferBuilder f;
    auto body = pslab::fb::CreatePull(f, 0).Union();
    pslab::fb::FinishMessageBuffer(f, pslab::fb::CreateMessage(f, wire::kMagic, wire::kProtocol, 0, 0, pslab::fb::Body(77), body));
    EXPECT_EQ(send_expect_error(msg(zmq::message_t(f.GetBufferPointer(), f.GetSize()))), "malformed");  // unknown type
  }
  EXPECT_EQ(send_expect_error(msg(header(wire::Pull{0}))), "unknown_peer");
  EXPECT_EQ(send_expect_error(msg(header(wire::Hello{wire::Role::worker, 0, P + 1, hash}))), "config");
  EXPECT_EQ(send_expect_error(msg(header(wire::Hello{wire::Role::worker, 0, P, hash ^ 1}))), "config");
  EXPECT_EQ(send_expect_error(msg(header(wire::Hello{wire::Role::worker, 0, P, hash}))), "(Welcome)");

  // As a registered worker.
  EXPECT_EQ(send_expect_error(msg(header(wire::Pull{0}, /*sender=*/5))), "unknown_peer");  // wrong sender id
  EXPECT_EQ(send_expect_error(msg(header(wire::Pull{0}, 0, /*shard=*/3))), "wrong_shard");
  EXPECT_EQ(send_expect_error(msg(header(wire::Push{0, 0, 1, gsum, 0, P, false, 0, 4 * P}),
                                  floats(std::vector<float>(10, 0.5f)))), "wrong_size");
  EXPECT_EQ(send_expect_error(msg(header(wire::Push{0, 0, 1, gsum, 0, P - 1, false, 0, 4 * (P - 1)}), floats(g))), "wrong_shard");
  EXPECT_EQ(send_expect_error(msg(header(wire::Push{0, 0, 1, gsum, 0, P, false, 0, 4 * P}))), "wrong_size");  // no payload
  {
    std::vector<float> flipped = g;
    reinterpret_cast<unsigned char*>(flipped.data())[13] ^= 0x10;
    EXPECT_EQ(send_expect_error(msg(header(wire::Push{0, 0, 1, gsum, 0, P, false, 0, 4 * P}), floats(flipped))), "bad_checksum");
  }
  EXPECT_EQ(send_expect_error(msg(header(wire::Push{5, 0, 1, gsum, 0, P, false, 0, 4 * P}), floats(g))), "protocol");  // not its clock
  EXPECT_EQ(send_expect_error(msg(header(wire::Push{0, 0, 1, gsum, 0, P, false, /*codec*/ 7, 4 * P}), floats(g))),
            "config");  // not the run's codec
  EXPECT_EQ(send_expect_error(msg(header(wire::Push{0, 0, 1, gsum, 0, P, false, 0, 4 * P + 4}), floats(g))),
            "wrong_size");  // the header's byte count is not the payload's
  EXPECT_EQ(send_expect_error(msg(header(wire::Pull{0}), floats(g))), "wrong_size");  // payload on a Pull
  EXPECT_EQ(send_expect_error(msg(header(wire::Welcome{}))), "unknown_type");
  {
    auto v = msg(header(wire::Pull{0}), floats(g));
    v.push_back(floats(g));
    EXPECT_EQ(send_expect_error(std::move(v)), "malformed");  // too many frames
  }

  EXPECT_EQ(before, theta()) << "θ changed after bad input";
  const auto stats = nlohmann::json::parse(evaluator->stats(0));
  EXPECT_EQ(stats["bad_total"], 18) << stats.dump();
  EXPECT_EQ(stats["bad"]["malformed"], 4) << stats.dump();
  EXPECT_EQ(stats["bad"]["wrong_size"], 4) << stats.dump();
  EXPECT_EQ(stats["bad"]["config"], 3) << stats.dump();
  EXPECT_EQ(stats["bad"]["bad_checksum"], 1) << stats.dump();
  EXPECT_EQ(stats["version"], 0);

  // Still serving: a good push is applied (SGD, lr 1) and answered with the new θ.
  EXPECT_EQ(send_expect_error(msg(header(wire::Push{0, 0, 1, gsum, 0, P, true, 0, 4 * P}), floats(g))), "(PullReply)");
  const std::vector<float> after = theta();
  for (std::size_t i = 0; i < P; ++i) ASSERT_EQ(after[i], before[i] - 0.5f) << i;
}

// A storm: 100,000 messages mutated at random from good ones (bytes flipped, cut,
// appended, frames added or dropped, senders and shards changed, plain noise, over ZeroMQ some
// with an 8 MiB frame: more than the shard, less than the 16 MiB a server reads), from a peer that
// never said Hello, beside idle half-open TCP connections. The server keeps serving; every
// message is counted as bad input exactly once (by reason); θ is bitwise unchanged. Mutations
// that happen to decode as a Hello are not sent (an unauthenticated Hello is issue 13's
// authentication, tested on its own).
TEST_P(BadInput, AStormOfMutatedMessagesIsCountedAndChangesNothing) {
  const std::vector<float> before = theta();
  const long bytes_in_before = nlohmann::json::parse(evaluator->stats(0))["bytes_in"].get<long>();
  std::vector<int> half_open;  // TCP connections that never speak ZeroMQ's greeting
  if (GetParam() == "tcp") {
    const std::string ep = cluster->endpoints[0];
    const int port = std::stoi(ep.substr(ep.rfind(':') + 1));
    for (int i = 0; i < 50; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(std::uint16_t(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ASSERT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a), 0);
      if (i % 2) {  // the start of a greeting, then nothing
        ASSERT_EQ(::send(fd, "\xff\0\0", 3, MSG_NOSIGNAL), 3);
      }
      half_open.push_back(fd);
    }
  }
  const std::vector<float> g(P, 0.25f);
  const std::uint64_t gsum = wire::checksum(g.data(), P);
  const std::vector<wire::Body> bodies = {
      wire::Pull{0}, wire::Push{0, 0, 1, gsum, 0, P, true, 0, 4 * P}, wire::Bye{3}, wire::Stats{}, wire::Shutdown{},
      wire::PushAck{1, 1}, wire::Beat{2}, wire::KvGet{"k", 10}, wire::Error{wire::ErrorCode::protocol, "x"}};
  const std::string payload(reinterpret_cast<const char*>(g.data()), 4 * P);
  const std::string huge(std::size_t(8) << 20, '\x5a');  // far more than this shard's 4 * P bytes
  long huge_sent = 0;
  Rng rng(2026);
  auto below = [&](std::uint64_t n) { return std::size_t(rng.next() % n); };
  long sent = 0;
  const int storm = 100000;
  for (int i = 0; i < storm; ++i) {
    const wire::Body& b = bodies[below(bodies.size())];
    const auto h = enc.encode(wire::Header{int(below(5)) - 2, int(below(3)) - 1, b});
    std::string head(reinterpret_cast<const char*>(h.data()), h.size());
    std::vector<std::string> frames;
    switch (below(6)) {
      case 0:  // bytes flipped
        for (std::size_t k = 0, n = 1 + below(4); k < n; ++k) head[below(head.size())] ^= char(1 + below(255));
        break;
      case 1: head.resize(below(head.size())); break;  // cut
      case 2: head += std::string(1 + below(64), char(below(256))); break;  // appended
      case 3: {  // noise
        head.resize(below(300));
        for (char& c : head) c = char(below(256));
        break;
      }
      default: break;  // intact: refused all the same (no Hello on this connection)
    }
    frames.push_back(head);
    if (std::holds_alternative<wire::Push>(b) ? below(4) != 0 : below(8) == 0) frames.push_back(payload);
    if (below(16) == 0) frames.push_back("extra");
    if (!packets && below(2000) == 0) frames.push_back(huge);  // 8 MiB of garbage: read and counted too
    std::string why;
    const auto d = wire::decode(head.data(), head.size(), why);
    if (d && std::holds_alternative<wire::Hello>(d->body)) continue;
    if (packets) {
      packets->send(frames);
    } else {
      for (std::size_t k = 0; k < frames.size(); ++k)
        ASSERT_TRUE(raw->send(zmq::buffer(frames[k]), k + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none))
            << "message " << i << ": the server took nothing for 10 s";
    }
    ++sent;
    huge_sent += frames.back().size() == huge.size();
  }
  // Every message counted, once: wait until the server has seen them all.
  nlohmann::json stats;
  for (int i = 0; i < 300; ++i) {
    stats = nlohmann::json::parse(evaluator->stats(0));
    if (stats["bad_total"].get<long>() >= sent) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(stats["bad_total"].get<long>(), sent) << stats.dump();
  EXPECT_GT(sent, storm * 9 / 10);
  if (!packets) {
    EXPECT_GT(huge_sent, 20) << "the storm sent too few 8 MiB frames to show they are counted";
  }
  // Their bytes count as bad input, not as traffic the run moved (bytes_pushed in the summary).
  EXPECT_GT(stats["bytes_bad"].get<long>(), 1000000) << stats.dump();
  EXPECT_LT(stats["bytes_in"].get<long>() - bytes_in_before, 100000) << stats.dump();
  EXPECT_EQ(stats["version"], 0);
  EXPECT_EQ(before, theta()) << "θ changed under the storm";
  for (int fd : half_open) ::close(fd);
  // Still serving: a worker says Hello and its push is applied (on a new connection: the old
  // one still holds the storm's Error replies).
  if (packets) {
    packets = std::make_unique<test::RawPackets>(cluster->endpoints[0]);
  } else {
    raw = std::make_unique<zmq::socket_t>(raw_ctx, zmq::socket_type::dealer);
    raw->set(zmq::sockopt::linger, 0);
    raw->connect(cluster->endpoints[0]);
  }
  EXPECT_EQ(send_expect_error(msg(header(wire::Hello{wire::Role::worker, 0, P, config_fingerprint(cfg)}))), "(Welcome)");
  EXPECT_EQ(send_expect_error(msg(header(wire::Push{0, 0, 1, gsum, 0, P, true, 0, 4 * P}), floats(g))), "(PullReply)");
  const std::vector<float> after = theta();
  for (std::size_t i = 0; i < P; ++i) ASSERT_EQ(after[i], before[i] - 0.25f) << i;
}

INSTANTIATE_TEST_SUITE_P(Transports, BadInput, ::testing::ValuesIn(test::exact_transports()),
                         [](const auto& i) { return i.param; });

// shm: a reference that names no live slot of a pslab segment is malformed input like any other.
using BadShmReference = BadInput;

TEST_P(BadShmReference, IsCountedAnsweredAndLeavesThetaBitwiseUnchanged) {
  const std::vector<float> before = theta();
  EXPECT_EQ(send_expect_error(msg(header(wire::Hello{wire::Role::worker, 0, P, config_fingerprint(cfg)}))), "(Welcome)");
  std::vector<float> g(P, 0.5f);
  const std::uint64_t gsum = wire::checksum(g.data(), P);
  const auto push = [&] { return header(wire::Push{0, 0, 1, gsum, 0, P, false, 0, 4 * P}); };
  comm::ShmRef good{};
  ASSERT_TRUE(slots->put(g.data(), 4 * P, good));
  const auto as_frame = [](const comm::ShmRef& r) { return zmq::message_t(&r, sizeof r); };
  auto forged = [&](auto change) {
    comm::ShmRef r = good;
    change(r);
    return as_frame(r);
  };
  EXPECT_EQ(send_expect_error(msg(push(), forged([](auto& r) { r.magic ^= 1; }))), "malformed");
  EXPECT_EQ(send_expect_error(msg(push(), forged([](auto& r) { ++r.generation; }))), "malformed");  // stale
  EXPECT_EQ(send_expect_error(msg(push(), forged([](auto& r) { r.length = 1ull << 40; }))), "malformed");  // beyond the slot
  EXPECT_EQ(send_expect_error(msg(push(), forged([](auto& r) { r.segment_id ^= 1; }))), "malformed");
  EXPECT_EQ(send_expect_error(msg(push(), forged([](auto& r) { r.fd = 0; }))), "malformed");  // not a pslab segment
  EXPECT_EQ(send_expect_error(msg(push(), forged([](auto& r) { r.pid = 0x7ffffffe; }))), "malformed");  // no such process
  EXPECT_EQ(send_expect_error(msg(push(), zmq::message_t(&good, sizeof good - 1))), "malformed");  // not a reference

  EXPECT_EQ(before, theta()) << "θ changed after bad references";
  const auto stats = nlohmann::json::parse(evaluator->stats(0));
  EXPECT_EQ(stats["bad"]["malformed"], 7) << stats.dump();
  EXPECT_EQ(stats["version"], 0);
  // The slot the forged references copied from is still good.
  EXPECT_EQ(send_expect_error(msg(push(), as_frame(good))), "(PushAck)");
  const std::vector<float> after = theta();
  for (std::size_t i = 0; i < P; ++i) ASSERT_EQ(after[i], before[i] - 0.5f) << i;
}

INSTANTIATE_TEST_SUITE_P(Transports, BadShmReference, ::testing::Values("shm"), [](const auto& i) { return i.param; });

TEST(Timeouts, AWorkerWhoseServerIsGoneFailsNamingTheServer) {
  ExperimentConfig cfg = make_config("asp", 1, 1);
  cfg.cluster.timeout_s = 0.5;
  const auto transport = comm::make_transport("tcp");
  const std::string nobody = transport->local_address("nobody");  // nothing listens there
  PsClient c(*transport, {nobody}, client_options(cfg, wire::Role::worker, 0));
  try {
    c.connect();
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no reply to Hello"), std::string::npos) << m;
    EXPECT_NE(m.find("server 0 at " + nobody), std::string::npos) << m;
  }
}

// Two workers' start barrier: both say Hello at once (each server answers when both have).
static void connect_both(PsClient& a, PsClient& b) {
  std::thread t([&] { b.connect(); });
  a.connect();
  t.join();
}

TEST(Timeouts, AHeldPullIsAnsweredWithWhomItWaitedFor) {
  ExperimentConfig cfg = make_config("bsp", 2, 1);
  cfg.cluster.timeout_s = 0.5;
  Cluster cluster(cfg);
  const std::size_t P = count_params(model_spec(cfg));
  PsClient w0(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
  PsClient w1(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 1));
  connect_both(w0, w1);
  std::vector<float> theta(P), grad(P, 0.0f);
  w0.pull(0, theta.data());
  try {
    w0.push(0, 1, grad.data(), theta.data());  // worker 1 never pushes clock 0
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("timeout: pull of worker 0 for clock 1"), std::string::npos) << m;
    EXPECT_NE(m.find("still needs pushes from worker 1 (clock 0)"), std::string::npos) << m;
  }
  // Then the server hears nothing more and gives up, naming worker 1 as the one that went
  // silent and worker 0 as waiting for it (not as "still training").
  cluster.join();
  try {
    cluster.rethrow();
    FAIL() << "the server did not give up";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no message from any worker for 0.5 s; still training: worker 1 (clock 0, last heard"),
              std::string::npos) << m;
    EXPECT_NE(m.find("; waiting for them: worker 0 (clock 1, last heard"), std::string::npos) << m;
  }
}

// ---- lost workers: heartbeats, cluster.heartbeat_s, cluster.on_worker_loss ----

// A worker that computes for 3 x heartbeat_s without calling its client is kept (its client's
// heartbeat thread speaks for it); one that dies (its connection closed, no Bye) is dropped
// within about heartbeat_s, and the run ends when the other says Bye.
TEST(WorkerLoss, AnAspServerKeepsABusyWorkerAndDropsADeadOne) {
  ExperimentConfig cfg = make_config("asp", 2, 2);
  cfg.cluster.heartbeat_s = 0.3;
  Cluster cluster(cfg);
  const std::size_t P = count_params(model_spec(cfg));
  PsClient w0(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
  auto w1 = std::make_unique<PsClient>(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 1));
  connect_both(w0, *w1);
  std::vector<float> theta(P), grad(P, 0.5f);
  w0.pull(0, theta.data());
  w1->pull(0, theta.data());
  std::this_thread::sleep_for(std::chrono::milliseconds(900));  // both "compute" for 3 x heartbeat_s
  for (const auto& s : cluster.servers) EXPECT_EQ(s->workers_lost().size(), 0u) << "a busy worker was dropped";
  w1->push(0, 1, grad.data(), theta.data());
  const auto died = std::chrono::steady_clock::now();
  w1.reset();  // worker 1 dies: no Bye, no more heartbeats
  for (long c = 0; c < 8; ++c) {  // worker 0 trains on
    w0.push(c, 1, grad.data(), theta.data());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (const auto& s : cluster.servers) {
    ASSERT_EQ(s->workers_lost().size(), 1u) << "worker 1 was not dropped";
    EXPECT_EQ(s->workers_lost()[0]["worker"], 1);
    EXPECT_EQ(s->workers_lost()[0]["clock"], 1);
    EXPECT_GE(s->workers_lost()[0]["silent_s"].get<double>(), 0.3);
    EXPECT_TRUE(s->state().dropped(1));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - died, std::chrono::seconds(2));
  w0.bye(8);
  cluster.join();  // every worker is done: worker 0 said Bye, worker 1 was lost
  cluster.rethrow();
  for (const auto& s : cluster.servers) EXPECT_EQ(s->state().version(), 9);
}

// ssp: the pull of a worker waiting for a hung one is served once the hung one is dropped; the
// hung one, when it wakes, is told it was dropped.
TEST(WorkerLoss, SspServesThePullsAHungWorkerHeldOnceItIsDropped) {
  ExperimentConfig cfg = make_config("ssp:0", 2, 1);
  cfg.cluster.heartbeat_s = 0.3;
  Cluster cluster(cfg);
  const std::size_t P = count_params(model_spec(cfg));
  PsClient w0(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
  PsClient::Options hung = client_options(cfg, wire::Role::worker, 1);
  hung.heartbeat_s = 0;  // a process that hangs (SIGSTOP) sends nothing
  PsClient w1(*cluster.transport, cluster.endpoints, hung);
  connect_both(w0, w1);
  std::vector<float> theta(P), grad(P, 0.5f);
  w0.pull(0, theta.data());
  w1.pull(0, theta.data());
  const auto t0 = std::chrono::steady_clock::now();
  const PullResult r = w0.push(0, 1, grad.data(), theta.data());  // held: ssp:0 waits for worker 1
  const double held_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(held_s, 0.25);
  EXPECT_LT(held_s, 1.5) << "the held pull waited for a worker that had been silent for heartbeat_s";
  EXPECT_GE(r.held_us, 250000);
  expect_refused([&] { w1.push(0, 1, grad.data(), theta.data()); }, "worker 1 was dropped from this run as lost",
                 "a dropped worker's push was taken");
  w0.push(1, 1, grad.data(), theta.data());  // no longer held by worker 1
  w0.bye(2);
  cluster.join();
  cluster.rethrow();
  EXPECT_EQ(cluster.servers[0]->state().version(), 2);
}

// The other way: a server that holds a pull beats to the waiting worker, so a bsp pull held
// for 4 x heartbeat_s behind a slow (but alive) worker is not taken for a silent server.
TEST(WorkerLoss, AServerHoldingAPullForLongIsNotTakenForSilent) {
  ExperimentConfig cfg = make_config("bsp", 2, 2);
  cfg.cluster.heartbeat_s = 0.3;
  Cluster cluster(cfg);
  const std::size_t P = count_params(model_spec(cfg));
  PsClient w0(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
  PsClient w1(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 1));
  connect_both(w0, w1);
  std::vector<float> theta0(P), theta1(P), grad(P, 0.5f);
  w0.pull(0, theta0.data());
  w1.pull(0, theta1.data());
  std::thread slow([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // worker 1 computes for 4 x heartbeat_s
    w1.push(0, 1, grad.data(), theta1.data());
  });
  PullResult r{};
  std::string error;
  try {
    r = w0.push(0, 1, grad.data(), theta0.data());  // held until worker 1 pushes
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  slow.join();
  ASSERT_EQ(error, "") << "a server holding a pull was taken for silent";
  EXPECT_GE(r.held_us, 1000000);
  w0.bye(1);
  w1.bye(1);
  cluster.join();
  cluster.rethrow();
  EXPECT_EQ(theta0, theta1);
}

// bsp cannot train on without a worker: the server fails, naming the silent one (not the one
// waiting for it), within about heartbeat_s.
TEST(WorkerLoss, ABspServerFailsNamingTheSilentWorker) {
  ExperimentConfig cfg = make_config("bsp", 2, 1);
  cfg.cluster.heartbeat_s = 0.3;
  Cluster cluster(cfg);
  PsClient w0(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
  PsClient::Options hung = client_options(cfg, wire::Role::worker, 1);
  hung.heartbeat_s = 0;
  PsClient w1(*cluster.transport, cluster.endpoints, hung);
  connect_both(w0, w1);
  const auto t0 = std::chrono::steady_clock::now();
  cluster.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  try {
    cluster.rethrow();
    FAIL() << "the server went on without worker 1";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("worker 1 lost: silent for 0."), std::string::npos) << m;
    EXPECT_NE(m.find("bsp cannot train on without it"), std::string::npos) << m;
    EXPECT_EQ(m.find("worker 0"), std::string::npos) << m;
  }
}

// ---- checkpoints: a server writes its shard when it stops and goes on from it ----

TEST(Checkpoint, AServerResumesWhereItsCheckpointLeftOff) {
  ExperimentConfig cfg = make_config("ssp:1", 1, 2);
  cfg.optimizer.kind = "momentum";
  const std::string dir = test::temp_dir("ckpt").string();
  auto paths = [&](bool resume) {
    return [&, resume](ServerOptions& o) {
      o.checkpoint_path = dir + "/server" + std::to_string(o.shard) + ".ckpt";
      if (resume) o.resume_path = o.checkpoint_path;
    };
  };
  const std::size_t P = count_params(model_spec(cfg));
  std::vector<float> theta(P), grad(P);
  for (std::size_t i = 0; i < P; ++i) grad[i] = 0.01f * float(int(i % 7) - 3);
  {
    Cluster cluster(cfg, false, false, nullptr, paths(false));
    PsClient w(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
    w.connect();
    w.pull(0, theta.data());
    for (long c = 0; c < 3; ++c) w.push(c, 4, grad.data(), theta.data());
    cluster.stop = true;  // stopped mid-run (a worker that said Bye would stay done after a resume)
    cluster.join();
  }
  std::vector<float> resumed(P);
  {
    Cluster cluster(cfg, false, false, nullptr, paths(true));
    for (const auto& s : cluster.servers) {
      EXPECT_EQ(s->state().version(), 3);
      EXPECT_EQ(s->state().clock_of(0), 3);
      EXPECT_EQ(s->state().samples_applied(), 12);
    }
    PsClient w(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
    w.connect();
    const PullResult r = w.pull(3, resumed.data());
    EXPECT_EQ(r.min_version, 3);
    EXPECT_EQ(std::memcmp(resumed.data(), theta.data(), P * sizeof(float)), 0) << "θ after resuming differs";
    w.push(3, 4, grad.data(), resumed.data());  // clock 3 is the next one: taken
    w.bye(4);
    cluster.join();
    cluster.rethrow();
  }
  // The same config resumed by the wrong shard is refused, naming the file.
  expect_refused(
      [&] {
        Cluster cluster(cfg, false, false, nullptr, [&](ServerOptions& o) {
          o.resume_path = dir + "/server" + std::to_string(1 - o.shard) + ".ckpt";
        });
      },
      "server 0: cannot resume from " + dir + "/server1.ckpt: it is shard 1 of 2",
      "a server resumed from another shard's checkpoint");
  std::filesystem::remove_all(dir);
}

// A stop between one shard's push and the next's leaves the checkpoints holding a worker at
// different clocks: the resumed worker brings the server behind up with an empty push (it
// changes nothing there) and goes on from the furthest clock, counting the push as lost.
TEST(Checkpoint, AResumedWorkerCatchesUpAServerThatMissedItsLastPush) {
  ExperimentConfig cfg = make_config("asp", 1, 2);
  const std::string dir = test::temp_dir("ckpt_catch_up").string();
  auto path = [&](int k) { return dir + "/server" + std::to_string(k) + ".ckpt"; };
  const std::size_t P = count_params(model_spec(cfg));
  std::vector<float> theta(P), grad(P, 0.25f);
  {
    Cluster cluster(cfg, false, false, nullptr, [&](ServerOptions& o) { o.checkpoint_path = path(o.shard); });
    PsClient w(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
    w.connect();
    w.pull(0, theta.data());
    for (long c = 0; c < 3; ++c) w.push(c, 4, grad.data(), c < 2 ? theta.data() : nullptr);
    cluster.stop = true;  // stopped mid-run
    cluster.join();
  }
  // Server 1 as if clock 2's push had not reached it: its checkpoint from one push earlier.
  ShardCheckpoint behind = read_checkpoint(path(1));
  ASSERT_EQ(behind.clocks[0], 3);
  behind.clocks[0] = 2;
  write_checkpoint(path(1), behind);
  Cluster cluster(cfg, false, false, nullptr, [&](ServerOptions& o) {
    o.checkpoint_path = path(o.shard);
    o.resume_path = path(o.shard);
  });
  PsClient w(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
  w.connect();
  const ResumePoint r = w.catch_up();
  EXPECT_EQ(r.clock, 3);
  EXPECT_EQ(r.lost_pushes, 1);
  EXPECT_EQ(cluster.servers[0]->state().clock_of(0), 3);
  EXPECT_EQ(cluster.servers[1]->state().clock_of(0), 3);
  EXPECT_EQ(cluster.servers[1]->state().version(), behind.version) << "the empty push changed θ";
  w.pull(3, theta.data());
  w.push(3, 4, grad.data(), nullptr);  // and the next clock is taken by both
  w.bye(4);
  cluster.join();
  cluster.rethrow();
  std::filesystem::remove_all(dir);
}

// cluster.on_server_loss = "restart": a server that goes away comes back from its checkpoint on
// the same address; the worker rejoins it with its clock and sends its request again. The
// checkpoint here is 2 clocks older than the worker: the server counts 2 updates lost.
TEST(Checkpoint, AWorkerRejoinsARestartedServer) {
  ExperimentConfig cfg = make_config("asp", 1, 1);
  cfg.cluster.heartbeat_s = 0.3;
  ASSERT_TRUE(restarts_lost_servers(cfg));
  const std::string dir = test::temp_dir("ckpt_rejoin").string(), path = dir + "/server0.ckpt";
  const auto transport = comm::make_transport("tcp");
  ServerOptions so;
  so.endpoint = transport->local_address("server0");
  so.checkpoint_path = path;
  std::atomic<bool> stop{false};
  so.stop = &stop;
  auto serve = [](Server& s) {
    try {
      s.run();
    } catch (const std::runtime_error&) {  // "stopped by a signal"
    }
  };
  auto first = std::make_unique<Server>(*transport, cfg, so);
  std::thread t1(serve, std::ref(*first));
  const std::size_t P = count_params(model_spec(cfg));
  std::vector<float> theta(P), grad(P, 0.5f);
  PsClient::Options co = client_options(cfg, wire::Role::worker, 0);
  ASSERT_TRUE(co.rejoin);
  PsClient w(*transport, {so.endpoint}, co);
  w.connect();
  w.pull(0, theta.data());
  for (long c = 0; c < 3; ++c) w.push(c, 2, grad.data(), theta.data());
  stop = true;  // the server goes (writing its checkpoint at clock 3)
  t1.join();
  first.reset();
  ShardCheckpoint older = read_checkpoint(path);
  ASSERT_EQ(older.clocks[0], 3);
  older.clocks[0] = 1;  // as if written two clocks earlier
  write_checkpoint(path, older);
  stop = false;
  so.resume_path = path;
  Server second(*transport, cfg, so);
  std::thread t2(serve, std::ref(second));
  std::string error;
  try {
    w.push(3, 2, grad.data(), theta.data());  // reaches the new server: rejoin, then sent again
    w.bye(4);
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  t2.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(second.state().clock_of(0), 4);
  EXPECT_EQ(second.updates_lost(), 2);
  std::filesystem::remove_all(dir);
}

// Authentication (cluster.auth = "curve"): a client that speaks the protocol and has the run's
// config (so the right config hash) but not its key gets no reply and changes nothing; workers
// with the key train as usual.
TEST(Authentication, AClientWithoutTheRunsKeyGetsNothingAndChangesNothing) {
  ExperimentConfig cfg = make_config("asp", 1, 2);
  cfg.cluster.timeout_s = 10;
  const comm::RunKey key = comm::make_run_key();
  Cluster cluster(cfg, false, false, &key);
  const std::size_t P = count_params(model_spec(cfg));
  auto outsider_transport = comm::make_transport("tcp");  // no key
  PsClient::Options as_worker0 = client_options(cfg, wire::Role::worker, 0);
  as_worker0.timeout_s = 1;  // waits less than the servers' start barrier
  PsClient outsider(*outsider_transport, cluster.endpoints, as_worker0);
  try {
    outsider.connect();
    FAIL() << "an unauthenticated client was welcomed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("server 0"), std::string::npos) << e.what();
  }
  for (const auto& s : cluster.servers) EXPECT_EQ(s->state().version(), 0) << "θ moved";
  // The real worker 0 is not locked out: it connects, pushes and leaves.
  auto member_transport = comm::make_transport("tcp");
  member_transport->authenticate(key);
  PsClient w(*member_transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
  w.connect();
  std::vector<float> theta(P), grad(P, 1.0f);
  w.pull(0, theta.data());
  w.push(0, 1, grad.data(), theta.data());
  w.bye(1);
  cluster.join();
  cluster.rethrow();
  for (const auto& s : cluster.servers) EXPECT_EQ(s->state().version(), 1);
}

// Defect: the server's backend set OpenBLAS's thread count (one setting per process) to 1, so a
// server created in a worker's process changed the worker's setting.
TEST(Server, CreatingOneLeavesTheProcesssBlasThreadsAlone) {
  auto worker_backend = make_cpu_backend(2);
  ASSERT_NE(worker_backend->describe().find(", 2 BLAS threads"), std::string::npos) << worker_backend->describe();
  {
    Cluster cluster(make_config("asp", 1, 1));  // a server in this process
    cluster.stop = true;
  }
  EXPECT_NE(worker_backend->describe().find(", 2 BLAS threads"), std::string::npos) << worker_backend->describe();
}

// Defect: PsClient::bye() and shutdown() took any reply but an Error as done.
TEST(Client, ByeAndShutdownWantAnAckFromEveryServer) {
  ExperimentConfig cfg = make_config("asp", 1, 1);
  const auto transport = comm::make_transport("tcp");
  const std::string ep = transport->local_address("fake-server");
  auto listener = transport->listen(ep);
  std::thread fake([&] {  // answers Hello with Welcome, then anything else with a PushAck
    wire::Encoder enc;
    comm::Message m;
    comm::PeerId from;
    for (int i = 0; i < 3 && listener->recv(m, from, comm::after(std::chrono::seconds(10))); ++i) {
      std::string why;
      const auto h = wire::decode(m.header(), why);
      const std::size_t P = count_params(model_spec(cfg));
      const wire::Body reply = std::holds_alternative<wire::Hello>(h->body)
                                   ? wire::Body(wire::Welcome{0, 1, 0, P, 1, "asp", 0})
                                   : wire::Body(wire::PushAck{0, 0});
      listener->send(from, enc.encode(wire::Header{wire::kServer, 0, reply}));
    }
  });
  PsClient c(*transport, {ep}, client_options(cfg, wire::Role::worker, 0));
  c.connect();
  expect_refused([&] { c.bye(0); }, "answered Bye with PushAck",
                 "a PushAck was taken for the Ack of Bye");
  expect_refused([&] { c.shutdown(); }, "answered Shutdown with PushAck",
                 "a PushAck was taken for the Ack of Shutdown");
  fake.join();
}

// A Shutdown ends a run only from its evaluator: one from a worker (or anyone else that said
// Hello as one) is refused and counted, and the run goes on until the evaluator's.
TEST(Server, OnlyTheEvaluatorsShutdownEndsTheRun) {
  ExperimentConfig cfg = make_config("asp", 1, 1);
  Cluster cluster(cfg, /*record_pulls=*/false, /*wait_for_shutdown=*/true);
  const std::size_t P = count_params(model_spec(cfg));
  PsClient w(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
  w.connect();
  std::vector<float> theta(P);
  w.pull(0, theta.data());
  expect_refused([&] { w.shutdown(); }, "only the evaluator ends a run",
                 "a worker's Shutdown was taken");
  w.bye(0);
  // Every worker said Bye, but the server still serves: the evaluator takes the final θ.
  PsClient evaluator(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::evaluator, wire::kEvaluator));
  evaluator.connect();
  evaluator.pull(0, theta.data());
  evaluator.shutdown();
  cluster.join();
  cluster.rethrow();
  EXPECT_EQ(cluster.servers[0]->counters().bad.at("protocol"), 1);
}

// The evaluator watches training between θs with progress-only Pulls: every server answers
// with its header (samples applied, clocks, versions, done) and no payload; a worker may not ask.
TEST(Server, AProgressPollIsAHeaderOnlyAndOnlyForTheEvaluator) {
  ExperimentConfig cfg = make_config("asp", 1, 2);
  Cluster cluster(cfg, /*record_pulls=*/false, /*wait_for_shutdown=*/true);
  const std::size_t P = count_params(model_spec(cfg));
  PsClient w(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
  PsClient evaluator(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::evaluator, wire::kEvaluator));
  w.connect();
  evaluator.connect();
  std::vector<float> theta(P), grad(P, 0.01f);
  w.pull(0, theta.data());
  for (long c = 0; c < 3; ++c) w.push(c, 8, grad.data(), theta.data());
  const PullResult p = evaluator.progress();
  EXPECT_EQ(p.samples_applied, 3 * 8);
  EXPECT_EQ(p.min_clock, 3);
  EXPECT_EQ(p.min_version, 3);
  EXPECT_EQ(p.max_version, 3);
  EXPECT_FALSE(p.training_done);
  w.bye(3);
  EXPECT_TRUE(evaluator.progress().training_done);
  expect_refused([&] { w.progress(); }, "only the evaluator asks for progress",
                 "a worker's progress-only Pull was answered");
  evaluator.shutdown();
  cluster.join();
  cluster.rethrow();
  for (const auto& server : cluster.servers) {
    EXPECT_EQ(server->counters().progress_polls, 2);
    EXPECT_EQ(server->counters().pulls, 4);  // the worker's: its first and one with each push
    EXPECT_EQ(server->counters().bad.at("protocol"), 1);
  }
}

// Defect: with eval.interval_s longer than the rest of the run, the evaluator slept until its
// next tick before it saw that training was over, and the run (its servers too) waited with it.
// Now it watches for the end every 20 ms between θs.
TEST(Evaluator, AnIntervalLongerThanTheRunDoesNotHoldUpItsEnd) {
  const fs::path dir = temp_dir("eval_interval");
  ExperimentConfig cfg = make_config("asp", 2, 2);
  cfg.eval.interval_s = 600;
  Cluster cluster(cfg, /*record_pulls=*/false, /*wait_for_shutdown=*/true);
  std::atomic<bool> evaluator_done{false};
  std::thread evaluator([&] {
    RoleOptions o;
    o.servers = cluster.endpoints;
    o.out_dir = dir.string();
    o.progress = false;
    o.transport = cluster.transport.get();
    run_evaluator(cfg, o);
    evaluator_done = true;
  });
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

// Defect: in PS modes the evaluator reported the smallest shard version as "step" (under asp
// with W workers that is W x the steps), in all-reduce the ranks' step. Now "step" means the
// steps every worker has completed, in every mode; the versions are reported as such.
TEST(Evaluator, ItsStepIsTheWorkersStepsInEveryMode) {
  const fs::path dir = temp_dir("eval_step");
  ExperimentConfig cfg = make_config("asp", 2, 2);
  cfg.eval.interval_s = 0.05;
  Cluster cluster(cfg, /*record_pulls=*/false, /*wait_for_shutdown=*/true);
  std::thread evaluator([&] {
    RoleOptions o;
    o.servers = cluster.endpoints;
    o.out_dir = dir.string();
    o.progress = false;
    o.transport = cluster.transport.get();
    run_evaluator(cfg, o);
  });
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
