// The all-reduce mode: Gloo and shm collectives with 1, 2, 3 and 4 ranks (threads; TCP loopback
// or one shared segment), replicas bitwise identical after training, all-reduce == bsp on the parameter servers,
// timeouts naming the missing rank, and the NCCL path (skipped without a GPU).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "bucketed_allreduce.h"
#include "ps/checkpoint.h"
#include "comm/collective.h"
#include "gpu.h"
#include "harness.h"
#include "roles.h"
#include "run/setup.h"
#include "snapshots.h"
#include "comm/wire.h"

using namespace pslab;
using test::run_threads;
using test::temp_dir;

namespace {

// The coordinator's transport in these tests (Gloo itself always runs over TCP).
std::unique_ptr<comm::Transport> transport() { return comm::make_transport("tcp"); }

// A collective of one implementation ("gloo" or "shm").
std::unique_ptr<Collective> make(const std::string& kind, RendezvousClient& rv) {
  return kind == "shm" ? make_shm_collective(rv) : make_gloo_collective(rv, "127.0.0.1");
}

// Rank r's integer-valued data (the sum is exact in any order), and how many of the n sums of
// W ranks' data in x are wrong.
std::vector<float> rank_data(std::size_t n, int r) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = float(int((r + 1) * 3 + i % 11) - 5);
  return x;
}
long wrong_sums(const std::vector<float>& x, int W) {
  long wrong = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    long want = 0;
    for (int q = 0; q < W; ++q) want += (q + 1) * 3 + long(i % 11) - 5;
    wrong += x[i] != float(want);
  }
  return wrong;
}

// (implementation, ranks)
class Collectives : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Collectives, AllReduceBroadcastAndBarrierAreExact) {
  const auto [kind, W] = GetParam();
  const auto tr = transport();
  const std::string ep = tr->local_address("coordinator");
  Coordinator coord(*tr, ep, W);
  std::vector<std::vector<float>> results(static_cast<std::size_t>(W));
  run_threads(W, [&](int r) {
    RendezvousClient rv(*tr, ep, r, W, std::chrono::seconds(20));
    auto coll = make(kind, rv);
    EXPECT_EQ(coll->size(), W);
    // Sizes include 0 and odd ones, one above the size where 4 ranks switch from recursive
    // doubling to the ring, and ones that make the shm collective grow its segment (64Ki
    // floats at first), then smaller again.
    for (std::size_t n : {0u, 1u, 7u, 1000u, 100003u, 600001u, 5u, 65536u}) {
      std::vector<float> x = rank_data(n, r);
      coll->allreduce_sum(x.data(), n, 0);
      EXPECT_EQ(wrong_sums(x, W), 0) << "rank " << r << " n " << n;
    }
    std::vector<float> b(513, float(r));
    coll->broadcast(b.data(), b.size(), W - 1);
    for (float v : b) ASSERT_EQ(v, float(W - 1));
    coll->barrier();
    rv.bye();
  });
}

TEST_P(Collectives, ReplicasAreBitwiseIdenticalAfterTraining) {
  const auto [kind, W] = GetParam();
  const ExperimentConfig cfg = test::small_config("allreduce", W, 1, kind == "shm" ? "shm" : "tcp");
  const auto dir = temp_dir("ar");
  const auto theta = test::run_allreduce_workers(cfg, dir);
  const std::uint64_t sum0 = wire::checksum(theta[0].data(), theta[0].size());
  for (int r = 1; r < W; ++r)
    EXPECT_EQ(wire::checksum(theta[std::size_t(r)].data(), theta[std::size_t(r)].size()), sum0) << "rank " << r;
  EXPECT_NE(theta[0], initial_params(model_spec(cfg), cfg.seed)) << "training moved θ";
  std::filesystem::remove_all(dir);
}

// cluster.codec = f16 / bf16 in allreduce: 16-bit values on the wire. Every rank ends with
// bitwise the same sums; each within the format's rounding of the exact sum of the rounded
// inputs (at most W roundings of partial sums, each <= u |partial|, u = 2^-11 or 2^-8); values a
// format holds exactly (small integers) sum exactly.
TEST_P(Collectives, AllReduceInSixteenBitsIsWithinItsRoundingAndTheSameOnEveryRank) {
  const auto [kind, W] = GetParam();
  const auto tr = transport();
  for (const HalfFormat f : {HalfFormat::f16, HalfFormat::bf16}) {
    const std::string ep = tr->local_address(f == HalfFormat::f16 ? "coordinator16" : "coordinator-bf16");
    Coordinator coord(*tr, ep, W);  // one group per format (the shm segment's name is per group)
    const double u = f == HalfFormat::f16 ? 1.0 / 2048 : 1.0 / 256;
    std::vector<std::vector<float>> results(static_cast<std::size_t>(W));
    const std::size_t n = 70001;  // odd, and more than the shm segment's first 64Ki floats hold as f32 halves
    std::vector<std::vector<float>> inputs(static_cast<std::size_t>(W), std::vector<float>(n));
    for (int r = 0; r < W; ++r)
      for (std::size_t i = 0; i < n; ++i)
        inputs[std::size_t(r)][i] = std::sin(float(i) * 0.37f + float(r)) * (1.0f + float(i % 5));
    run_threads(W, [&](int r) {
      RendezvousClient rv(*tr, ep, r, W, std::chrono::seconds(20));
      auto coll = make(kind, rv);
      EXPECT_TRUE(coll->reduces_half());
      std::vector<float> x = inputs[std::size_t(r)];
      coll->allreduce_sum_half(x.data(), n, f, 1.0f, 0);
      std::vector<float> ints = rank_data(1000, r);  // integers: exact in both formats
      coll->allreduce_sum_half(ints.data(), ints.size(), f, 1.0f, 1);
      EXPECT_EQ(wrong_sums(ints, W), 0) << "rank " << r;
      results[std::size_t(r)] = x;
      rv.bye();
    });
    long outside = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double exact = 0, magnitude = 0;
      for (int q = 0; q < W; ++q) {
        const double v = from_half(f, to_half(f, inputs[std::size_t(q)][i]));
        exact += v;
        magnitude += std::abs(v);
      }
      outside += std::abs(results[0][i] - exact) > double(W) * u * magnitude + 1e-30;
    }
    EXPECT_EQ(outside, 0) << (f == HalfFormat::f16 ? "f16" : "bf16");
    for (int r = 1; r < W; ++r) EXPECT_EQ(results[std::size_t(r)], results[0]) << "rank " << r;
  }
}

// Training with the gradient all-reduced in f16 / bf16: every replica identical, θ after one step
// within the format's rounding of the float32 run's (this small problem amplifies a difference
// in θ quickly: after 2 steps f16 is 3e-3 off, so later steps are no test of the wire), and a
// whole run's log counts 2 bytes per value.
TEST_P(Collectives, TrainingWithSixteenBitAllReducesStaysCloseToFloat32) {
  const auto [kind, W] = GetParam();
  if (W == 1) GTEST_SKIP() << "one rank all-reduces nothing";
  ExperimentConfig cfg = test::small_config("allreduce", W, 1, kind == "shm" ? "shm" : "tcp");
  cfg.train.steps = 1;
  const auto dir = temp_dir("ar16");
  const auto f32 = test::run_allreduce_workers(cfg, dir)[0];
  for (const char* codec : {"f16", "bf16"}) {
    cfg.cluster.codec = codec;
    cfg.train.steps = 1;
    const auto theta = test::run_allreduce_workers(cfg, dir);
    double scale = 0, worst = 0;
    for (std::size_t i = 0; i < f32.size(); ++i)
      scale = std::max(scale, double(std::abs(f32[i]))), worst = std::max(worst, double(std::abs(theta[0][i] - f32[i])));
    EXPECT_LE(worst, (std::string(codec) == "f16" ? 1e-4 : 1e-3) * scale) << codec;
    EXPECT_GT(worst, 0.0) << codec << ": the 16-bit all-reduce changed nothing";
    cfg.train.steps = 50;
    std::filesystem::remove_all(dir);
    const auto run = test::run_allreduce_workers(cfg, dir);
    for (int r = 1; r < W; ++r) EXPECT_EQ(run[std::size_t(r)], run[0]) << codec << " rank " << r;
    long bytes = 0;
    std::ifstream metrics(dir / "metrics" / "worker0.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.value("kind", "") == "train") bytes = j.value("allreduce_bytes", 0L);  // the run's total so far
    }
    EXPECT_EQ(bytes, 50L * long(f32.size()) * 2) << codec;
  }
  std::filesystem::remove_all(dir);
}

// Gloo: 2 and 4 recursive doubling (4 with the ring for large buffers); 3 the ring.
INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Combine(::testing::Values("gloo", "shm"), ::testing::Values(1, 2, 3, 4)),
                         [](const auto& i) { return std::get<0>(i.param) + std::to_string(std::get<1>(i.param)); });

class AllReduce : public ::testing::TestWithParam<std::string> {};

TEST_P(AllReduce, EqualsBspOnTheParameterServersWithin1e5) {
  const int W = 3;  // uneven shards: batch-size weighting matters
  const auto dir = temp_dir("ar_vs_bsp");
  const ExperimentConfig bsp = test::small_config("bsp", W, 2, GetParam());
  test::Cluster cluster(bsp);
  test::run_ps_workers(bsp, cluster, dir);
  cluster.join();
  cluster.rethrow();
  const std::vector<float> ps = cluster.params();

  const std::vector<float> replica =
      test::run_allreduce_workers(test::small_config("allreduce", W, 2, GetParam()), dir)[0];
  ASSERT_EQ(ps.size(), replica.size());
  double scale = 0, worst = 0;
  long wrong = 0;
  for (float v : ps) scale = std::max(scale, double(std::abs(v)));
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const double d = std::abs(double(ps[i]) - replica[i]);
    worst = std::max(worst, d);
    wrong += d > 1e-5 * std::max(double(std::abs(ps[i])), 0.1 * scale);  // relative, floored at 10% of max|θ|
  }
  EXPECT_EQ(wrong, 0) << "worst abs difference " << worst << ", largest |θ| " << scale;
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Transports, AllReduce, ::testing::ValuesIn(test::exact_variants()),
                         [](const auto& i) { return i.param; });

// The evaluator's snapshot port: one bad message must not end or fake the run. Whatever is
// not a good snapshot is counted by reason and dropped; θ comes from the newest good one.
class Snapshots : public ::testing::TestWithParam<std::string> {};

TEST_P(Snapshots, BadMessagesAreCountedAndDroppedNeverFatal) {
  auto t = comm::make_transport(GetParam());
  const std::string at = t->local_address("snapshots");
  SnapshotReceiver rx(*t, at, /*timeout_s=*/1.0);
  const std::size_t n = 100;
  std::vector<float> good(n), theta(n, -7.0f);
  for (std::size_t i = 0; i < n; ++i) good[i] = float(i) * 0.5f;
  auto raw = t->connect({at});
  wire::Encoder enc;
  auto snapshot_header = [&](std::size_t length, std::uint64_t checksum, long step) {
    return enc.encode(wire::Header{0, -1, wire::PullReply{step, step, 0, 10 * step, 0, false, checksum, 0, length, 0,
                                                          length * sizeof(float)}});
  };
  auto send_bad = [&] {
    const std::string junk(5, 'x');
    ASSERT_TRUE(raw->send(0, {reinterpret_cast<const std::byte*>(junk.data()), junk.size()}, {}, comm::after(std::chrono::seconds(5))));
    ASSERT_TRUE(raw->send(0, enc.encode(wire::Header{0, -1, wire::Shutdown{}}), {}, comm::after(std::chrono::seconds(5))));
    ASSERT_TRUE(raw->send(0, snapshot_header(n - 1, wire::checksum(good.data(), n - 1), 99),
                          comm::OutPayload{good.data(), (n - 1) * sizeof(float)}, comm::after(std::chrono::seconds(5))));
    std::vector<float> zeros(n, 0.0f);  // a "snapshot" of θ = 0 whose checksum is good's
    ASSERT_TRUE(raw->send(0, snapshot_header(n, wire::checksum(good.data(), n), 99),
                          comm::OutPayload{zeros.data(), n * sizeof(float)}, comm::after(std::chrono::seconds(5))));
  };
  // Garbage before and after a good snapshot: the good one is taken, the rest counted.
  send_bad();
  ASSERT_TRUE(raw->send(0, snapshot_header(n, wire::checksum(good.data(), n), 5),
                        comm::OutPayload{good.data(), n * sizeof(float)}, comm::after(std::chrono::seconds(5))));
  send_bad();
  const Snapshot s = rx.next(theta.data(), n);
  EXPECT_EQ(s.step, 5);
  EXPECT_EQ(s.samples, 50);
  EXPECT_EQ(theta, good);
  EXPECT_GE(s.dropped, 4);  // those before it; those after may still be on their way
  // Only bad messages: the wait ends at its timeout, saying what was dropped; θ untouched.
  send_bad();
  try {
    rx.next(theta.data(), n);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no θ snapshot from rank 0 within 1 s"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("12 bad message(s) dropped"), std::string::npos) << e.what();
  }
  EXPECT_EQ(theta, good);
  EXPECT_EQ(rx.dropped_by_reason(), (std::map<std::string, long>{
                                        {"malformed", 3}, {"not a snapshot", 3}, {"wrong size", 3}, {"bad checksum", 3}}));
}

INSTANTIATE_TEST_SUITE_P(Transports, Snapshots, ::testing::Values("tcp", "shm"), [](const auto& i) { return i.param; });

TEST(AllReduceTimeouts, TimeoutNamesTheRankThatDidNotArrive) {
  ExperimentConfig cfg = test::small_config("allreduce", 2, 1);
  cfg.cluster.timeout_s = 1.0;
  const auto tr = transport();
  RoleOptions o;
  o.rank = 0;
  o.coordinator = tr->local_address("coordinator");
  o.out_dir = temp_dir("ar_timeout").string();
  o.progress = false;
  o.transport = tr.get();
  try {
    run_allreduce_worker(cfg, o);  // rank 1 never starts
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 1 (never joined)"), std::string::npos) << m;
  }
  std::filesystem::remove_all(o.out_dir);
}

class AllReduceStops : public ::testing::TestWithParam<std::string> {};

TEST_P(AllReduceStops, ARankThatStopsMidRunIsNamedWithItsStep) {
  const auto tr = transport();
  const std::string ep = tr->local_address("coordinator");
  Coordinator coord(*tr, ep, 2, std::chrono::milliseconds(100));
  std::string error;
  run_threads(2, [&](int r) {
    RendezvousClient rv(*tr, ep, r, 2, std::chrono::milliseconds(1000));
    auto coll = make(GetParam(), rv);
    std::vector<float> x(100, 1.0f);
    for (long step = 0; step < 5; ++step) {
      if (r == 1 && step == 3) return;  // rank 1 stops after step 2
      rv.report_step(step);
      try {
        coll->allreduce_sum(x.data(), x.size(), step);
      } catch (const std::runtime_error& e) {
        error = e.what();
        return;
      }
    }
  });
  EXPECT_NE(error.find("all-reduce of step 3 on rank 0"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1 (at step 2"), std::string::npos) << error;
  if (GetParam() == "shm") {
    EXPECT_NE(error.find("shared-memory barrier 8 for rank 1 (at barrier 7)"), std::string::npos) << error;
  }
}

INSTANTIATE_TEST_SUITE_P(Collectives, AllReduceStops, ::testing::Values("gloo", "shm"));

// ---- checkpoints: rank 0 writes θ and the optimizer's state; a resumed run goes on bitwise ----

// 20 steps written to a checkpoint (momentum: its velocity too), then a run of 50 steps resumed
// from it, gives bitwise the θ of 50 steps straight. (The 20-step run's checkpoint is relabelled
// with the 50-step config's fingerprint, which counts the steps.)
TEST(AllReduceCheckpoint, AResumedRunGoesOnBitwise) {
  const ExperimentConfig full = test::small_config("allreduce", 2, 1);
  ExperimentConfig part = full;
  part.train.steps = 20;
  const auto dir = temp_dir("ar_ckpt");
  const std::string path = (dir / "allreduce.ckpt").string();
  const auto straight = test::run_allreduce_workers(full, dir);
  test::run_allreduce_workers(part, dir, [&](RoleOptions& o) { o.checkpoint = path; });
  ShardCheckpoint c = read_checkpoint(path);
  EXPECT_EQ(c.version, 20);
  EXPECT_EQ(c.optimizer.size(), 1u) << "momentum keeps its velocity";
  c.config_hash = config_fingerprint(full);
  write_checkpoint(path, c);
  const auto resumed = test::run_allreduce_workers(full, dir, [&](RoleOptions& o) {
    o.checkpoint = path;
    o.resume = true;
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(std::memcmp(resumed[std::size_t(r)].data(), straight[0].data(), straight[0].size() * sizeof(float)), 0)
        << "rank " << r;
  // Without the velocity the same resume differs: the test sees the optimizer's state.
  c.optimizer[0].assign(c.optimizer[0].size(), 0.0f);
  write_checkpoint(path, c);
  const auto no_velocity = test::run_allreduce_workers(full, dir, [&](RoleOptions& o) {
    o.checkpoint = path;
    o.resume = true;
  });
  EXPECT_NE(std::memcmp(no_velocity[0].data(), straight[0].data(), straight[0].size() * sizeof(float)), 0);
  std::filesystem::remove_all(dir);
}

// ---- GroupWatch: a silent rank, or a silent coordinator, is named within the heartbeat ----

namespace {
// What a watch reported, and when.
struct Lost {
  std::mutex mu;
  std::condition_variable cv;
  std::string what;
  std::chrono::steady_clock::time_point when;
  std::function<void(const std::string&)> callback() {
    return [this](const std::string& m) {
      std::lock_guard lock(mu);
      what = m;
      when = std::chrono::steady_clock::now();
      cv.notify_all();
    };
  }
  bool wait_for(std::chrono::milliseconds d) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, d, [&] { return !what.empty(); });
  }
};
}  // namespace

// Three ranks watch each other (heartbeat 0.4 s); rank 2 goes silent at step 7 (its watch
// stops, as in a SIGSTOPped process); rank 1 says Bye and stops watching, which is not a loss.
// Rank 0 names rank 2, with its step, within about the heartbeat.
TEST(GroupWatch, NamesARankSilentForTheHeartbeatAndNotOneThatSaidBye) {
  const auto tr = transport();
  const std::string ep = tr->local_address("coordinator");
  Coordinator coord(*tr, ep, 3, std::chrono::milliseconds(100));
  const std::chrono::duration<double> hb(0.4);
  RendezvousClient rv0(*tr, ep, 0, 3, std::chrono::seconds(5)), rv1(*tr, ep, 1, 3, std::chrono::seconds(5)),
      rv2(*tr, ep, 2, 3, std::chrono::seconds(5));
  Lost lost0, lost1, lost2;
  GroupWatch w0(*tr, ep, 0, 3, hb, lost0.callback());
  auto w1 = std::make_unique<GroupWatch>(*tr, ep, 1, 3, hb, lost1.callback());
  auto w2 = std::make_unique<GroupWatch>(*tr, ep, 2, 3, hb, lost2.callback());
  rv2.report_step(7);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // 2.5 heartbeats: all alive, nothing said
  EXPECT_TRUE(lost0.what.empty()) << lost0.what;
  EXPECT_TRUE(lost2.what.empty()) << lost2.what;
  w1.reset();
  rv1.bye();
  const auto silent = std::chrono::steady_clock::now();
  w2.reset();  // rank 2 falls silent
  ASSERT_TRUE(lost0.wait_for(std::chrono::seconds(3))) << "rank 0 did not name the silent rank";
  EXPECT_EQ(lost0.what.find("rank 2 lost: silent for 0."), 0u) << lost0.what;
  EXPECT_NE(lost0.what.find("at step 7 (cluster.heartbeat_s = 0.4)"), std::string::npos) << lost0.what;
  const double after = std::chrono::duration<double>(lost0.when - silent).count();
  EXPECT_GE(after, 0.3) << lost0.what;
  EXPECT_LT(after, 2 * hb.count()) << lost0.what;
  EXPECT_TRUE(lost1.what.empty()) << lost1.what;
}

// A coordinator that stops answering (rank 0's process stopped or gone) is named by the others.
TEST(GroupWatch, NamesACoordinatorThatStopsAnswering) {
  const auto tr = transport();
  const std::string ep = tr->local_address("coordinator");
  auto coord = std::make_unique<Coordinator>(*tr, ep, 2, std::chrono::milliseconds(0));
  Lost lost1;
  GroupWatch w1(*tr, ep, 1, 2, std::chrono::duration<double>(0.4), lost1.callback());
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_TRUE(lost1.what.empty()) << lost1.what;
  const auto gone = std::chrono::steady_clock::now();
  coord.reset();
  ASSERT_TRUE(lost1.wait_for(std::chrono::seconds(3))) << "the silent coordinator was not named";
  EXPECT_NE(lost1.what.find("rank 0 lost: its coordinator at " + ep + " has not answered for 0."), std::string::npos)
      << lost1.what;
  EXPECT_LT(std::chrono::duration<double>(lost1.when - gone).count(), 0.8) << lost1.what;
}

// ---- overlap: buckets all-reduced as backward finishes them ----

// Bucketed and overlapped, the same sums as one whole all-reduce, bit for bit (shm: each
// element summed in rank order; Gloo with 2 ranks: a + b), on a model whose first layer comes in
// pieces and with small buckets (13 of them).
class AllReduceOverlap : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(AllReduceOverlap, BucketsGiveBitwiseTheParametersOfOneWholeAllReduce) {
  const auto [transport, W] = GetParam();
  std::vector<std::vector<float>> theta[2];
  for (const bool overlap : {false, true}) {
    ExperimentConfig cfg = test::small_config("allreduce", W, 1, transport + (overlap ? "_overlap" : ""));
    cfg.data.dim = 784;
    cfg.model.hidden = {64};
    cfg.train.steps = 20;
    cfg.cluster.bucket_kb = 16;
    const auto dir = temp_dir("ar_overlap");
    theta[overlap] = test::run_allreduce_workers(cfg, dir);
    std::filesystem::remove_all(dir);
  }
  for (int r = 0; r < W; ++r) EXPECT_EQ(theta[1][std::size_t(r)], theta[0][std::size_t(r)]) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Collectives, AllReduceOverlap,
                         ::testing::Values(std::make_tuple("tcp", 2), std::make_tuple("shm", 2), std::make_tuple("shm", 3)),
                         [](const auto& i) { return std::get<0>(i.param) + std::to_string(std::get<1>(i.param)); });

// A bucket is all-reduced as soon as backward has finished it, before the rest of ∇θ is:
// a collective that records its calls sees bucket [70, 100) while backward still holds the rest.
TEST(AllReduceOverlap, ABucketStartsAsSoonAsBackwardFinishesIt) {
  struct Recorder final : Collective {
    explicit Recorder(RendezvousClient& rv, const float* base) : Collective(rv), base(base) {}
    std::string describe() const override { return "recorder"; }
    void allreduce_sum(float* data, std::size_t n, long) override {
      std::lock_guard<std::mutex> lock(mu);
      calls.emplace_back(std::size_t(data - base), n);
      cv.notify_all();
    }
    void broadcast(float*, std::size_t, int) override {}
    void barrier() override {}
    const float* base;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::pair<std::size_t, std::size_t>> calls;  // (offset, floats)
  };
  const auto tr = transport();
  const std::string ep = tr->local_address("coordinator");
  Coordinator coord(*tr, ep, 1, std::chrono::milliseconds(1000));
  RendezvousClient rv(*tr, ep, 0, 1, std::chrono::milliseconds(1000));
  std::vector<float> g(100);
  Recorder rec(rv, g.data());
  BucketedAllreduce buckets(rec, g.data(), g.size(), 30, 1.0);
  using Call = std::pair<std::size_t, std::size_t>;
  buckets.start(0);
  buckets.ready(71);  // not all of the last bucket yet
  buckets.ready(70);
  {
    std::unique_lock<std::mutex> lock(rec.mu);
    ASSERT_TRUE(rec.cv.wait_for(lock, std::chrono::seconds(10), [&] { return !rec.calls.empty(); }))
        << "the last bucket was not all-reduced before the rest of the gradient was final";
    EXPECT_EQ(rec.calls, (std::vector<Call>{{70, 30}}));
  }
  buckets.ready(0);
  buckets.finish();
  EXPECT_EQ(rec.calls, (std::vector<Call>{{70, 30}, {40, 30}, {10, 30}, {0, 10}}));
}

// A rank that stops: the reducing thread's timeout reaches the training thread in finish(),
// naming the rank and the step; the buckets are cut from the end, the first takes the rest.
TEST(AllReduceOverlap, ARankThatStopsIsNamedFromTheReducingThread) {
  const auto tr = transport();
  const std::string ep = tr->local_address("coordinator");
  Coordinator coord(*tr, ep, 2, std::chrono::milliseconds(100));
  std::string error;
  run_threads(2, [&](int r) {
    RendezvousClient rv(*tr, ep, r, 2, std::chrono::milliseconds(1000));
    auto coll = make("shm", rv);
    std::vector<float> g(100, 1.0f);
    BucketedAllreduce buckets(*coll, g.data(), g.size(), 30, 1.0);
    EXPECT_EQ(buckets.buckets(), 4u);  // [0, 10) [10, 40) [40, 70) [70, 100)
    for (long step = 0; step < 5; ++step) {
      if (r == 1 && step == 3) return;  // rank 1 stops after step 2
      rv.report_step(step);
      std::fill(g.begin(), g.end(), 1.0f);
      buckets.start(step);
      for (std::size_t lo : {70u, 40u, 10u, 0u}) buckets.ready(lo);
      try {
        buckets.finish();
      } catch (const std::runtime_error& e) {
        error = e.what();
        return;
      }
      EXPECT_EQ(g, std::vector<float>(100, 2.0f)) << "step " << step;
    }
  });
  EXPECT_NE(error.find("all-reduce of step 3 on rank 0"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1 (at step 2"), std::string::npos) << error;
}

// A rank whose process exits ends the others' shared-memory wait at once (not at the timeout),
// naming it. Rank 1 is a forked process that joins the segment and exits.
TEST(AllReduceStops, ShmNamesARankWhoseProcessExitedWithoutWaitingTheTimeout) {
  const auto tr = transport();
  const std::string ep = tr->local_address("coordinator");
  Coordinator coord(*tr, ep, 2, std::chrono::milliseconds(100));
  const pid_t child = ::fork();
  if (child == 0) {
    int rc = 1;
    try {
      const auto own = comm::make_transport("tcp");  // nothing of the parent's ZeroMQ after fork
      RendezvousClient rv(*own, ep, 1, 2, std::chrono::seconds(20));
      make_shm_collective(rv);
      rc = 0;
    } catch (...) {
    }
    ::_exit(rc);  // no bye, no destructors: gone as a killed rank would be
  }
  ASSERT_GT(child, 0);
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  {
    RendezvousClient rv(*tr, ep, 0, 2, std::chrono::seconds(20));
    auto coll = make_shm_collective(rv);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank 1 did not join";
    std::vector<float> x(100, 1.0f);
    try {
      coll->allreduce_sum(x.data(), x.size(), 0);
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(error.find("all-reduce of step 0 on rank 0 failed: rank 1 (process " + std::to_string(child) + ") exited"),
            std::string::npos) << error;
  EXPECT_LT(waited, 10.0) << "waited for the 20 s timeout instead of noticing the exit";
}

// Defect this guards: cluster.transport = "auto" must reduce through shared memory when every
// rank is on one host, and the worker must say so; "tcp" keeps Gloo.
TEST(AllReduceTransports, AutoAndShmUseSharedMemoryOnOneHostTcpUsesGloo) {
  for (const std::string t : {"auto", "shm", "tcp"}) {
    const auto tr = transport();
    const std::string ep = tr->local_address("coordinator");
    Coordinator coord(*tr, ep, 2);
    std::vector<std::string> said(2);
    run_threads(2, [&](int r) {
      RendezvousClient rv(*tr, ep, r, 2, std::chrono::seconds(20));
      auto be = make_cpu_backend(1);
      const auto coll = make_collective(*be, rv, "127.0.0.1", t, "auto");
      said[std::size_t(r)] = coll->describe();
      coll->barrier();  // no rank goes (closing its connections) while another still connects
      rv.bye();
    });
    for (const auto& d : said) EXPECT_EQ(d.rfind(t == "tcp" ? "gloo" : "shared memory", 0), 0u) << t << ": " << d;
  }
}

// cluster.collective = "gloo" (and "auto" where ranks share a GPU) wraps a host collective for
// device buffers: through a staging buffer in host memory. On the CPU backend the copies are
// memcpys, so this checks the wrapping (sizes growing and shrinking, broadcast from a rank
// other than 0) against the exact sums, for Gloo and shm, and what the worker says.
TEST(HostStagedCollective, EqualsTheHostCollectiveItWraps) {
  for (const std::string kind : {"gloo", "shm"}) {
    const int W = 3;
    const auto tr = transport();
    const std::string ep = tr->local_address("coordinator");
    Coordinator coord(*tr, ep, W);
    std::vector<std::string> said(W);
    run_threads(W, [&](int r) {
      RendezvousClient rv(*tr, ep, r, W, std::chrono::seconds(20));
      auto be = make_cpu_backend(1);
      auto coll = make_host_staged_collective(rv, *be, make(kind, rv), "ranks 0, 1, 2 on GPU X of here");
      said[std::size_t(r)] = coll->describe();
      for (std::size_t n : {5u, 100003u, 7u, 300000u}) {
        std::vector<float> x = rank_data(n, r);
        coll->allreduce_sum(x.data(), n, 0);
        EXPECT_EQ(wrong_sums(x, W), 0) << kind << " rank " << r << " n " << n;
        std::vector<float> y(n, float(r));
        coll->broadcast(y.data(), n, 2);
        EXPECT_EQ(y, std::vector<float>(n, 2.0f)) << kind << " rank " << r << " n " << n;
      }
      coll->barrier();
      rv.bye();
    });
    for (const auto& d : said) {
      EXPECT_NE(d.find(" through host memory (ranks 0, 1, 2 on GPU X of here)"), std::string::npos) << d;
      EXPECT_EQ(d.rfind(kind == "shm" ? "shared memory" : "gloo", 0), 0u) << d;
    }
  }
}

TEST(HostStagedCollective, RanksSharingAGpuAreNamedByHostAndBusId) {
  EXPECT_EQ(ranks_sharing_a_gpu({"a|0000:17:00.0", "a|0000:65:00.0", "b|0000:17:00.0"}), "");
  EXPECT_EQ(ranks_sharing_a_gpu({"a|0000:17:00.0", "a|0000:17:00.0", "b|0000:17:00.0", "b|0000:17:00.0", "b|1"}),
            "ranks 0, 1 on GPU 0000:17:00.0 of a; ranks 2, 3 on GPU 0000:17:00.0 of b");
  EXPECT_EQ(ranks_sharing_a_gpu({"a|0000:17:00.0"}), "");
}

TEST(HostStagedCollective, NcclIsRefusedForCpuWorkers) {
  const auto tr = transport();
  const std::string ep = tr->local_address("coordinator");
  Coordinator coord(*tr, ep, 1);
  RendezvousClient rv(*tr, ep, 0, 1, std::chrono::seconds(20));
  auto be = make_cpu_backend(1);
  try {
    make_collective(*be, rv, "127.0.0.1", "tcp", "nccl");
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cluster.collective = \"nccl\" needs train.device = \"cuda\""),
              std::string::npos) << e.what();
  }
  // "gloo" and "auto" mean the host collective for CPU workers: the transport decides
  EXPECT_EQ(make_collective(*be, rv, "127.0.0.1", "tcp", "gloo")->describe().rfind("gloo", 0), 0u);
  rv.bye();
}

// The defect this guards (seen on an H100): two ranks on one GPU made NCCL fail at init
// ("Duplicate GPU detected"). With "auto" they all-reduce through host memory instead.
TEST(HostStagedCollective, TwoRanksOnOneGpuAllReduceThroughHostMemoryOrSkip) {
  PSLAB_SKIP_WITHOUT_GPU();
  const int W = 2;
  const auto tr = transport();
  const std::string ep = tr->local_address("coordinator");
  Coordinator coord(*tr, ep, W);
  std::vector<std::string> said(W);
  std::vector<std::vector<float>> got(W);
  run_threads(W, [&](int r) {
    RendezvousClient rv(*tr, ep, r, W, std::chrono::seconds(20));
    auto be = make_cuda_backend(0);
    const auto coll = make_collective(*be, rv, "127.0.0.1", "auto", "auto");
    said[std::size_t(r)] = coll->describe();
    DeviceBuffer<float> x(*be, 100003);
    std::vector<float> host(x.size());
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = float(int(i % 7) + r);
    be->copy_from_host(x.data(), host.data(), x.bytes());
    coll->allreduce_sum(x.data(), x.size(), 0);
    got[std::size_t(r)].resize(x.size());
    be->copy_to_host(got[std::size_t(r)].data(), x.data(), x.bytes());
    coll->barrier();
    rv.bye();
  });
  for (int r = 0; r < W; ++r) {
    EXPECT_NE(said[std::size_t(r)].find("through host memory (ranks 0, 1 on GPU "), std::string::npos) << said[std::size_t(r)];
    long wrong = 0;
    for (std::size_t i = 0; i < got[std::size_t(r)].size(); ++i) wrong += got[std::size_t(r)][i] != float(2 * int(i % 7) + 1);
    EXPECT_EQ(wrong, 0) << "rank " << r;
  }
}

TEST(Nccl, AllReduceOnOneGpuOrSkip) {
  if (!nccl_built()) PSLAB_GPU_UNAVAILABLE("this build has no NCCL collective (no CUDA toolkit / NCCL at configure time)");
  PSLAB_SKIP_WITHOUT_GPU();
  const auto tr = transport();
  const std::string ep = tr->local_address("coordinator");
  Coordinator coord(*tr, ep, 1);
  RendezvousClient rv(*tr, ep, 0, 1, std::chrono::seconds(20));
  const auto coll = make_nccl_collective(rv, 0);
  auto be = make_cuda_backend(0);
  DeviceBuffer<float> x(*be, 1000);
  std::vector<float> host(1000);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = float(i % 13);
  be->copy_from_host(x.data(), host.data(), x.bytes());
  be->synchronize();
  coll->allreduce_sum(x.data(), x.size(), 0);  // one rank: the sum is the input
  coll->broadcast(x.data(), x.size(), 0);
  coll->barrier();
  std::vector<float> back(1000);
  be->copy_to_host(back.data(), x.data(), x.bytes());
  EXPECT_EQ(back, host);
  rv.bye();
}

// Defect: RendezvousClient::wait(keys, timeout) ignored its timeout and waited the client's own
// timeout for each key in turn: k keys could take k x that long.
TEST(Rendezvous, WaitHasOneDeadlineForAllItsKeys) {
  const auto tr = transport();
  const std::string ep = tr->local_address("coordinator");
  Coordinator coord(*tr, ep, 1, std::chrono::milliseconds(100));
  RendezvousClient rv(*tr, ep, 0, 1, std::chrono::seconds(5));  // its own timeout: 5 s
  const auto t0 = std::chrono::steady_clock::now();
  try {
    rv.wait({"never-a", "never-b", "never-c"}, std::chrono::milliseconds(300));
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("\"never-a\" was not published within 0.3"), std::string::npos) << e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(waited, 4.0) << "the 300 ms timeout was not honoured (each key waited 5 s before)";
  rv.bye();
}

}  // namespace
