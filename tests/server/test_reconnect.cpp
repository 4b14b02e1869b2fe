// Sessions that survive the network: every connection between the workers (and the evaluator) and
// a server goes through a proxy (tests/support/cut_proxy.h) that resets them all, mid-run, three
// times, as a failing link does; ZeroMQ makes them again, the servers see new peers. The run must
// finish as an undisturbed one does: no push lost, none applied twice (the servers count what they
// applied), nothing counted as lost, and under bsp θ bitwise equal to the undisturbed run's.
#include <gtest/gtest.h>

#include <exception>
#include <memory>
#include <thread>

#include "cut_proxy.h"
#include "harness.h"

namespace pslab {
namespace {

using test::Cluster;
using test::CutProxy;

struct Outcome {
  std::vector<float> theta;       // the servers' final θ
  long pushes = 0;                // applied, summed over servers
  long duplicates = 0;            // pushes that came again, answered and not applied
  long reconnects = 0;            // sessions moved to a new connection, summed over servers
  long updates_lost = 0;
  long cuts = 0;                  // cuts the proxies made
  std::vector<long> bytes;        // per server: bytes through its proxy
};

// Runs `cfg` (servers, workers and the evaluator as threads, over TCP, with the run's key when
// given) with every connection to server k through a proxy that cuts them all once cut_at[k][i]
// bytes have passed through it (no cuts: cut_at empty).
Outcome run_through_proxies(const ExperimentConfig& cfg, const comm::RunKey* key,
                            const std::vector<std::vector<long>>& cut_at) {
  Cluster cluster(cfg, false, /*wait_for_shutdown=*/true, key);
  std::vector<std::unique_ptr<CutProxy>> proxies;
  std::vector<std::string> via;
  for (std::size_t k = 0; k < cluster.endpoints.size(); ++k) {
    proxies.push_back(std::make_unique<CutProxy>(cluster.endpoints[k]));
    if (!cut_at.empty()) proxies.back()->cut_at(cut_at[k]);
    via.push_back(proxies.back()->address());
  }
  const auto dir = test::temp_dir("reconnect");
  const auto role = [&](int rank) {
    RoleOptions o;
    o.rank = rank;
    o.servers = via;
    o.out_dir = dir.string();
    o.progress = false;
    o.transport = cluster.transport.get();
    return o;
  };
  std::exception_ptr evaluator_error;
  std::thread evaluator([&] {
    try {
      run_evaluator(cfg, role(0));
    } catch (...) {
      evaluator_error = std::current_exception();
    }
  });
  std::exception_ptr workers_error;
  try {
    test::run_threads(cfg.cluster.workers, [&](int r) { run_ps_worker(cfg, role(r)); });
  } catch (...) {
    workers_error = std::current_exception();
    cluster.stop = true;  // the evaluator waits no longer than its timeout
  }
  evaluator.join();
  cluster.join();
  std::filesystem::remove_all(dir);
  if (workers_error) std::rethrow_exception(workers_error);
  if (evaluator_error) std::rethrow_exception(evaluator_error);
  cluster.rethrow();
  Outcome o;
  o.theta = cluster.params();
  for (std::size_t k = 0; k < cluster.servers.size(); ++k) {
    const Server& s = *cluster.servers[k];
    o.pushes += s.counters().pushes;
    o.duplicates += s.counters().pushes_duplicate;
    o.reconnects += s.counters().reconnects;
    o.updates_lost += s.updates_lost();
    EXPECT_TRUE(s.workers_lost().empty()) << "server " << k << " lost " << s.workers_lost().dump();
    o.cuts += proxies[k]->cuts();
    o.bytes.push_back(proxies[k]->bytes());
  }
  return o;
}

// bsp with 2 workers: a server sums a clock's pushes in the order they arrive, which differs
// between any two runs; a sum of two is the same either way, so that θ can be compared bitwise.
ExperimentConfig config(const std::string& mode) {
  ExperimentConfig cfg = test::small_config(mode, mode == "bsp" ? 2 : 3, 2, "tcp");
  cfg.train.steps = 120;
  cfg.cluster.heartbeat_s = 2;  // a cut is noticed within a Beat: half a second
  return cfg;
}

struct Case {
  std::string mode;
  bool curve;
};

class CutConnections : public ::testing::TestWithParam<Case> {};

TEST_P(CutConnections, ThreeTimesMidRunLoseNothingAndApplyNothingTwice) {
  const ExperimentConfig cfg = config(GetParam().mode);
  const comm::RunKey key = comm::make_run_key();
  const comm::RunKey* k = GetParam().curve ? &key : nullptr;
  const Outcome calm = run_through_proxies(cfg, k, {});
  const long W = cfg.cluster.workers, S = cfg.cluster.servers, steps = cfg.train.steps;
  ASSERT_EQ(calm.pushes, W * S * steps);
  ASSERT_EQ(calm.reconnects, 0);
  // Three cuts of every connection to each server, at a quarter, half and three quarters of the
  // bytes an undisturbed run sends through it.
  std::vector<std::vector<long>> cut_at;
  for (long b : calm.bytes) cut_at.push_back({b / 4, b / 2, 3 * b / 4});
  const Outcome cut = run_through_proxies(cfg, k, cut_at);
  EXPECT_EQ(cut.cuts, 3 * S) << "the proxies did not cut as often as asked";
  EXPECT_GE(cut.reconnects, 3 * S) << "a cut connection must come back as a new session at its server";
  EXPECT_EQ(cut.pushes, W * S * steps) << "every push applied exactly once (" << cut.duplicates << " came again)";
  EXPECT_EQ(cut.updates_lost, 0);
  if (GetParam().mode == "bsp") { EXPECT_EQ(cut.theta, calm.theta) << "bsp: θ bitwise equal to the undisturbed run's"; }
}

INSTANTIATE_TEST_SUITE_P(Modes, CutConnections,
                         ::testing::Values(Case{"asp", false}, Case{"ssp:2", false}, Case{"bsp", false},
                                           Case{"asp", true}, Case{"bsp", true}, Case{"dcasgd:0.1", false}),
                         [](const auto& i) {
                           std::string m = i.param.mode;
                           std::erase(m, ':');
                           std::erase(m, '.');
                           return m + (i.param.curve ? "_curve" : "_tcp");
                         });

}  // namespace
}  // namespace pslab
