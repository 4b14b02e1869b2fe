// The replay's delivery policy (src/sim/replay.h) on its own: messages handed to it as a
// simulated transport would, what it lets through to the server recorded.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "comm/wire.h"
#include "sim/replay.h"
#include "sim/scheduler.h"

using namespace pslab;
using namespace pslab::sim;
namespace fs = std::filesystem;

namespace {

class Replay : public ::testing::Test {
 protected:
  // A run directory whose server 0 recorded `trace`.
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pslab-test-replay-" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "trace");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void record(const std::string& trace) { std::ofstream(dir_ / "trace" / "server0.txt") << trace; }

  SimMessage message(int sender, const wire::Body& body, const std::string& from) {
    SimMessage m;
    const auto h = enc_.encode(wire::Header{sender, 0, body});
    m.header.assign(h.begin(), h.end());
    m.from = from;
    return m;
  }
  // A message from worker w arrives at the server; what the policy lets through is noted.
  void arrive(ReplayPolicy& p, int w, const wire::Body& body) {
    p.arrived("server", message(w, body, std::to_string(w)), [this](SimMessage&& m) {
      std::string why;
      through_.emplace_back(wire::body_name(wire::decode(m.header.data(), m.header.size(), why)->body), m.from);
    });
  }
  // The server answers worker w's pull: piece `piece` of `pieces` of version `version`.
  void answer(ReplayPolicy& p, int w, long clock, long version, std::uint32_t piece = 0, std::uint32_t pieces = 1) {
    wire::PullReply r;
    r.clock = clock, r.version = version, r.piece = piece, r.pieces = pieces;
    const auto h = enc_.encode(wire::Header{wire::kServer, 0, r});
    p.sent("server", std::to_string(w), h);
  }
  wire::Push push_piece(long clock, std::uint32_t piece, std::uint32_t pieces) {
    wire::Push m;
    m.clock = clock, m.batch = 32, m.then_pull = true, m.piece = piece, m.pieces = pieces;
    return m;
  }

  fs::path dir_;
  wire::Encoder enc_;
  std::vector<std::pair<std::string, std::string>> through_;  // {body, from} of what went through
};

// Worker 0's push+pull in pieces is answered piece by piece as its pieces are applied; the run
// served worker 1's first pull after that push's version was published. The replay lets that
// pull through only once the last piece of the answer has left: after the first, the server
// would serve it the version before the push (the shard is at version 0, the run served 1).
TEST_F(Replay, APullAfterAPushAnsweredInPiecesWaitsForItsLastPiece) {
  record("pull 0 0 0\npush 0 0 0 32\npull 0 1 1\npull 1 0 1\n");
  Scheduler sched;
  ReplayPolicy p(sched, dir_.string(), {"server"}, 2);
  arrive(p, 0, wire::Hello{wire::Role::worker, 0});
  arrive(p, 1, wire::Hello{wire::Role::worker, 1});
  arrive(p, 0, wire::Pull{0});
  answer(p, 0, 0, 0);
  for (std::uint32_t q = 0; q < 3; ++q) arrive(p, 0, push_piece(0, q, 3));
  arrive(p, 1, wire::Pull{0});
  through_.clear();
  answer(p, 0, 1, 1, 0, 3);
  answer(p, 0, 1, 1, 1, 3);
  EXPECT_TRUE(through_.empty()) << through_.front().first << " of " << through_.front().second;
  answer(p, 0, 1, 1, 2, 3);
  ASSERT_EQ(through_.size(), 1u);
  EXPECT_EQ(through_[0].first, "Pull");
  EXPECT_EQ(through_[0].second, "1");  // (worker 1's id)
  answer(p, 1, 0, 1);
  EXPECT_NO_THROW(p.check_complete());
}

}  // namespace
