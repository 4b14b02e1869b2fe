// Every message a server takes: checked (transport, header, sender, shard), then answered.
// Hello and the start barrier, pulls (served now, or held until the mode's rule allows them),
// pushes, progress polls, Bye, Shutdown, Beats and Stats.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "server.h"

namespace pslab {

namespace {

void free_param_buffer(void*, void* hint) { ParamVersions::release(static_cast<ParamVersions::Buffer*>(hint)); }
void free_encoded_buffer(void*, void* hint) { EncodedVersions::release(static_cast<EncodedVersions::Buffer*>(hint)); }

}  // namespace

void Server::handle(const comm::PeerId& id, const comm::Message& m) {
  const long bad_before = counters_.bad_total(), bytes = long(m.wire_bytes());
  handle_message(id, m);
  (counters_.bad_total() > bad_before ? counters_.bytes_bad : counters_.bytes_in) += bytes;
}

void Server::handle_message(const comm::PeerId& id, const comm::Message& m) {
  if (!m.malformed().empty()) {
    if (id.empty()) ++counters_.bad["malformed"];  // nobody to answer
    else reply_error(id, wire::ErrorCode::malformed, m.malformed());
    return;
  }
  std::string why;
  const std::optional<wire::Header> h = wire::decode(m.header(), why);
  if (!h) return reply_error(id, wire::ErrorCode::malformed, why);
  if (m.has_payload() && !std::holds_alternative<wire::Push>(h->body))
    return reply_error(id, wire::ErrorCode::wrong_size, std::string("a payload frame after a ") + wire::body_name(h->body));
  if (const auto* hello = std::get_if<wire::Hello>(&h->body)) return on_hello(id, *hello);
  Peer* peer = sender(id, *h);
  if (!peer) return;
  if (const auto* p = std::get_if<wire::Pull>(&h->body)) {
    if (p->progress_only) return serve_progress(id, *peer, p->clock);
    ++counters_.pulls;
    on_pull(id, *peer, p->clock);
  } else if (const auto* push = std::get_if<wire::Push>(&h->body)) {
    on_push(id, *peer, *push, msg_);
  } else if (std::holds_alternative<wire::Bye>(h->body)) {
    on_bye(id, *peer);
  } else if (std::holds_alternative<wire::Shutdown>(h->body)) {
    on_shutdown(id, *peer);
  } else if (std::holds_alternative<wire::Beat>(h->body)) {
    // A heartbeat: the peer is alive (noted by sender()); no answer.
  } else if (const auto* r = std::get_if<wire::Replicated>(&h->body)) {
    on_replicated(id, *r);
  } else if (std::holds_alternative<wire::Stats>(h->body)) {
    send(id, header(wire::StatsReply{stats_json().dump()}));
  } else {
    reply_error(id, wire::ErrorCode::unknown_type, std::string("a server does not take ") + wire::body_name(h->body));
  }
}

Server::Peer* Server::sender(const comm::PeerId& id, const wire::Header& h) {
  auto it = peers_.find(id);
  if (it == peers_.end()) {
    reply_error(id, wire::ErrorCode::unknown_peer,
                std::string(wire::body_name(h.body)) + " from a connection that has not said Hello");
    return nullptr;
  }
  Peer& peer = it->second;
  if (h.sender != peer.rank) {
    reply_error(id, wire::ErrorCode::unknown_peer,
                "sender " + std::to_string(h.sender) + " on a connection that said Hello as " + std::to_string(peer.rank));
    return nullptr;
  }
  if (peer.role == wire::Role::worker && state_->dropped(peer.rank) && !said_bye_[std::size_t(peer.rank)]) {
    if (!may_return(peer.rank)) {
      reply_error(id, wire::ErrorCode::protocol, "worker " + std::to_string(peer.rank) +
                                                     " was dropped from this run as lost (silent for more than "
                                                     "cluster.heartbeat_s); it cannot rejoin");
      return nullptr;
    }
    readmit(peer.rank);  // its link was down, and is back in time
  }
  if (peer.role == wire::Role::replica) replica_heard_ = clock_.now();
  if (peer.role == wire::Role::worker) {
    const auto now = clock_.now();
    // This server heard no worker for heartbeat_s (its own link was down): the silence was its
    // own, so every worker gets heartbeat_s from now to be heard again, not just the first.
    if (barrier_open_ && seconds_between(last_message_, now) > cfg_.cluster.heartbeat_s)
      for (std::size_t r = 0; r < std::size_t(cfg_.cluster.workers); ++r) workers_.watch(r, true, now);
    last_message_ = now;
    workers_.heard(std::size_t(peer.rank), last_message_);
  }
  const bool about_shard = std::holds_alternative<wire::Pull>(h.body) || std::holds_alternative<wire::Push>(h.body);
  if (about_shard && h.shard != opt_.shard) {
    reply_error(id, wire::ErrorCode::wrong_shard,
                "message for shard " + std::to_string(h.shard) + " reached server " + std::to_string(opt_.shard));
    return nullptr;
  }
  return &peer;
}

// ---- Hello and the start barrier ----

void Server::on_hello(const std::string& id, const wire::Hello& m) {
  const int W = cfg_.cluster.workers;
  if (m.param_count != num_params_)
    return reply_error(id, wire::ErrorCode::config, "peer has a model of " + std::to_string(m.param_count) +
                                                        " parameters, this server's has " + std::to_string(num_params_) +
                                                        ": are both started from the same config?");
  if (m.config_hash != config_hash_)
    return reply_error(id, wire::ErrorCode::config, "peer's config differs from this server's (fingerprints differ): "
                                                    "start every process of a run from the same config file");
  // A backup serves the shard once its primary is gone: silent to it for half of heartbeat_s when
  // a worker, the evaluator or a new backup (the launcher saw the primary end) comes to it. While
  // its primary is heard, they are sent back there (so one peer cut off from the primary does not
  // make two servers of a shard).
  if (is_backup()) {
    if (!barrier_open_ || !primary_gone())
      return send(id, header(wire::Error{wire::ErrorCode::backup, "server " + std::to_string(opt_.shard) +
                                                                       " here is a backup: its primary at " + opt_.backup_of +
                                                                       (barrier_open_ ? " serves the shard" : " has not sent it the shard")}));
    take_over(m.role == wire::Role::worker ? "worker " + std::to_string(m.rank)
              : m.role == wire::Role::replica ? std::string("a new backup") : std::string("the evaluator"));
  }
  if (m.role == wire::Role::replica) return on_replica_hello(id, m);
  if (m.role != wire::Role::worker && m.role != wire::Role::evaluator)
    return reply_error(id, wire::ErrorCode::protocol, "Hello with an unknown role " + std::to_string(int(m.role)));
  if (m.role == wire::Role::evaluator) {
    peers_[id] = Peer{m.role, wire::kEvaluator};
  } else {
    if (m.rank < 0 || m.rank >= W)
      return reply_error(id, wire::ErrorCode::protocol,
                         "worker rank " + std::to_string(m.rank) + " is not in [0, " + std::to_string(W) + ")");
    if (m.rejoin_clock > total_steps_)  // (taken as its clock, it would count updates lost that never were)
      return reply_error(id, wire::ErrorCode::protocol,
                         "worker " + std::to_string(m.rank) + " says it is back at clock " + std::to_string(m.rejoin_clock) +
                             ", beyond the run's " + std::to_string(total_steps_) + " steps");
    std::string& slot = worker_ids_[std::size_t(m.rank)];
    const bool resumes = !slot.empty() && m.rejoin_clock >= 0;  // its connection came back: the session moves to it
    const bool finished = said_bye_[std::size_t(m.rank)] != 0;  // (dropped at its Bye: its link may come back to resend it)
    if (state_->dropped(m.rank) && !finished && !may_return(m.rank))
      return reply_error(id, wire::ErrorCode::protocol,
                         "worker " + std::to_string(m.rank) + " was dropped from this run as lost; it cannot rejoin");
    if (!resumes && !slot.empty() && slot != id)  // (refused before anything changes: it takes no one back)
      return reply_error(id, wire::ErrorCode::protocol,
                         "worker " + std::to_string(m.rank) + " already said Hello from another connection");
    if (state_->dropped(m.rank) && !finished) readmit(m.rank);  // its link was down, and is back in time
    if (resumes) {
      resume_session(m.rank, id, m.rejoin_clock);
    } else {
      slot = id;
      peers_[id] = Peer{m.role, m.rank};
      workers_.heard(std::size_t(m.rank), clock_.now());
      // This server restarted (a backup that took over has every update it answered: the worker
      // sends again what was not).
      if (m.rejoin_clock >= 0 && barrier_open_ && opt_.backup_of.empty()) rejoin(m.rank, m.rejoin_clock);
    }
  }
  if (m.role == wire::Role::evaluator || barrier_open_) return send(id, welcome(id));
  open_barrier_when_full(id);
}

void Server::open_barrier_when_full(const std::string& id) {
  welcome_waiting_.push_back(id);
  if (!std::all_of(worker_ids_.begin(), worker_ids_.end(), [](const std::string& s) { return !s.empty(); })) return;
  if (replica_expected_ && !replicating()) return;  // its backup first (cluster.replicas = 2)
  barrier_open_ = true;
  replicate(wire::ReplicaEvent::barrier, -1);
  last_message_ = clock_.now();
  for (std::size_t r = 0; r < worker_ids_.size(); ++r) workers_.watch(r, true, last_message_);
  for (const auto& w : welcome_waiting_) send(w, welcome(w));
  welcome_waiting_.clear();
}

// Each worker is told its clock here (a server resumed from a checkpoint: where it goes on).
wire::Header Server::welcome(const std::string& to) const {
  const Peer& p = peers_.at(to);
  return header(wire::Welcome{opt_.shard, cfg_.cluster.servers, range_.offset, range_.length, cfg_.cluster.workers,
                              state_->mode().name(), state_->version(),
                              p.role == wire::Role::worker ? state_->clock_of(p.rank) : 0});
}

std::string Server::missing_hellos() const {
  std::string m;
  for (int r = 0; r < cfg_.cluster.workers; ++r)
    if (worker_ids_[std::size_t(r)].empty()) m += (m.empty() ? "workers " : ", ") + std::to_string(r);
  if (replica_expected_ && !replicating()) m += std::string(m.empty() ? "" : " and ") + "its backup (cluster.replicas = 2)";
  return m.empty() ? "nobody" : m;
}

// ---- pulls ----

void Server::on_pull(const std::string& id, const Peer& p, long clock) {
  const auto now = clock_.now();
  if (p.role == wire::Role::evaluator) return serve_pull(id, p.rank, clock, now);
  if (p.role != wire::Role::worker)  // (its rank indexes no worker's clock or liveness)
    return reply_error(id, wire::ErrorCode::protocol, "a Pull from its backup: only workers and the evaluator pull");
  if (clock != state_->clock_of(p.rank))
    return reply_error(id, wire::ErrorCode::protocol, "pull for clock " + std::to_string(clock) + " from worker " +
                                                          std::to_string(p.rank) + ", whose clock here is " +
                                                          std::to_string(state_->clock_of(p.rank)));
  if (state_->pull_ready(clock)) return serve_pull(id, p.rank, clock, now);
  if (const std::string why = held_for_good(clock); !why.empty())
    return reply_error(id, wire::ErrorCode::protocol, "pull of worker " + std::to_string(p.rank) + " for clock " +
                                                          std::to_string(clock) + ": " + why);
  for (HeldPull& h : held_)
    if (h.rank == p.rank) {  // its pull again: one is held, answered on the latest connection
      h = HeldPull{id, p.rank, clock, h.clock == clock ? h.since : now};
      return;
    }
  held_.push_back(HeldPull{id, p.rank, clock, now});
  workers_.hold(std::size_t(p.rank), now);
  ++counters_.pulls_held;
}

void Server::serve_pull(const std::string& id, int rank, long clock, time_point since) {
  const double held_s = seconds_between(since, clock_.now());
  ParamVersions& pv = state_->params();
  wire::PullReply r{clock, state_->version(), state_->min_clock(), state_->samples_applied(), long(held_s * 1e6),
                    finished() == cfg_.cluster.workers, state_->current_checksum(), range_.offset, range_.length,
                    /*codec: dense f32*/ 0, range_.length * sizeof(float)};
  note_served(rank, clock, held_s, r);
  if (pull_encoded_ && rank >= 0) {  // cluster.pull_codec: workers get θ encoded (the evaluator f32)
    EncodedVersions::Buffer* e = pull_encoded_->acquire(pv.current(), state_->version());  // released once sent
    r.codec = pull_encoded_->wire_id();
    r.bytes = e->size;
    r.checksum = e->checksum;
    send(id, header(r), comm::OutPayload{e->bytes.data(), e->size, &free_encoded_buffer, e});
  } else if (state_->pieces() == 1) {
    ParamVersions::Buffer* buf = pv.acquire_current();  // released by the transport once sent
    send(id, header(r), comm::OutPayload{buf->data, pv.size() * sizeof(float), &free_param_buffer, buf});
  } else {  // in pieces (cluster.piece_kib), back to back: the worker copies one while the next travels
    r.pieces = std::uint32_t(state_->pieces());
    for (std::size_t q = 0; q < state_->pieces(); ++q) send_piece(id, r, q, state_->piece_checksum(q), pv.acquire_current());
  }
}

void Server::note_served(int rank, long clock, double held_s, const wire::PullReply& r) {
  counters_.hold_ms_total += held_s * 1e3;
  counters_.hold_ms_max = std::max(counters_.hold_ms_max, held_s * 1e3);
  if (rank >= 0 && state_->mode().keeps_served_theta()) replicate(wire::ReplicaEvent::pulled, rank, clock);
  if (rank >= 0) state_->record_pull(rank, clock);
  if (trace_ && rank >= 0) trace_->pull(rank, clock, state_->version());
  if (opt_.record_pulls && metrics_ && rank >= 0)
    metrics_->write({{"kind", "pull"}, {"worker", rank}, {"clock", clock}, {"min_clock", r.min_clock},
                     {"version", r.version}, {"held_ms", held_s * 1e3}});
}

void Server::serve_progress(const std::string& id, const Peer& p, long asked) {
  if (p.role != wire::Role::evaluator)
    return reply_error(id, wire::ErrorCode::protocol, "a progress-only Pull from worker " + std::to_string(p.rank) +
                                                          ": only the evaluator asks for progress without θ");
  ++counters_.progress_polls;
  send(id, header(wire::PullReply{asked, state_->version(), state_->min_clock(), state_->samples_applied(),
                                  0, finished() == cfg_.cluster.workers, 0, range_.offset, /*length*/ 0, /*codec*/ 0,
                                  /*bytes*/ 0}));
}

void Server::release_ready_pulls() {
  for (std::size_t i = 0; i < held_.size();) {
    if (!state_->pull_ready(held_[i].clock)) {
      ++i;
      continue;
    }
    const HeldPull h = held_[i];
    held_.erase(held_.begin() + std::ptrdiff_t(i));
    workers_.release(std::size_t(h.rank));
    serve_pull(h.identity, h.rank, h.clock, h.since);
  }
}

std::string Server::held_for_good(long clock) const {
  if (state_->mode().trains_without_lost_workers()) return "";  // (a worker that said Bye was dropped)
  for (int r = 0; r < cfg_.cluster.workers; ++r)
    if (said_bye_[std::size_t(r)] && state_->clock_of(r) < clock)
      return "worker " + std::to_string(r) + " said Bye at clock " + std::to_string(state_->clock_of(r)) + ": " +
             state_->mode().name() + " serves clock " + std::to_string(clock) + " once every worker has pushed clock " +
             std::to_string(clock - 1) + " (every worker must run the same steps)";
  return "";
}

void Server::refuse_pulls_held_for_good() {
  for (std::size_t i = 0; i < held_.size();) {
    const std::string why = held_for_good(held_[i].clock);
    if (why.empty()) {
      ++i;
      continue;
    }
    const HeldPull h = held_[i];
    held_.erase(held_.begin() + std::ptrdiff_t(i));
    workers_.release(std::size_t(h.rank));
    reply_error(h.identity, wire::ErrorCode::protocol,
                "pull of worker " + std::to_string(h.rank) + " for clock " + std::to_string(h.clock) + ": " + why);
  }
}

void Server::expire_held_pulls(time_point now) {
  const auto timeout = std::chrono::duration<double>(cfg_.cluster.timeout_s);
  for (std::size_t i = 0; i < held_.size();) {
    if (now - held_[i].since <= timeout) {
      ++i;
      continue;
    }
    const HeldPull h = held_[i];
    held_.erase(held_.begin() + std::ptrdiff_t(i));
    workers_.release(std::size_t(h.rank));
    char b[64];
    std::snprintf(b, sizeof b, " held %.1f s: ", seconds_between(h.since, now));
    reply_error(h.identity, wire::ErrorCode::timeout,
                "pull of worker " + std::to_string(h.rank) + " for clock " + std::to_string(h.clock) + b + state_->why_held(h.clock));
    std::fprintf(stderr, "server %d: timeout: pull of worker %d for clock %ld: %s\n", opt_.shard, h.rank, h.clock,
                 state_->why_held(h.clock).c_str());
  }
}

// ---- pushes ----

std::string Server::refuse_push(const Peer& p, const wire::Push& m, const comm::Message& msg, wire::ErrorCode& code) const {
  if (p.role != wire::Role::worker) return code = wire::ErrorCode::protocol, "only workers push";
  const PushCodec& codec = state_->codec();
  const std::size_t pieces = codec.dense_f32() ? state_->pieces() : 1;
  if (m.piece >= m.pieces || (m.pieces != 1 && m.pieces != pieces))
    return code = wire::ErrorCode::protocol, "push piece " + std::to_string(m.piece) + " of " + std::to_string(m.pieces) +
                                                 "; server " + std::to_string(opt_.shard) + " takes pushes in " +
                                                 std::to_string(pieces) + " (cluster.piece_kib, cluster.codec)";
  const Pieces& cut = state_->options().pieces;
  const std::size_t lo = m.pieces == 1 ? 0 : cut.begin(range_.length, m.piece);
  const std::size_t n = m.pieces == 1 ? range_.length : cut.size(range_.length, m.piece);
  if (m.offset != range_.offset + lo || m.length != n)
    return code = wire::ErrorCode::wrong_shard,
           "push for floats [" + std::to_string(m.offset) + ", " + std::to_string(m.offset + m.length) + ") as piece " +
               std::to_string(m.piece) + " of " + std::to_string(m.pieces) + "; server " + std::to_string(opt_.shard) +
               " holds [" + std::to_string(range_.offset) + ", " + std::to_string(range_.offset + range_.length) +
               "), whose piece is [" + std::to_string(range_.offset + lo) + ", " + std::to_string(range_.offset + lo + n) + ")";
  if (m.codec != codec.wire_id())
    return code = wire::ErrorCode::config, "push encoded with codec id " + std::to_string(m.codec) +
                                               "; this run's cluster.codec is \"" + codec.name() + "\" (id " +
                                               std::to_string(codec.wire_id()) + ")";
  const std::size_t got = msg.has_payload() ? msg.payload().size() : 0, most = codec.max_bytes(m.length);
  if (!msg.has_payload() || got != m.bytes || got > most)
    return code = wire::ErrorCode::wrong_size, "push payload of " + std::to_string(got) + " bytes; the header says " +
                                                   std::to_string(m.bytes) + " bytes, " + codec.name() + " of " +
                                                   std::to_string(m.length) + " floats takes at most " + std::to_string(most);
  return "";
}

void Server::on_push(const std::string& id, const Peer& p, const wire::Push& m, const comm::Message& msg) {
  wire::ErrorCode code{};
  if (const std::string why = refuse_push(p, m, msg, code); !why.empty()) {
    reply_error(id, code, why);
    if (p.role == wire::Role::worker) abandon_in_shard(p.rank);  // nothing of its push in pieces applied
    return;
  }
  if (m.clock < state_->clock_of(p.rank)) return on_duplicate_push(id, p, m);
  Pushing& pushing = pushing_[std::size_t(p.rank)];
  if (m.piece == 0) pushing = Pushing{m, "", 0, false, {}, {}, {}};
  pushing.bytes += long(msg.payload().size());
  pushing.last_piece = clock_.now();
  if (guard_ && guard_refuses(p.rank, m, msg)) return;  // its payload goes back with the next receive
  // The shard references the payload until the push ends (push_ended): the message is held
  // and another takes its place for the next receive.
  const std::span<const std::byte> payload = msg_.payload();
  held_msgs_[std::size_t(p.rank)].push_back(std::move(msg_));
  if (!spare_msgs_.empty()) {
    msg_ = std::move(spare_msgs_.back());
    spare_msgs_.pop_back();
  } else {
    msg_ = comm::Message();
  }
  push_to_shard(p.rank, m, payload, m.checksum);
}

// A push for a clock this server has taken from the worker already: sent again after a cut
// connection lost its answer (or duplicated on the way). Answered as the first was, never
// applied again.
void Server::on_duplicate_push(const std::string& id, const Peer& p, const wire::Push& m) {
  if (m.piece + 1 < m.pieces) return;  // answered at its last piece
  if (++counters_.pushes_duplicate <= 3)
    std::fprintf(stderr, "server %d: worker %d's push for clock %ld came again (this server has its clock at %ld): "
                 "answered, not applied again\n", opt_.shard, p.rank, m.clock, state_->clock_of(p.rank));
  if (!m.then_pull || m.clock + 1 != state_->clock_of(p.rank))
    return send(id, header(wire::PushAck{m.clock, state_->version()}));
  // Its pull is served again, later than the push it came with: a replay cannot re-execute that.
  if (trace_) trace_->event("again " + std::to_string(p.rank) + " " + std::to_string(m.clock + 1));
  ++counters_.pulls;
  on_pull(id, p, m.clock + 1);
}

// ---- the push guard (push_guard.h) ----

bool Server::guard_refuses(int rank, const wire::Push& m, const comm::Message& msg) {
  Pushing& pushing = pushing_[std::size_t(rank)];
  if (pushing.refused.empty()) {
    pushing.refused = guard_check(rank, m, msg.payload());
    if (pushing.refused.empty()) return false;
    abandon_in_shard(rank);  // its pieces so far: nothing of them kept
    pushing.streamed_reply = false;     // (the reply starts again from piece 0: PsClient takes that)
    const long n = guard_->refusals(rank) + 1;
    if (n <= 3 || n % 100 == 0)
      std::fprintf(stderr, "server %d: refused worker %d's push for clock %ld: %s (cluster.push_guard; %ld refused so far)\n",
                   opt_.shard, rank, m.clock, pushing.refused.c_str(), n);
    const bool drop = guard_->refused(rank);
    if (drop && !continue_on_loss_) {
      // The run cannot go on without it (bsp, on_worker_loss = "fail"): its pushes go on being
      // refused, each an empty batch.
      if (guard_->streak(rank) == guard_->options().drop_after)
        std::fprintf(stderr, "server %d: worker %d refused %ld pushes in a row; not dropped (%s): its pushes go on being "
                     "refused as empty batches\n", opt_.shard, rank, n,
                     state_->mode().trains_without_lost_workers() ? "cluster.on_worker_loss = \"fail\""
                                                                  : (cfg_.cluster.mode + " cannot train on without it").c_str());
    } else if (drop) {
      const std::string why = "refused " + std::to_string(guard_->options().drop_after) + " pushes in a row by the push guard (" +
                              pushing.refused + ")";
      drop_worker(rank, why, {{"refused", n}, {"reason", pushing.refused}});
      send(worker_ids_[std::size_t(rank)], header(wire::Error{wire::ErrorCode::protocol, "worker " + std::to_string(rank) +
                                                                                             " was dropped from this run: " + why}));
      return true;
    }
  }
  if (m.piece + 1 >= m.pieces) push_empty_instead(rank);
  return true;
}

std::string Server::guard_check(int rank, const wire::Push& m, std::span<const std::byte> payload) {
  if (m.piece == 0)
    if (std::string why = guard_->check_batch(m.batch); !why.empty()) return why;
  const PushCodec& codec = state_->codec();
  // Fewer bytes than the floats it claims (the header's byte count agrees): the shard refuses it,
  // saying so; nothing reads past them.
  if (codec.dense_f32() && payload.size() != m.length * sizeof(float)) return "";
  const bool in_place = codec.dense_f32() && reinterpret_cast<std::uintptr_t>(payload.data()) % alignof(float) == 0;
  if (!in_place && guard_scratch_.size() < m.length) guard_scratch_.resize(m.length);  // once: decoded codecs, unaligned transports
  const float* values = in_place ? reinterpret_cast<const float*>(payload.data()) : guard_scratch_.data();
  try {
    if (!codec.dense_f32()) codec.decode(payload, m.length, guard_scratch_.data());
    else if (!in_place) std::memcpy(guard_scratch_.data(), payload.data(), payload.size());
  } catch (const PayloadError&) {
    return "";  // not decodable: the shard refuses it, saying so
  }
  std::string why = guard_->check_values(rank, values, m.length, m.offset - range_.offset, m.piece == 0);
  // Bytes damaged in transit are the checksum's to name, not the guard's (only a refusal pays for this pass).
  if (!why.empty() && wire::checksum_bytes(payload.data(), payload.size()) != m.checksum) return "";
  return why;
}

void Server::push_empty_instead(int rank) {
  Pushing& pushing = pushing_[std::size_t(rank)];
  pushing.first.batch = 0;  // (what the trace records: replay applies the same empty push)
  wire::Push m = pushing.first;
  m.batch = 0, m.piece = 0, m.pieces = 1, m.checksum = empty_checksum_;
  push_to_shard(rank, m, empty_payload_, empty_checksum_);
}

void Server::piece_applied(int worker, std::size_t piece) {
  if (is_backup()) return;  // nobody to answer: its primary does
  if (pushing_[std::size_t(worker)].first.then_pull) reply_streamed_piece(worker_ids_[std::size_t(worker)], worker, piece);
}

void Server::push_ended(const ShardState::Done& d) {
  if (d.worker < 0 || d.worker >= cfg_.cluster.workers) return;  // never: sender() checked the rank
  // Its payloads go back to the worker first (shm lends them), so the worker may reuse them once answered.
  for (comm::Message& held : held_msgs_[std::size_t(d.worker)]) {
    held.done_with_payload();
    spare_msgs_.push_back(std::move(held));
  }
  held_msgs_[std::size_t(d.worker)].clear();
  if (d.abandoned) return;
  if (!is_backup()) return finish_push(d);
  if (d.error) return;  // (its primary refused it too, and said so)
  const Pushing& pushing = pushing_[std::size_t(d.worker)];  // counted as the primary counts it, which answers it
  ++counters_.pushes;
  auto& pushed = counters_.pushed[state_->codec().name()];
  ++pushed.pushes;
  pushed.payload_bytes += pushing.bytes;
  if (trace_) trace_->push(d.worker, pushing.first.clock, pushing.first.version_pulled, pushing.first.batch);
}

void Server::finish_push(const ShardState::Done& d) {
  const std::string& id = worker_ids_[std::size_t(d.worker)];
  const Pushing& pushing = pushing_[std::size_t(d.worker)];
  if (d.error) {
    pushing_[std::size_t(d.worker)].streamed_reply = false;
    try {
      std::rethrow_exception(d.error);
    } catch (const ProtocolError& e) {
      return reply_error(id, wire::ErrorCode::protocol, e.what());
    } catch (const ChecksumError& e) {
      return reply_error(id, wire::ErrorCode::bad_checksum, e.what());
    } catch (const PayloadError& e) {
      return reply_error(id, wire::ErrorCode::bad_payload, e.what());
    }
  }
  const wire::Push& m = pushing.first;
  if (guard_ && pushing.refused.empty()) guard_->accepted(d.worker);
  if (trace_) trace_->push(d.worker, m.clock, m.version_pulled, m.batch);
  ++counters_.pushes;
  auto& pushed = counters_.pushed[state_->codec().name()];
  ++pushed.pushes;
  pushed.payload_bytes += pushing.bytes;
  if (!m.then_pull) return send(id, header(wire::PushAck{m.clock, state_->version()}));
  ++counters_.pulls;
  Pushing& sent = pushing_[std::size_t(d.worker)];
  if (!sent.streamed_reply) return on_pull(id, peers_.at(id), m.clock + 1);
  // Its reply left piece by piece as the pieces were applied, the last one before the version
  // was published.
  sent.streamed_reply = false;
  note_served(d.worker, m.clock + 1, 0.0, sent.reply);
}

void Server::reply_streamed_piece(const std::string& id, int rank, std::size_t piece) {
  Pushing& pushing = pushing_[std::size_t(rank)];
  if (piece == 0) {
    const ShardState::After a = state_->after_stream(pushing.first.clock + 1);
    // Not for an encoded pull (cluster.pull_codec), a mode that copies θ as served, or a pull
    // the rule will hold: those are answered once the push ends.
    pushing.streamed_reply = !pull_encoded_ && !state_->mode().keeps_served_theta() && a.advances && a.pull_ready;
    pushing.reply = wire::PullReply{pushing.first.clock + 1, a.version, a.min_clock, a.samples_applied, 0,
                                    finished() == cfg_.cluster.workers, 0, 0, 0, 0, 0, 0, std::uint32_t(state_->pieces())};
  }
  if (pushing.streamed_reply)
    send_piece(id, pushing.reply, piece, state_->streamed_checksum(piece), state_->acquire_streamed());
}

void Server::send_piece(const std::string& id, wire::PullReply& r, std::size_t piece, std::uint64_t checksum,
                        ParamVersions::Buffer* buf) {
  const Pieces& cut = state_->options().pieces;
  const std::size_t lo = cut.begin(range_.length, piece), n = cut.size(range_.length, piece);
  r.piece = std::uint32_t(piece), r.offset = range_.offset + lo, r.length = n, r.bytes = n * sizeof(float);
  r.checksum = checksum;
  send(id, header(r), comm::OutPayload{buf->data + lo, n * sizeof(float), &free_param_buffer, buf});
}

// ---- the end of a worker and of the run ----

void Server::on_bye(const std::string& id, const Peer& p) {
  if (p.role == wire::Role::worker && !said_bye_[std::size_t(p.rank)]) {
    replicate(wire::ReplicaEvent::bye, p.rank);
    note_bye(p.rank);
  }
  send(id, header(wire::Ack{}));
}

void Server::note_bye(int rank) {
  if (said_bye_[std::size_t(rank)]) return;
  said_bye_[std::size_t(rank)] = 1;
  ++finished_;
  workers_.finish(std::size_t(rank));
  last_message_ = clock_.now();
  // A worker that is done no longer holds the others' pulls where the mode trains on without it
  // (ssp: a worker of the user's that stopped after fewer steps held them for timeout_s).
  if (state_->mode().trains_without_lost_workers() && !state_->dropped(rank)) {
    state_->drop_worker(rank);
    release_ready_pulls();
  }
  refuse_pulls_held_for_good();  // (modes that need every worker's push: one it will never send)
}

void Server::on_shutdown(const std::string& id, const Peer& p) {
  if (p.role != wire::Role::evaluator)  // the run ends when its evaluator has taken the final θ
    return reply_error(id, wire::ErrorCode::protocol,
                       "Shutdown from worker " + std::to_string(p.rank) + ": only the evaluator ends a run");
  if (!shutdown_) replicate(wire::ReplicaEvent::shutdown, -1);
  shutdown_ = true;
  send(id, header(wire::Ack{}));
}

// ---- answers ----

void Server::send(const std::string& id, const wire::Header& h, comm::OutPayload payload) {
  const std::span<const std::byte> head = enc_.encode(h);
  if (replicating() && id != replica_id_ && (replica_sent_ > replica_acked_ || waiting_front_ < waiting_.size())) {
    std::vector<std::byte> copy;  // (vectors reused once warm)
    if (!spare_heads_.empty()) {
      copy = std::move(spare_heads_.back());
      spare_heads_.pop_back();
    }
    copy.assign(head.begin(), head.end());
    waiting_.push_back(Waiting{id, std::move(copy), payload, replica_sent_, wire::body_name(h.body)});
    ++counters_.replies_waited;
    return;
  }
  transmit(id, head, payload, wire::body_name(h.body));
}

void Server::transmit(const std::string& id, std::span<const std::byte> head, comm::OutPayload payload, const char* what) {
  const long bytes = long(head.size() + payload.size);
  if (listener_->send(id, head, payload)) {
    counters_.bytes_out += bytes;
    return;
  }
  // The peer is gone, or not reading its replies: the reply is dropped. Counted, and said on
  // stderr for the first few, so that a timeout elsewhere can be traced back here.
  if (++counters_.dropped_replies > 5) return;
  const auto it = peers_.find(id);
  const std::string who = it == peers_.end()                      ? "a peer that never said Hello"
                          : it->second.role == wire::Role::worker ? "worker " + std::to_string(it->second.rank)
                          : it->second.role == wire::Role::replica ? "its backup"
                                                                  : "the evaluator";
  std::fprintf(stderr, "server %d: could not queue the %s reply (%ld bytes) to %s: gone, or not reading%s\n", opt_.shard,
               what, bytes, who.c_str(), counters_.dropped_replies == 5 ? " (further drops are only counted)" : "");
}

void Server::reply_error(const std::string& id, wire::ErrorCode code, const std::string& message) {
  if (code != wire::ErrorCode::timeout) ++counters_.bad[wire::error_code_name(code)];
  send(id, header(wire::Error{code, message}));
}

}  // namespace pslab
