// The liveness of a server's workers (comm/liveness.h): Beats to the workers whose pulls it
// holds, workers silent for cluster.heartbeat_s dropped (asp, ssp) or named in an error, and a
// worker rejoining a server restarted from its checkpoint, or back on a new connection.
#include <algorithm>
#include <cstdio>

#include "server.h"

namespace pslab {

void Server::find_lost_workers(time_point now) {
  if (!barrier_open_) return;  // before it, the start barrier's own timeout names who is missing
  // Nobody heard for heartbeat_s: this server is the one cut off (or every worker stopped at
  // once); check_waits() names them all after timeout_s.
  if (seconds_between(last_message_, now) > cfg_.cluster.heartbeat_s) return;
  workers_.check_silence(now, [&](std::size_t w) {
    const int r = int(w);
    lose_worker(r, workers_.silent_s(w, now));  // (throws, naming it, where the run cannot go on without it)
  });
  await_silent_workers(now);
}

void Server::await_silent_workers(time_point now) {
  const double window = std::chrono::duration<double>(reconnect_window_).count();
  for (std::size_t r = 0; r < awaited_.size(); ++r) {
    if (!awaited_[r]) continue;
    const double silent_s = workers_.silent_s(r, now);
    if (workers_.state(r) != comm::Liveness::State::silent) {  // heard again: its link is back
      awaited_[r] = 0;
      std::fprintf(stderr, "server %d: worker %zu is back at clock %ld: training goes on\n", opt_.shard, r,
                   state_->clock_of(int(r)));
    } else if (silent_s > cfg_.cluster.heartbeat_s + window) {
      char why[160];
      std::snprintf(why, sizeof why, "silent for %.1f s at clock %ld (cluster.heartbeat_s = %g, and cluster.reconnect_s = %g "
                    "more for its link to come back)", silent_s, state_->clock_of(int(r)), cfg_.cluster.heartbeat_s, window);
      drop_worker(int(r), why, {{"silent_s", silent_s}});  // throws: the run cannot go on without it
    }
  }
}

void Server::beat_held_pulls(time_point now) {
  for (const HeldPull& h : held_)  // (held workers only: the others are owed none)
    workers_.beat_if_due(std::size_t(h.rank), now, [&] {
      // Not a reply: not counted in bytes_out (the summary's bytes_pulled); a Beat that cannot
      // leave is one the worker's own timeout covers.
      (void)listener_->send(h.identity, enc_.encode(header(wire::Beat{state_->version()})));
      return true;
    });
}

void Server::watch_open_pushes(time_point now) {
  if (!state_->pushes_open()) return;
  const auto timeout = std::chrono::duration<double>(cfg_.cluster.timeout_s);
  const auto beat_every = std::chrono::duration<double>(cfg_.cluster.heartbeat_s / 4);
  for (int r = 0; r < cfg_.cluster.workers; ++r) {
    const auto [arrived, pieces] = state_->open_push(r);
    if (pieces == 0) continue;
    Pushing& p = pushing_[std::size_t(r)];
    if (arrived == pieces || now - p.last_piece <= timeout) {  // (all came: it waits for its turn)
      if (now - std::max(p.last_piece, p.last_beat) >= beat_every) {  // (a Beat that cannot leave: its own timeout covers it)
        (void)listener_->send(worker_ids_[std::size_t(r)], enc_.encode(header(wire::Beat{state_->version()})));
        p.last_beat = now;
      }
      continue;
    }
    char why[200];
    std::snprintf(why, sizeof why, "push of worker %d for clock %ld: piece %zu of %zu did not come within %g s (cluster.timeout_s); "
                  "nothing of it applied", r, long(p.first.clock), arrived + 1, pieces, cfg_.cluster.timeout_s);
    abandon_in_shard(r);
    reply_error(worker_ids_[std::size_t(r)], wire::ErrorCode::timeout, why);
    std::fprintf(stderr, "server %d: timeout: %s\n", opt_.shard, why);
  }
}

void Server::rejoin(int rank, long clock) {
  const long was = state_->clock_of(rank);
  long lost = 0;
  try {
    lost = state_->fast_forward(rank, clock);
  } catch (const std::logic_error& e) {
    throw std::runtime_error("server " + std::to_string(opt_.shard) + ": worker " + std::to_string(rank) +
                             " rejoined at clock " + std::to_string(clock) + ": " + e.what());
  }
  updates_lost_ += lost;
  if (trace_) trace_->event("rejoin " + std::to_string(rank) + " " + std::to_string(clock));
  std::fprintf(stderr, "server %d: worker %d rejoined at clock %ld (this server's %s had it at %ld: %ld update(s) lost)\n",
               opt_.shard, rank, clock, opt_.restarted ? "initial state" : "checkpoint", was, lost);
  if (!metrics_) return;
  metrics_->write({{"kind", "worker_rejoined"}, {"shard", opt_.shard}, {"worker", rank}, {"clock", clock},
                   {"checkpoint_clock", was}, {"updates_lost", lost}});
  metrics_->flush();
}

void Server::resume_session(int rank, const std::string& id, long clock) {
  const std::size_t r = std::size_t(rank);
  const std::string old = worker_ids_[r];
  if (old != id) {
    peers_.erase(old);
    std::replace(welcome_waiting_.begin(), welcome_waiting_.end(), old, id);  // (at the start barrier)
  }
  worker_ids_[r] = id;
  peers_[id] = Peer{wire::Role::worker, rank};
  workers_.heard(r, clock_.now());
  // What it had under way is sent again once it has its Welcome: a push half-way in pieces is
  // abandoned (nothing of it applied), a held pull forgotten (its answer would go nowhere).
  abandon_in_shard(rank);
  pushing_[r].streamed_reply = false;
  for (std::size_t i = 0; i < held_.size();) {
    if (held_[i].rank != rank) {
      ++i;
      continue;
    }
    held_.erase(held_.begin() + std::ptrdiff_t(i));
    workers_.release(r);
  }
  ++counters_.reconnects;
  if (counters_.reconnects <= 10 || counters_.reconnects % 100 == 0)
    std::fprintf(stderr, "server %d: worker %d is back on a new connection at clock %ld (this server's clock for it: %ld; "
                 "%ld reconnect(s) so far)\n", opt_.shard, rank, clock, state_->clock_of(rank), counters_.reconnects);
  if (!metrics_) return;
  metrics_->write({{"kind", "worker_reconnected"}, {"shard", opt_.shard}, {"worker", rank}, {"clock", clock},
                   {"server_clock", state_->clock_of(rank)}});
}

void Server::lose_worker(int rank, double silent_s) {
  char why[200];
  const double window = std::chrono::duration<double>(reconnect_window_).count();
  if (!continue_on_loss_ && window > 0) {  // the run cannot go on without it: wait for its link to come back
    awaited_[std::size_t(rank)] = 1;
    std::fprintf(stderr, "server %d: worker %d silent for %.1f s at clock %ld: waiting up to %g s more for it to come back "
                 "(cluster.reconnect_s; %s cannot train on without it)\n", opt_.shard, rank, silent_s,
                 state_->clock_of(rank), window, cfg_.cluster.mode.c_str());
    return;
  }
  std::snprintf(why, sizeof why, "silent for %.1f s at clock %ld (cluster.heartbeat_s = %g)%s", silent_s, state_->clock_of(rank),
                cfg_.cluster.heartbeat_s, window > 0 ? "; taken back if it speaks again within cluster.reconnect_s" : "");
  drop_worker(rank, why, {{"silent_s", silent_s}, {"may_return_s", window}});
  may_return_until_[std::size_t(rank)] = clock_.now() + reconnect_window_;
}

bool Server::may_return(int rank) const {
  return clock_.now() <= may_return_until_[std::size_t(rank)] && finished_ < cfg_.cluster.workers;
}

void Server::readmit(int rank) {
  const std::size_t r = std::size_t(rank);
  const auto now = clock_.now();
  const double away_s = seconds_between(may_return_until_[r] - reconnect_window_, now);
  may_return_until_[r] = time_point::min();
  replicate(wire::ReplicaEvent::readmit, rank);
  state_->readmit_worker(rank);
  if (guard_) guard_->readmit(rank);
  --finished_;
  workers_.revive(r, now);
  for (std::size_t i = 0; i < losses_.size(); ++i)
    if (losses_[i]["worker"] == rank) {
      losses_.erase(i);
      break;
    }
  ++counters_.workers_back;
  if (trace_) trace_->event("readmit " + std::to_string(rank));
  std::fprintf(stderr, "server %d: worker %d is back at clock %ld, %.1f s after it was dropped as silent: taken back "
               "(cluster.reconnect_s)\n", opt_.shard, rank, state_->clock_of(rank), away_s);
  if (!metrics_) return;
  metrics_->write({{"kind", "worker_back"}, {"shard", opt_.shard}, {"worker", rank}, {"clock", state_->clock_of(rank)},
                   {"away_s", away_s}});
  metrics_->flush();
}

void Server::drop_worker(int rank, const std::string& why, const nlohmann::ordered_json& record) {
  if (!continue_on_loss_)
    throw std::runtime_error(who() + ": worker " + std::to_string(rank) + " lost: " + why + "; " +
                             (state_->mode().trains_without_lost_workers() ? "cluster.on_worker_loss = \"fail\""
                                                                           : cfg_.cluster.mode + " cannot train on without it"));
  replicate(wire::ReplicaEvent::drop, rank, state_->clock_of(rank));
  state_->abandon_push(rank, *this);  // its push in pieces, half-way: nothing of it applied
  state_->drop_worker(rank);
  if (guard_) guard_->forget(rank);
  ++finished_;
  workers_.finish(std::size_t(rank));
  if (trace_) trace_->event("drop " + std::to_string(rank));
  const long clock = state_->clock_of(rank);
  nlohmann::ordered_json lost = {{"worker", rank}, {"clock", clock}};
  for (const auto& [k, v] : record.items()) lost[k] = v;
  losses_.push_back(lost);
  std::fprintf(stderr, "server %d: worker %d lost: %s; training goes on without it (cluster.on_worker_loss)\n", opt_.shard,
               rank, why.c_str());
  for (std::size_t i = 0; i < held_.size();) {  // its held pull, if it hangs rather than died
    if (held_[i].rank != rank) {
      ++i;
      continue;
    }
    const HeldPull h = held_[i];
    held_.erase(held_.begin() + std::ptrdiff_t(i));
    send(h.identity, header(wire::Error{wire::ErrorCode::protocol, "worker " + std::to_string(rank) +
                                                                       " was dropped from this run as lost"}));
  }
  if (!metrics_) return;
  nlohmann::ordered_json line = {{"kind", "worker_lost"}, {"shard", opt_.shard}};
  for (const auto& [k, v] : lost.items()) line[k] = v;
  metrics_->write(line);
  metrics_->flush();
}

}  // namespace pslab
