// The liveness state machine (comm/liveness.h) on its own, in made-up time: what is heard,
// held, watched and sent decides who is silent, who is owed a Beat, and when to look again.
#include <gtest/gtest.h>

#include <vector>

#include "comm/liveness.h"

using namespace pslab;
using namespace std::chrono_literals;
using comm::Liveness;
using State = Liveness::State;

namespace {

const RunClock::time_point t0 = RunClock::time_point(1h);

Liveness::Options options(bool watch_all, bool beat_all) {
  Liveness::Options o;
  o.silence = 4s;
  o.beat_every = 1s;
  o.watch_all = watch_all;
  o.beat_all = beat_all;
  return o;
}

std::vector<std::size_t> silent_at(Liveness& l, RunClock::time_point t) {
  std::vector<std::size_t> out;
  l.check_silence(t, [&](std::size_t p) { out.push_back(p); });
  return out;
}

std::vector<std::size_t> beats_at(Liveness& l, RunClock::time_point t) {
  std::vector<std::size_t> out;
  l.beats_due(t, [&](std::size_t p) {
    out.push_back(p);
    return true;
  });
  return out;
}

}  // namespace

// A server's view of its workers: all watched; the one not heard for `silence` is silent, once;
// one heard again is alive; one gone is never silent.
TEST(Liveness, AWatchedPeerNotHeardForTheSilenceIsSilentOnce) {
  Liveness l(3, options(true, false), t0);
  l.heard(0, t0 + 3s);
  l.finish(2);
  EXPECT_TRUE(silent_at(l, t0 + 4s).empty()) << "silence is more than 4 s, not 4 s";
  EXPECT_EQ(silent_at(l, t0 + 4s + 1ms), std::vector<std::size_t>{1});
  EXPECT_EQ(l.state(1), State::silent);
  EXPECT_TRUE(silent_at(l, t0 + 10s).size() == 1) << "worker 0 falls silent later; worker 1 is reported once";
  EXPECT_DOUBLE_EQ(l.silent_s(1, t0 + 10s), 10.0);
  l.heard(1, t0 + 11s);
  EXPECT_EQ(l.state(1), State::alive);
  EXPECT_TRUE(l.gone(2));
}

// A client's view of its servers: only a server whose reply is awaited is watched, from the
// moment the wait begins.
TEST(Liveness, OnlyAWatchedPeerCanFallSilentAndItsSilenceCountsFromTheWatch) {
  Liveness l(2, options(false, true), t0);
  EXPECT_TRUE(silent_at(l, t0 + 100s).empty());
  l.watch(1, true, t0 + 100s);
  EXPECT_TRUE(silent_at(l, t0 + 103s).empty());
  EXPECT_EQ(silent_at(l, t0 + 105s), std::vector<std::size_t>{1});
  l.watch(1, false, t0 + 105s);
  l.heard(1, t0 + 106s);
  EXPECT_TRUE(silent_at(l, t0 + 200s).empty());
}

// A server owes Beats to the workers it holds, every beat_every from the hold; a client to
// every server it has sent nothing to for beat_every.
TEST(Liveness, BeatsGoToHeldPeersOrToEveryQuietPeer) {
  Liveness server(3, options(true, false), t0);
  EXPECT_TRUE(beats_at(server, t0 + 10s).empty()) << "nobody held";
  server.hold(1, t0 + 10s);
  EXPECT_EQ(server.state(1), State::held);
  EXPECT_TRUE(beats_at(server, t0 + 10s + 999ms).empty());
  EXPECT_EQ(beats_at(server, t0 + 11s), std::vector<std::size_t>{1});
  EXPECT_TRUE(beats_at(server, t0 + 11s + 500ms).empty()) << "the next one a beat_every after the last";
  server.heard(1, t0 + 11s + 600ms);
  EXPECT_EQ(server.state(1), State::held) << "a message from a held peer does not release it";
  server.release(1);
  EXPECT_EQ(server.state(1), State::alive);
  EXPECT_TRUE(beats_at(server, t0 + 20s).empty());

  Liveness client(3, options(false, true), t0);
  client.sent(0, t0 + 5s);
  client.finish(2);
  EXPECT_EQ(beats_at(client, t0 + 5s + 500ms), std::vector<std::size_t>{1});
  EXPECT_EQ(beats_at(client, t0 + 6s), std::vector<std::size_t>{0});
  // A Beat that could not leave is owed again at once.
  std::vector<std::size_t> tried;
  client.beats_due(t0 + 8s, [&](std::size_t p) {
    tried.push_back(p);
    return false;
  });
  EXPECT_EQ(tried, (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(beats_at(client, t0 + 8s), (std::vector<std::size_t>{0, 1}));
}

// A silent server asked to say Hello again is rejoining: not silent again while it is, and back
// (alive, silence counting from then) when it answers; its rejoining time is measured.
TEST(Liveness, ARejoiningPeerIsNotSilentUntilItIsBack) {
  Liveness l(1, options(false, true), t0);
  l.watch(0, true, t0);
  ASSERT_EQ(silent_at(l, t0 + 5s).size(), 1u);
  l.rejoin(0, t0 + 5s);
  EXPECT_EQ(l.state(0), State::rejoining);
  EXPECT_TRUE(silent_at(l, t0 + 50s).empty());
  EXPECT_DOUBLE_EQ(l.rejoining_s(0, t0 + 12s), 7.0);
  l.heard(0, t0 + 13s);
  EXPECT_EQ(l.state(0), State::rejoining) << "only its answer to the Hello ends a rejoin";
  l.back(0, t0 + 14s);
  EXPECT_EQ(l.state(0), State::alive);
  EXPECT_DOUBLE_EQ(l.rejoining_s(0, t0 + 15s), 0.0);
  EXPECT_TRUE(silent_at(l, t0 + 18s).empty());
  EXPECT_EQ(silent_at(l, t0 + 18s + 1ms).size(), 1u);
}

// The owner's next wake-up: the earliest silence or Beat due, never in the past; none at all
// (max) when nothing is watched or owed.
TEST(Liveness, TheNextDueTimeIsTheEarliestSilenceOrBeat) {
  Liveness l(2, options(true, false), t0);
  EXPECT_EQ(l.next_due(t0), t0 + 4s);
  l.heard(0, t0 + 2s);
  l.heard(1, t0 + 3s);
  EXPECT_EQ(l.next_due(t0 + 3s), t0 + 6s);
  l.hold(1, t0 + 3s);
  EXPECT_EQ(l.next_due(t0 + 3s), t0 + 4s) << "a Beat to the held peer";
  EXPECT_EQ(l.next_due(t0 + 9s), t0 + 9s) << "overdue: now";
  l.finish(0);
  l.finish(1);
  EXPECT_EQ(l.next_due(t0 + 9s), RunClock::time_point::max());
}
