// Which of a process's peers are alive, judged by when each was last heard from: one small
// state machine per peer. A server keeps one for its workers, a worker's client one for its
// servers (cluster.heartbeat_s: a peer that waits on another, or is waited on, sends it a
// message or a Beat at least every heartbeat_s / 4, so one silent for heartbeat_s has stopped,
// hangs, or is gone).
//
//                  hold()                       silence (nothing heard for `silence`)
//    alive  ----------------->  held            alive, held  ------------------------->  silent
//           <-----------------                                 rejoin()                   |
//                  release()                    alive  <---------------  rejoining  <------'
//                                                        back()
//    any  --finish()-->  gone (said Bye, or dropped): never watched, never beaten again
//    gone --revive()-->  alive (a dropped worker taken back)
//
//   alive      heard from within `silence` (or not watched: nobody expects to hear from it)
//   held       this side holds a request of the peer's (a pull its rule holds) and owes it a
//              Beat every `beat_every`, so that the peer knows this side is alive
//   silent     watched, and nothing heard for `silence`
//   rejoining  silent, and asked to say Hello again (a server restarted from its checkpoint,
//              cluster.on_server_loss = "restart"); back() when it has
//
// Who is watched: a server watches every worker once the run has started (watch_all); a client
// watches a server while it waits for that server's reply (watch()). Who is owed Beats: a
// server owes them to the workers it holds; a client to every server it has sent nothing to
// for beat_every (beat_all).
//
// Threading: one thread at a time (the owner's).
#pragma once

#include <cstddef>
#include <vector>

#include "core/clock.h"

namespace pslab::comm {

class Liveness {
 public:
  enum class State { alive, held, silent, rejoining, gone };
  using time_point = RunClock::time_point;
  using duration = RunClock::duration;
  struct Options {
    duration silence{};     // watched and silent this long: silent (0: never)
    duration beat_every{};  // a Beat to each peer owed one, this often (0: none)
    bool watch_all = false; // every peer is watched from the start (else: watch())
    bool beat_all = false;  // every peer is owed Beats (else: the held ones)
  };
  Liveness(std::size_t peers, const Options& opt, time_point now);

  std::size_t size() const { return peers_.size(); }
  State state(std::size_t p) const { return peers_[p].state; }
  bool gone(std::size_t p) const { return peers_[p].state == State::gone; }
  // Seconds since p was last heard from.
  double silent_s(std::size_t p, time_point now) const { return seconds_between(peers_[p].heard, now); }
  // Seconds since p started rejoining (0 when it is not).
  double rejoining_s(std::size_t p, time_point now) const;

  // A message from p. It is alive again unless held (it stays held) or rejoining (that ends
  // with back(): its answer to the Hello).
  void heard(std::size_t p, time_point now);
  // A message to p: a Beat is owed only `beat_every` after the last one.
  void sent(std::size_t p, time_point now) { peers_[p].sent = now; }
  // Starts (silence counting from now) or stops watching p.
  void watch(std::size_t p, bool on, time_point now);
  void hold(std::size_t p, time_point now);
  void release(std::size_t p);
  void rejoin(std::size_t p, time_point now);
  void back(std::size_t p, time_point now);
  void finish(std::size_t p) { peers_[p].state = State::gone; }
  // A gone peer is back (a worker dropped as silent whose link came back): alive and watched.
  void revive(std::size_t p, time_point now);

  // Every watched peer, alive or held, silent for longer than `silence` at `now` becomes
  // silent, and fn(p) is called for it (once: then it is silent, or whatever fn made it).
  template <typename F>
  void check_silence(time_point now, F&& fn) {
    if (opt_.silence.count() == 0) return;
    for (std::size_t p = 0; p < peers_.size(); ++p) {
      Peer& x = peers_[p];
      if (!x.watched || (x.state != State::alive && x.state != State::held) || now - x.heard <= opt_.silence) continue;
      x.state = State::silent;
      fn(p);
    }
  }
  // fn(p) for every peer owed a Beat now (nothing sent to it for beat_every); fn returns
  // whether the Beat left (then the next one is owed beat_every from now).
  template <typename F>
  void beats_due(time_point now, F&& fn) {
    if (opt_.beat_every.count() == 0) return;
    for (std::size_t p = 0; p < peers_.size(); ++p) {
      Peer& x = peers_[p];
      const bool owed = opt_.beat_all ? x.state != State::gone : x.state == State::held;
      if (owed && now - x.sent >= opt_.beat_every && fn(p)) x.sent = now;
    }
  }
  // fn() when peer p is owed a Beat now (as beats_due, for one peer: a server's held workers).
  template <typename F>
  void beat_if_due(std::size_t p, time_point now, F&& fn) {
    Peer& x = peers_[p];
    const bool owed = opt_.beat_all ? x.state != State::gone : x.state == State::held;
    if (opt_.beat_every.count() && owed && now - x.sent >= opt_.beat_every && fn()) x.sent = now;
  }
  // When peer p is next owed a Beat (if it is owed any).
  time_point next_beat(std::size_t p) const {
    return opt_.beat_every.count() ? peers_[p].sent + opt_.beat_every : time_point::max();
  }
  // The earliest time a check or a Beat may be due (the owner's next wake-up).
  time_point next_due(time_point now) const;

 private:
  struct Peer {
    State state = State::alive;
    time_point heard{}, sent{}, since{};  // since: the start of holding or rejoining
    bool watched = false;
  };
  Options opt_;
  std::vector<Peer> peers_;
};

}  // namespace pslab::comm
