// The collectives (comm/collective.h) with 1, 2, 3 and 4 ranks as threads: Gloo over TCP
// loopback and shm through one shared segment, exact sums in 32 and 16 bits, replicas bitwise
// identical after training, a rank that stops or exits named with its step, the transport
// choosing the collective; the rendezvous (comm/rendezvous.h) and its watch of a silent rank.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "collectives.h"
#include "comm/collective.h"
#include "comm/half.h"
#include "comm/wire.h"
#include "harness.h"
#include "roles.h"
#include "run/setup.h"

using namespace pslab;
using test::rank_data;
using test::run_threads;
using test::temp_dir;
using test::wrong_sums;

namespace {

// (implementation, ranks)
class Collectives : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Collectives, AllReduceBroadcastAndBarrierAreExact) {
  const auto [kind, W] = GetParam();
  const auto tr = test::coordinator_transport();
  const std::string ep = tr->local_address("coordinator");
  Coordinator coord(*tr, ep, W);
  std::vector<std::vector<float>> results(static_cast<std::size_t>(W));
  run_threads(W, [&](int r) {
    RendezvousClient rv(*tr, ep, r, W, std::chrono::seconds(20));
    auto coll = test::host_collective(kind, rv);
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
  const auto tr = test::coordinator_transport();
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
      auto coll = test::host_collective(kind, rv);
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

// An f16 sum past 65504 (times the wire's scale) is clipped to it, and saturated_half counts it
// (the all-reduce rank says so once: nothing else would show it); bf16 holds it.
TEST_P(Collectives, AnF16SumPastItsRangeIsClippedAndCounted) {
  const auto [kind, W] = GetParam();
  const auto tr = test::coordinator_transport();
  const std::string ep = tr->local_address("coordinator-clip");
  Coordinator coord(*tr, ep, W);
  run_threads(W, [&](int r) {
    RendezvousClient rv(*tr, ep, r, W, std::chrono::seconds(20));
    auto coll = test::host_collective(kind, rv);
    std::vector<float> x(10, 70.0f), y(10, 70.0f);  // x 1024: 71680 > 65504 on each rank already
    coll->allreduce_sum_half(x.data(), x.size(), HalfFormat::f16, 1024.0f, 0);
    EXPECT_EQ(x[0], 65504.0f / 1024.0f) << "rank " << r;
    EXPECT_EQ(saturated_half(HalfFormat::f16, x.data(), x.size(), 1024.0f), 10u);
    coll->allreduce_sum_half(y.data(), y.size(), HalfFormat::bf16, 1024.0f, 1);
    EXPECT_EQ(y[0], 70.0f * float(W)) << "rank " << r;
    EXPECT_EQ(saturated_half(HalfFormat::bf16, y.data(), y.size(), 1024.0f), 0u);
    std::vector<float> small(10, 1.0f);
    EXPECT_EQ(saturated_half(HalfFormat::f16, small.data(), small.size(), 1024.0f), 0u);
    rv.bye();
  });
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

class AllReduceStops : public ::testing::TestWithParam<std::string> {};

// What a rank all-reduces at each step: 100 ones.
struct Ones {
  explicit Ones(Collective& coll) : coll(coll) {}
  void step(long s) { coll.allreduce_sum(x.data(), x.size(), s); }
  Collective& coll;
  std::vector<float> x = std::vector<float>(100, 1.0f);
};

TEST_P(AllReduceStops, ARankThatStopsMidRunIsNamedWithItsStep) {
  const std::string error = test::error_when_rank_1_stops_after_step_2<Ones>(GetParam());
  EXPECT_NE(error.find("all-reduce of step 3 on rank 0"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1 (at step 2"), std::string::npos) << error;
  if (GetParam() == "shm") {
    EXPECT_NE(error.find("shared-memory barrier 8 for rank 1 (at barrier 7)"), std::string::npos) << error;
  }
}

INSTANTIATE_TEST_SUITE_P(Collectives, AllReduceStops, ::testing::Values("gloo", "shm"));

// A rank whose process exits ends the others' shared-memory wait at once (not at the timeout),
// naming it. Rank 1 is a forked process that joins the segment and exits. Also when the first
// all-reduce outgrows the segment (a larger one is set up: its table of processes was empty,
// and rank 0 waited at its setup for the whole timeout).
TEST(AllReduceStops, ShmNamesARankWhoseProcessExitedWithoutWaitingTheTimeout) {
  for (const std::size_t floats : {std::size_t(100), std::size_t(1) << 17}) {
    SCOPED_TRACE(floats);
    const auto tr = test::coordinator_transport();
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
      std::vector<float> x(floats, 1.0f);
      try {
        coll->allreduce_sum(x.data(), x.size(), 0);
      } catch (const std::runtime_error& e) {
        error = e.what();
      }
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(error.find(" on rank 0 failed: rank 1 (process " + std::to_string(child) + ") exited"), std::string::npos)
        << error;
    EXPECT_LT(waited, 10.0) << "waited for the 20 s timeout instead of noticing the exit";
  }
}

// Defect this guards: cluster.transport = "auto" must reduce through shared memory when every
// rank is on one host, and the worker must say so; "tcp" keeps Gloo.
TEST(AllReduceTransports, AutoAndShmUseSharedMemoryOnOneHostTcpUsesGloo) {
  for (const std::string t : {"auto", "shm", "tcp"}) {
    const auto tr = test::coordinator_transport();
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
  const auto tr = test::coordinator_transport();
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
  // (not before its heartbeat: its silence counts from its last ask, up to a quarter heartbeat
  // before `silent`, so 0.3 s at least, less a wake-up's slack)
  EXPECT_GE(after, 0.25) << lost0.what;
  EXPECT_LT(after, 2 * hb.count()) << lost0.what;
  EXPECT_TRUE(lost1.what.empty()) << lost1.what;
}

// The coordinator's status as a rank reads it: the first other rank silent too long is named;
// its own entry, a rank that said Bye and statuses it cannot read (fields of the wrong type
// included: they must not throw on the watch's thread, which has no catch) name nobody.
TEST(GroupWatch, ReadsTheStatusAndNamesNobodyFromOneItCannotRead) {
  const std::string status = R"({"ranks": [{"age_s": 9.0, "step": 3}, {"done": true, "age_s": 9.0},
                                            {"age_s": 0.1, "step": 8}, {"age_s": 6.5, "step": 12}]})";
  EXPECT_EQ(GroupWatch::silent_rank(status, 0, 4, 5.0), "rank 3 lost: silent for 6.5 s at step 12 (cluster.heartbeat_s = 5)");
  EXPECT_EQ(GroupWatch::silent_rank(status, 2, 4, 5.0), "rank 0 lost: silent for 9.0 s at step 3 (cluster.heartbeat_s = 5)");
  EXPECT_EQ(GroupWatch::silent_rank(status, 0, 3, 5.0), "") << "rank 3 is not in a world of 3";
  for (const char* bad : {"", "not json", "[]", "7", R"({"ranks": 3})", R"({"ranks": [1, "x", null]})",
                          R"({"ranks": [{}, {"done": "yes", "age_s": "old", "step": []}]})"})
    EXPECT_EQ(GroupWatch::silent_rank(bad, 0, 2, 5.0), "") << bad;
  EXPECT_EQ(GroupWatch::silent_rank(R"({"ranks": [{}, {"done": 1, "age_s": 7, "step": "x"}]})", 0, 2, 5.0),
            "rank 1 lost: silent for 7.0 s at step -1 (cluster.heartbeat_s = 5)")
      << "a done that is not true is not done; a step that is not a number is unknown";
}

// A coordinator that stops answering (rank 0's process stopped or gone) is named by the others.
TEST(GroupWatch, NamesACoordinatorThatStopsAnswering) {
  const auto tr = test::coordinator_transport();
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

// Defect: RendezvousClient::wait(keys, timeout) ignored its timeout and waited the client's own
// timeout for each key in turn: k keys could take k x that long.
// The coordinator takes a key once (a second value would redirect a rank's link), requests from
// ranks of the group alone, and one Bye per rank (Byes sent again by one rank ended it early).
TEST(Rendezvous, KeysAreWrittenOnceAndByesCountedOncePerRank) {
  const auto tr = test::coordinator_transport();
  const std::string ep = tr->local_address("coordinator");
  auto coord = std::make_unique<Coordinator>(*tr, ep, 2, std::chrono::milliseconds(100));
  RendezvousClient r0(*tr, ep, 0, 2, std::chrono::seconds(5)), r1(*tr, ep, 1, 2, std::chrono::seconds(5));
  r0.set("gloo/rank_0", {'a'});
  r0.set("gloo/rank_0", {'a'});  // (the same value again: a resend)
  try {
    r1.set("gloo/rank_0", {'b'});
    ADD_FAILURE() << "a key was written twice";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("\"gloo/rank_0\" was published already"), std::string::npos) << e.what();
  }
  EXPECT_EQ(r1.get("gloo/rank_0"), std::vector<char>{'a'});
  RendezvousClient stranger(*tr, ep, 7, 2, std::chrono::seconds(5));
  EXPECT_THROW(stranger.set("x", {'x'}), std::runtime_error);
  r1.bye();
  r1.bye();
  const auto t0 = std::chrono::steady_clock::now();
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    r0.bye();
  });
  coord.reset();  // (waits for every rank's Bye: rank 0's comes 300 ms on)
  late.join();
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.25)
      << "rank 1's second Bye counted for rank 0's";
}

TEST(Rendezvous, WaitHasOneDeadlineForAllItsKeys) {
  const auto tr = test::coordinator_transport();
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
