#include "comm/liveness.h"

#include <algorithm>

namespace pslab::comm {

Liveness::Liveness(std::size_t peers, const Options& opt, time_point now) : opt_(opt), peers_(peers) {
  for (Peer& x : peers_) x.heard = x.sent = x.since = now, x.watched = opt.watch_all;
}

double Liveness::rejoining_s(std::size_t p, time_point now) const {
  const Peer& x = peers_[p];
  return x.state == State::rejoining ? seconds_between(x.since, now) : 0.0;
}

void Liveness::heard(std::size_t p, time_point now) {
  Peer& x = peers_[p];
  x.heard = now;
  if (x.state == State::silent) x.state = State::alive;
}

void Liveness::watch(std::size_t p, bool on, time_point now) {
  Peer& x = peers_[p];
  x.watched = on;
  if (on) x.heard = now;
}

void Liveness::hold(std::size_t p, time_point now) {
  Peer& x = peers_[p];
  if (x.state == State::gone) return;
  x.state = State::held;
  x.since = x.sent = now;  // the first Beat is owed beat_every after the hold
}

void Liveness::release(std::size_t p) {
  Peer& x = peers_[p];
  if (x.state == State::held) x.state = State::alive;
}

void Liveness::rejoin(std::size_t p, time_point now) {
  Peer& x = peers_[p];
  if (x.state == State::rejoining || x.state == State::gone) return;
  x.state = State::rejoining;
  x.since = now;
}

void Liveness::back(std::size_t p, time_point now) {
  Peer& x = peers_[p];
  if (x.state != State::rejoining) return;
  x.state = State::alive;
  x.heard = now;
}

void Liveness::revive(std::size_t p, time_point now) {
  Peer& x = peers_[p];
  x.state = State::alive;
  x.watched = true;
  x.heard = now;
}

Liveness::time_point Liveness::next_due(time_point now) const {
  time_point due = time_point::max();
  for (const Peer& x : peers_) {
    if (x.state == State::gone) continue;
    if (opt_.silence.count() && x.watched && (x.state == State::alive || x.state == State::held))
      due = std::min(due, x.heard + opt_.silence);
    if (opt_.beat_every.count() && (opt_.beat_all || x.state == State::held)) due = std::min(due, x.sent + opt_.beat_every);
  }
  return std::max(due, now);
}

}  // namespace pslab::comm
