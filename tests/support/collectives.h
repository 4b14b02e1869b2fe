// Helpers for the tests of the collectives (tests/comm) and of what is built on them (the
// all-reduce worker, the GPU collectives): a coordinator's transport, a host collective by name,
// and data whose sum over the ranks is exact in any order.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/collective.h"
#include "comm/rendezvous.h"
#include "comm/transport/transport.h"
#include "harness.h"

namespace pslab::test {

// The coordinator's transport in these tests (Gloo itself always runs over TCP).
inline std::unique_ptr<comm::Transport> coordinator_transport() { return comm::make_transport("tcp"); }

// A collective of one implementation ("gloo" or "shm").
inline std::unique_ptr<Collective> host_collective(const std::string& kind, RendezvousClient& rv) {
  return kind == "shm" ? make_shm_collective(rv) : make_gloo_collective(rv, "127.0.0.1");
}

// Rank r's integer-valued data (the sum is exact in any order), and how many of the n sums of
// W ranks' data in x are wrong.
inline std::vector<float> rank_data(std::size_t n, int r) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = float(int((r + 1) * 3 + i % 11) - 5);
  return x;
}
inline long wrong_sums(const std::vector<float>& x, int W) {
  long wrong = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    long want = 0;
    for (int q = 0; q < W; ++q) want += (q + 1) * 3 + long(i % 11) - 5;
    wrong += x[i] != float(want);
  }
  return wrong;
}

// Two ranks as threads, each with a collective of `kind` on one coordinator that takes a rank
// silent for 100 ms for lost (a rank waits at most 1 s). Each rank makes a Rank(collective),
// then runs its step(s) for s = 0, 1, ..., 4, reporting s first; rank 1 stops after step 2.
// A step that throws ends its rank; returns what it said ("" if no step threw).
template <typename Rank>
std::string error_when_rank_1_stops_after_step_2(const std::string& kind) {
  const auto tr = coordinator_transport();
  const std::string ep = tr->local_address("coordinator");
  Coordinator coord(*tr, ep, 2, std::chrono::milliseconds(100));
  std::string error;
  run_threads(2, [&](int r) {
    RendezvousClient rv(*tr, ep, r, 2, std::chrono::milliseconds(1000));
    auto coll = host_collective(kind, rv);
    Rank rank(*coll);
    for (long step = 0; step < 5; ++step) {
      if (r == 1 && step == 3) return;  // rank 1 stops after step 2
      rv.report_step(step);
      try {
        rank.step(step);
      } catch (const std::runtime_error& e) {
        error = e.what();
        return;
      }
    }
  });
  return error;
}

}  // namespace pslab::test
