// The all-reduce worker (worker/), its ranks as threads: all-reduce == bsp on the parameter
// servers, the evaluator's snapshot port refusing bad messages, a timeout naming the rank that did
// not arrive, checkpoints that resume bitwise, and buckets all-reduced as backward finishes them.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "comm/bucketed_allreduce.h"
#include "collectives.h"
#include "comm/collective.h"
#include "comm/wire.h"
#include "harness.h"
#include "ps/checkpoint.h"
#include "roles.h"
#include "run/setup.h"
#include "comm/snapshots.h"

using namespace pslab;
using test::run_threads;
using test::temp_dir;

namespace {

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
    EXPECT_NE(std::string(e.what()).find("no θ snapshot (nor a sign of life) from rank 0 within 1 s"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("12 bad message(s) dropped"), std::string::npos) << e.what();
  }
  EXPECT_EQ(theta, good);
  EXPECT_EQ(rx.dropped_by_reason(), (std::map<std::string, long>{
                                        {"malformed", 3}, {"not a snapshot", 3}, {"wrong size", 3}, {"bad checksum", 3}}));
}

// Only rank 0's connection (the first to send a snapshot or a sign of life) is taken: another one,
// or a header from another rank, with a θ of its own and a good checksum, is dropped and counted.
TEST_P(Snapshots, OnlyRankZerosConnectionIsTaken) {
  auto t = comm::make_transport(GetParam());
  const std::string at = t->local_address("snapshots");
  SnapshotReceiver rx(*t, at, /*timeout_s=*/1.0);
  const std::size_t n = 10;
  std::vector<float> good(n, 0.5f), forged(n, 9.0f), theta(n, -7.0f);
  wire::Encoder enc;
  auto snapshot = [&](int sender, const std::vector<float>& x, long step, bool final) {
    return enc.encode(wire::Header{sender, -1, wire::PullReply{step, step, 0, 10 * step, 0, final,
                                                               wire::checksum(x.data(), n), 0, n, 0, n * sizeof(float)}});
  };
  auto rank0 = t->connect({at}), other = t->connect({at});
  const auto in5s = [] { return comm::after(std::chrono::seconds(5)); };
  ASSERT_TRUE(rank0->send(0, snapshot(0, good, 1, false), comm::OutPayload{good.data(), n * 4}, in5s()));
  Snapshot s = rx.next(theta.data(), n);
  EXPECT_EQ(theta, good);
  ASSERT_TRUE(other->send(0, snapshot(0, forged, 2, true), comm::OutPayload{forged.data(), n * 4}, in5s()));
  ASSERT_TRUE(rank0->send(0, snapshot(1, forged, 3, true), comm::OutPayload{forged.data(), n * 4}, in5s()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(rank0->send(0, snapshot(0, good, 4, true), comm::OutPayload{good.data(), n * 4}, in5s()));
  s = rx.next(theta.data(), n);
  EXPECT_EQ(theta, good);
  EXPECT_EQ(s.step, 4);
  EXPECT_EQ(rx.dropped_by_reason().at("not from rank 0"), 2);
}

// Snapshots further apart than the timeout (eval.every_epochs, a long epoch): rank 0's signs of
// life in between keep the evaluator waiting, and are not snapshots. It gave up after the timeout.
TEST_P(Snapshots, SignsOfLifeKeepTheEvaluatorWaitingForALateSnapshot) {
  auto t = comm::make_transport(GetParam());
  const std::string at = t->local_address("snapshots");
  SnapshotReceiver rx(*t, at, /*timeout_s=*/1.0);
  const std::size_t n = 100;
  std::vector<float> good(n, 0.25f), theta(n, -7.0f);
  std::thread rank0([&] {
    SnapshotSender tx(*t, at, /*interval_s=*/600, /*timeout_s=*/1.0);
    for (int i = 0; i < 50; ++i) {  // 2.5 s of steps, no snapshot due
      tx.keep_alive(i, 10L * i);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    tx.send(good.data(), n, 50, 500, /*final=*/true);
  });
  Snapshot s;
  std::string error;
  try {
    s = rx.next(theta.data(), n);
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  rank0.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(s.step, 50);
  EXPECT_EQ(theta, good);
  EXPECT_EQ(s.dropped, 0);
}

// Defect (CI, launcher.Evaluations): rank 0 sent θ0 (eval.every_epochs) before the evaluator
// listened, at once, and it was lost: the curve began at the first tick. A snapshot that must
// arrive waits for an evaluator that is still starting.
TEST_P(Snapshots, TheFirstSnapshotWaitsForAnEvaluatorThatListensLate) {
  auto t = comm::make_transport(GetParam());
  const std::string at = t->local_address("snapshots");
  const std::size_t n = 100;
  std::vector<float> theta0(n, 0.75f), theta(n, -7.0f);
  std::string error;
  std::atomic<bool> taken{false};
  std::thread rank0([&] {
    try {
      SnapshotSender tx(*t, at, /*interval_s=*/600, /*timeout_s=*/5.0);
      tx.send(theta0.data(), n, 0, 0, /*final=*/false, /*wait=*/true);
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);  // (θ0 lost: the final one comes first)
      while (!taken && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      tx.send(theta0.data(), n, 1, 10, /*final=*/true);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the evaluator starts late
  SnapshotReceiver rx(*t, at, /*timeout_s=*/5.0);
  const Snapshot s = rx.next(theta.data(), n);
  taken = true;
  if (s.step == 0) rx.next(theta.data(), n);  // (the final one)
  rank0.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(s.step, 0) << "θ0 was lost: the first snapshot taken is step " << s.step << "'s";
}

// Defect (CI, launcher.Evaluations): under eval.every_epochs each snapshot is a tick of the
// curve, but the evaluator took the newest of those waiting: one still starting when θ0 and the
// first tick had come evaluated the tick only. Each is taken, in order; under eval.interval_s the
// newest (it catches up).
TEST_P(Snapshots, EveryEpochsTakesEachSnapshotInOrderAnIntervalTheNewest) {
  auto t = comm::make_transport(GetParam());
  for (const bool each : {true, false}) {
    SCOPED_TRACE(each ? "each" : "newest");
    const std::string at = t->local_address(each ? "each" : "newest");
    SnapshotReceiver rx(*t, at, /*timeout_s=*/5.0, each);
    const std::size_t n = 10;
    std::vector<float> theta(n);
    {
      SnapshotSender tx(*t, at, /*interval_s=*/600, /*timeout_s=*/5.0);
      for (long step = 0; step < 2; ++step) {
        std::vector<float> x(n, float(step));
        ASSERT_TRUE(tx.send(x.data(), n, step, 10 * step, /*final=*/step == 1, /*wait=*/true));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // both wait at the evaluator
      Snapshot s = rx.next(theta.data(), n);
      EXPECT_EQ(s.step, each ? 0 : 1);
      EXPECT_EQ(theta[0], each ? 0.0f : 1.0f);
      if (each) {
        s = rx.next(theta.data(), n);
        EXPECT_EQ(s.step, 1);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, Snapshots, ::testing::Values("tcp", "shm"), [](const auto& i) { return i.param; });

TEST(AllReduceTimeouts, TimeoutNamesTheRankThatDidNotArrive) {
  ExperimentConfig cfg = test::small_config("allreduce", 2, 1);
  cfg.cluster.timeout_s = 1.0;
  const auto tr = test::coordinator_transport();
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

// ---- checkpoints: rank 0 writes θ and the optimizer's state; a resumed run goes on bitwise ----

// 20 steps written to a checkpoint (momentum: its velocity too), then a run of 50 steps resumed
// from it, gives bitwise the θ of 50 steps straight. (The 20-step run's checkpoint is relabelled
// with the 50-step config's fingerprint, which counts the steps.)
// A checkpoint that cannot be written (a full disk, a directory gone) costs the checkpoint, not
// the run: rank 0 says so and trains on, as a server does. Rank 0 exited, and the run failed.
TEST(AllReduceCheckpoint, ACheckpointThatCannotBeWrittenDoesNotEndTheRun) {
  const ExperimentConfig cfg = test::small_config("allreduce", 2, 1);
  const auto dir = temp_dir("ar_ckpt_unwritable");
  const auto theta = test::run_allreduce_workers(cfg, dir, [&](RoleOptions& o) {
    o.checkpoint = (dir / "no such directory" / "allreduce.ckpt").string();
  });
  EXPECT_EQ(theta[0], theta[1]);
  EXPECT_FALSE(std::filesystem::exists(dir / "no such directory"));
  std::filesystem::remove_all(dir);
}

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
  // A rank whose host holds another copy of the file (an older one): refused, naming both steps
  // (the ranks all-reduced gradients of other batches, and parted at the end).
  ExperimentConfig quick = full;  // (a rank that failed waits for the others' Bye up to timeout_s)
  quick.cluster.timeout_s = 2;
  c.config_hash = config_fingerprint(quick);
  write_checkpoint(path, c);
  const std::string older = (dir / "older.ckpt").string();
  c.version = 10, c.samples_applied = c.samples_applied / 2;
  write_checkpoint(older, c);
  try {
    test::run_allreduce_workers(quick, dir, [&](RoleOptions& o) {
      o.checkpoint = o.rank == 1 ? older : path;
      o.resume = true;
    });
    ADD_FAILURE() << "the ranks resumed from different steps";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("the ranks must resume from one file"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
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

// cluster.overlap = "auto" decides from each host's cores and processes; the ranks of one group
// must decide alike (buckets on one, one whole all-reduce on another: sizes that do not match).
// Here rank 0's host has the cores, rank 1's not: neither overlaps.
TEST(AllReduceOverlap, RanksOnHostsThatDecideApartAllReduceAlike) {
  ExperimentConfig cfg = test::small_config("allreduce", 2, 1, "tcp");
  cfg.data.dim = 784;
  cfg.model.hidden = {64};
  cfg.train.steps = 5;
  cfg.cluster.bucket_kb = 16;
  cfg.cluster.timeout_s = 5;
  const auto dir = temp_dir("ar_overlap_auto");
  const auto whole = test::run_allreduce_workers(cfg, dir);
  cfg.cluster.overlap = AutoBool{};
  const auto decided = test::run_allreduce_workers(cfg, dir, [](RoleOptions& o) { o.procs_on_host = o.rank == 0 ? 1 : 1000; });
  std::filesystem::remove_all(dir);
  EXPECT_EQ(decided, whole);
}

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
  const auto tr = test::coordinator_transport();
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
  // A rank's gradient: 100 ones, all-reduced in the buckets [0, 10) [10, 40) [40, 70) [70, 100).
  struct Buckets {
    explicit Buckets(Collective& coll) : buckets(coll, g.data(), g.size(), 30, 1.0) {
      EXPECT_EQ(buckets.buckets(), 4u);
    }
    void step(long s) {
      std::fill(g.begin(), g.end(), 1.0f);
      buckets.start(s);
      for (std::size_t lo : {70u, 40u, 10u, 0u}) buckets.ready(lo);
      buckets.finish();
      EXPECT_EQ(g, std::vector<float>(100, 2.0f)) << "step " << s;
    }
    std::vector<float> g = std::vector<float>(100, 1.0f);
    BucketedAllreduce buckets;
  };
  const std::string error = test::error_when_rank_1_stops_after_step_2<Buckets>("shm");
  EXPECT_NE(error.find("all-reduce of step 3 on rank 0"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1 (at step 2"), std::string::npos) << error;
}

}  // namespace
