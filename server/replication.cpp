// Chain replication of a shard (cluster.replicas = 2; van Renesse & Schneider, OSDI'04, as the
// parameter server of Li et al., OSDI'14 uses it).
//
// The backup is a server process of its own that connects to its primary (ServerOptions::
// backup_of) and says Hello as Role::replica; the primary's start barrier waits for it. From then
// on every input that changes the shard reaches the backup first, in the order the primary's
// shard takes it (a Replicate numbered by seq): a push's pieces with their payloads, an abandoned
// push, a worker dropped or taken back, a Bye, the start barrier, the Shutdown, a pull served in
// a mode that keeps served θ. The backup gives each to its own shard exactly as the primary did,
// so both hold the same θ bit for bit, and answers Replicated with the last seq it applied.
//
// Nothing a peer sees gets ahead of the backup: every reply of the primary (acks, pull replies,
// errors, Welcomes) waits until the backup has applied every input sent before it. So whatever a
// worker was told was taken is on the backup, and when the primary dies the workers (PsClient,
// their silent server) come to the backup, say Hello again, and send what was not answered; the
// backup takes over at the first of them and applies a push once per (worker, clock), so nothing
// is lost and nothing applied twice. A backup that takes over tells its old primary so (it may be
// alive, cut off from one worker): that one stops, and its workers come over too.
//
// A backup silent for heartbeat_s (it beats while idle) is lost: the primary says so and goes on
// alone. Threading: the server's event loop, except CopyBuffer::busy, which the transport's
// release callback clears from its I/O thread.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "server.h"

namespace pslab {

namespace {

// The transport is done with a copy sent to the backup (any thread): its buffer is free again.
void copy_sent(void*, void* hint) { static_cast<std::atomic<bool>*>(hint)->store(false, std::memory_order_release); }

}  // namespace

// ---- the primary ----

void Server::on_replica_hello(const std::string& id, const wire::Hello& m) {
  if (!replica_expected_)
    return reply_error(id, wire::ErrorCode::config, "a backup's Hello to server " + std::to_string(opt_.shard) +
                                                        ", which has none (cluster.replicas = " +
                                                        std::to_string(cfg_.cluster.replicas) + ", or it is a backup itself)");
  if (m.rank != opt_.shard)
    return reply_error(id, wire::ErrorCode::wrong_shard, "the backup of shard " + std::to_string(m.rank) + " said Hello to server " +
                                                             std::to_string(opt_.shard));
  // Another backup's Hello: the launcher started it because the one this server has ended.
  if (!replica_id_.empty() && replica_id_ != id) lose_replica("a new backup said Hello in its place (its process ended)");
  joining_id_.clear();
  peers_[id] = Peer{wire::Role::replica, wire::kServer};
  replica_heard_ = clock_.now();
  if (!barrier_open_) return attach_replica(id);
  joining_id_ = id;  // a run under way: the whole shard first, once no push is half-way
  attach_joining_replica();
}

void Server::attach_replica(const std::string& id) {
  replica_id_ = id;
  replica_sent_ = replica_acked_ = 0;
  replica_heard_ = replica_beat_ = clock_.now();
  send(id, welcome(id));
  if (!barrier_open_) {
    std::fprintf(stderr, "server %d: its backup said Hello: every update is replicated before it is answered\n", opt_.shard);
    if (!welcome_waiting_.empty()) {  // the workers may all be here already
      const std::string last = welcome_waiting_.back();
      welcome_waiting_.pop_back();
      open_barrier_when_full(last);
    }
    return;
  }
  const std::vector<char> bytes = encode_checkpoint(checkpoint_now());  // (once per backup that joins)
  state_->forget_served();  // (the snapshot holds no served copies: dcasgd corrects each next push alike on both)
  wire::Replicate r{++replica_sent_, wire::ReplicaEvent::snapshot, -1, long(bytes.size()), {}};
  if (!listener_->send(id, enc_.encode(header(r)), comm::OutPayload{bytes.data(), bytes.size()}))  // (copied)
    return lose_replica("it could not be sent the shard");
  ++counters_.replicated;
  ++backups_joined_;
  std::fprintf(stderr, "server %d: a new backup joined at version %ld: sent it the shard (%zu bytes); every update is "
               "replicated before it is answered again\n", opt_.shard, state_->version(), bytes.size());
  if (metrics_) {
    metrics_->write({{"kind", "backup_joined"}, {"shard", opt_.shard}, {"version", state_->version()}, {"bytes", bytes.size()}});
    metrics_->flush();
  }
}

void Server::attach_joining_replica() {
  if (joining_id_.empty() || state_->pushes_open()) return;
  const std::string id = std::move(joining_id_);
  joining_id_.clear();
  attach_replica(id);
}

void Server::on_replicated(const std::string& id, const wire::Replicated& r) {
  if (id != replica_id_) return reply_error(id, wire::ErrorCode::protocol, "Replicated from a peer that is not this server's backup");
  if (r.seq < 0) return lose_replica("it took over: a worker or the evaluator came to it", /*took_over*/ true);  // (its last word)
  if (r.seq < replica_acked_ || r.seq > replica_sent_)
    throw std::runtime_error(who() + ": its backup says it applied input " + std::to_string(r.seq) + ", but " +
                             std::to_string(replica_sent_) + " were sent and " + std::to_string(replica_acked_) + " applied before");
  replica_acked_ = r.seq;
  release_replies();
}

void Server::check_replica(time_point now) {
  if (!replicating()) return;
  if (seconds_between(replica_beat_, now) > cfg_.cluster.heartbeat_s / 4) {  // idle: it hears this server is alive
    (void)listener_->send(replica_id_, enc_.encode(header(wire::Beat{replica_sent_})));
    replica_beat_ = now;
  }
  if (!barrier_open_) return;
  if (seconds_between(replica_heard_, now) > cfg_.cluster.heartbeat_s) {
    char b[120];
    std::snprintf(b, sizeof b, "silent for %.1f s (cluster.heartbeat_s = %g)", seconds_between(replica_heard_, now),
                  cfg_.cluster.heartbeat_s);
    lose_replica(b);
  }
}

void Server::lose_replica(const std::string& why, bool took_over) {
  std::fprintf(stderr, "server %d: its backup is lost (%s): %s\n", opt_.shard, why.c_str(),
               took_over ? "this server stops; its workers go to the backup" : "going on without a copy of the shard");
  if (metrics_) {
    metrics_->write({{"kind", "replica_lost"}, {"shard", opt_.shard}, {"why", why}, {"sent", replica_sent_}, {"applied", replica_acked_}});
    metrics_->flush();
  }
  peers_.erase(replica_id_);
  replica_id_.clear();
  joining_id_.clear();
  if (took_over) {  // what it holds is no longer the shard: nothing more leaves
    for (std::size_t i = waiting_front_; i < waiting_.size(); ++i) comm::release(waiting_[i].payload);
    waiting_.clear();
    waiting_front_ = 0;
    throw std::runtime_error(who() + ": its backup took over the shard (a worker or the evaluator came to it): stopping");
  }
  replica_acked_ = replica_sent_;
  release_replies();
}

void Server::replicate(wire::ReplicaEvent event, int worker, long clock, const wire::Push* push,
                       std::span<const std::byte> payload) {
  if (!replicating()) return;
  wire::Replicate r{replica_sent_ + 1, event, worker, clock, push ? *push : wire::Push{}};
  comm::OutPayload out;
  if (push) {  // the payload is the worker's (lent, or the receive buffer's): a copy goes
    CopyBuffer* buf = nullptr;
    for (auto& c : copies_)
      if (!c->busy.load(std::memory_order_acquire) && c->memory->size() >= payload.size()) {
        buf = c.get();
        break;
      }
    if (!buf) {  // (once per piece in flight at a time, at most: then reused)
      copies_.push_back(std::make_unique<CopyBuffer>());
      buf = copies_.back().get();
      buf->memory = transport_.payload_memory(std::max<std::size_t>(payload.size(), range_.length * sizeof(float)));
    }
    buf->busy.store(true, std::memory_order_relaxed);
    if (!payload.empty()) std::memcpy(buf->memory->data(), payload.data(), payload.size());
    out = comm::OutPayload{buf->memory->data(), payload.size(), &copy_sent, &buf->busy};
    r.push.bytes = payload.size();
  }
  if (!listener_->send(replica_id_, enc_.encode(header(r)), out))
    return lose_replica("its connection cannot take more (gone, or not reading)");
  ++replica_sent_;
  ++counters_.replicated;
  replica_beat_ = clock_.now();
}

void Server::push_to_shard(int worker, const wire::Push& m, std::span<const std::byte> payload, std::uint64_t checksum) {
  replicate(wire::ReplicaEvent::piece, worker, m.clock, &m, payload);
  state_->push_piece({worker, m.clock, m.version_pulled, m.batch, m.piece, m.pieces}, payload, checksum, *this);
}

void Server::abandon_in_shard(int worker) {
  replicate(wire::ReplicaEvent::abandon, worker);  // (none open: nothing happens there either)
  state_->abandon_push(worker, *this);
}

void Server::release_replies() {
  while (waiting_front_ < waiting_.size() && waiting_[waiting_front_].after <= replica_acked_) {
    Waiting& w = waiting_[waiting_front_++];
    transmit(w.to, w.head, w.payload, w.what);
    w.payload = {};
    spare_heads_.push_back(std::move(w.head));
  }
  if (waiting_front_ == waiting_.size()) {
    waiting_.clear();
    waiting_front_ = 0;
  }
}

// ---- the backup ----

void Server::serve_as_backup(time_point wake) {
  const auto now = clock_.now();
  const auto beat_every = std::chrono::duration_cast<RunClock::duration>(std::chrono::duration<double>(cfg_.cluster.heartbeat_s / 4));
  // Inputs from the primary: waits for them (at most 20 ms, to look at the listener), then takes
  // what came meanwhile. Each is acknowledged as it arrives, before it is applied: it is here, in
  // order, and will be applied before anything else happens (a takeover included), so the
  // primary's answers wait for the transfer, not for this copy's arithmetic.
  std::size_t from = 0;
  const long before = applied_;
  for (auto until = std::min(wake, now + std::chrono::milliseconds(20)); upstream_->recv(up_msg_, from, until); until = clock_.now()) {
    upstream_heard_ = last_message_ = clock_.now();
    std::string why;
    const std::optional<wire::Header> h = up_msg_.malformed().empty() ? wire::decode(up_msg_.header(), why) : std::nullopt;
    if (!h) throw std::runtime_error(who() + " (backup): a malformed message from its primary at " + opt_.backup_of + ": " +
                                     (up_msg_.malformed().empty() ? why : up_msg_.malformed()));
    if (const auto* r = std::get_if<wire::Replicate>(&h->body)) {
      if (r->seq == applied_ + 1)  // (one out of order fails on_replicate()); a full queue: said again below
        ack_owed_ = !upstream_->send(0, enc_.encode(wire::Header{wire::kServer, opt_.shard, wire::Replicated{r->seq, state_->version()}}),
                                     {}, upstream_heard_);
      upstream_beat_ = upstream_heard_;
      on_replicate(*r);
    } else if (const auto* e = std::get_if<wire::Error>(&h->body)) {
      // A new backup of a backup whose primary just ended: it takes over once that one is silent to it.
      if (welcomed_) {  // another process answers at its primary's address: that primary is gone
        if (!primary_lost_)
          std::fprintf(stderr, "server %d (backup): its primary at %s is gone (another process there says: %s)\n", opt_.shard,
                       opt_.backup_of.c_str(), e->message.c_str());
        primary_lost_ = true;
      } else if (e->code == wire::ErrorCode::backup || e->code == wire::ErrorCode::unknown_peer) {
        hello_again_at_ = clock_.now() + beat_every;  // a backup that has not taken over yet: again, later
      } else {
        throw std::runtime_error(who() + " (backup): its primary at " + opt_.backup_of + " refused it: " + e->message);
      }
    } else if (std::holds_alternative<wire::Welcome>(h->body)) {
      welcomed_ = true;
      std::fprintf(stderr, "server %d (backup): its primary at %s took it: every update comes here before it is answered\n",
                   opt_.shard, opt_.backup_of.c_str());
    }  // (a Beat: alive)
    if (applied_ - before >= 256) break;
  }
  if (hello_again_at_ != time_point{} && clock_.now() >= hello_again_at_) {
    hello_again_at_ = time_point{};
    hello_upstream();
  }
  if (const auto t = clock_.now(); welcomed_ && !primary_lost_ && (ack_owed_ || t - upstream_beat_ > beat_every)) {  // idle: its primary hears it is alive
    const wire::Body b = ack_owed_ ? wire::Body{wire::Replicated{applied_, state_->version()}} : wire::Body{wire::Beat{applied_}};
    ack_owed_ = !upstream_->send(0, enc_.encode(wire::Header{wire::kServer, opt_.shard, b}), {}, t) && ack_owed_;
    upstream_beat_ = t;
  }
  // A worker or the evaluator that came over: its primary is gone (for it, at least).
  while (upstream_ && listener_->recv(msg_, from_, clock_.now())) handle(from_, msg_);
}

void Server::hello_upstream() {
  (void)upstream_->send(0, enc_.encode(wire::Header{wire::kServer, opt_.shard,
                                                    wire::Hello{wire::Role::replica, opt_.shard, num_params_, config_hash_}}),
                        {}, clock_.now() + std::chrono::seconds(1));
}

void Server::on_replicate(const wire::Replicate& r) {
  if (r.seq != applied_ + 1)
    throw std::runtime_error(who() + " (backup): input " + std::to_string(r.seq) + " from its primary after input " +
                             std::to_string(applied_) + ": inputs were lost on the way, this copy is no longer the shard");
  applied_ = r.seq;
  ++counters_.replicated;
  const int w = r.worker, W = cfg_.cluster.workers;
  const bool about_worker = r.event != wire::ReplicaEvent::barrier && r.event != wire::ReplicaEvent::shutdown &&
                            r.event != wire::ReplicaEvent::snapshot;
  if (about_worker && (w < 0 || w >= W))
    throw std::runtime_error(who() + " (backup): an input from its primary about worker " + std::to_string(w));
  switch (r.event) {
    case wire::ReplicaEvent::piece: {
      const wire::Push& m = r.push;
      Pushing& pushing = pushing_[std::size_t(w)];
      if (m.piece == 0) pushing = Pushing{m, "", 0, false, {}};
      pushing.bytes += long(up_msg_.payload().size());
      const std::span<const std::byte> payload = up_msg_.payload();
      held_msgs_[std::size_t(w)].push_back(std::move(up_msg_));  // referenced by the shard until the push ends
      if (!spare_msgs_.empty()) {  // (no allocation per message once warm)
        up_msg_ = std::move(spare_msgs_.back());
        spare_msgs_.pop_back();
      } else {
        up_msg_ = comm::Message();
      }
      state_->push_piece({w, m.clock, m.version_pulled, m.batch, m.piece, m.pieces}, payload, m.checksum, *this);
      break;
    }
    case wire::ReplicaEvent::abandon:
      state_->abandon_push(w, *this);
      break;
    case wire::ReplicaEvent::drop:
      drop_worker(w, "dropped by its primary at clock " + std::to_string(r.clock), {{"by", "primary"}});
      may_return_until_[std::size_t(w)] = clock_.now() + reconnect_window_;
      break;
    case wire::ReplicaEvent::readmit:
      readmit(w);
      break;
    case wire::ReplicaEvent::bye:
      note_bye(w);
      break;
    case wire::ReplicaEvent::barrier:
      barrier_open_ = true;
      break;
    case wire::ReplicaEvent::shutdown:
      shutdown_ = true;
      break;
    case wire::ReplicaEvent::pulled:
      state_->record_pull(w, r.clock);
      break;
    case wire::ReplicaEvent::snapshot:  // a run under way: the shard as its primary has it now
      if (r.seq != 1) throw std::runtime_error(who() + " (backup): the whole shard as input " + std::to_string(r.seq));
      restore_state(decode_checkpoint(reinterpret_cast<const char*>(up_msg_.payload().data()), up_msg_.payload().size(),
                                      "from its primary"),
                    who() + " (backup): the shard its primary sent: ");
      std::fprintf(stderr, "server %d (backup): joined a run under way: has the shard at version %ld from its primary\n",
                   opt_.shard, state_->version());
      break;
  }
}

void Server::take_over(const std::string& by) {
  std::fprintf(stderr, "server %d (backup): %s came over, and its primary at %s has been silent for %.1f s: it is gone; "
               "serving shard %d from version %ld (%ld inputs replicated)\n", opt_.shard, by.c_str(), opt_.backup_of.c_str(),
               seconds_between(upstream_heard_, clock_.now()), opt_.shard, state_->version(), applied_);
  // The old primary may be alive, cut off from one peer: told, it stops, and its peers come here.
  (void)upstream_->send(0, enc_.encode(wire::Header{wire::kServer, opt_.shard, wire::Replicated{-1, state_->version()}}), {}, clock_.now());
  // Pushes its primary had not finished sending are abandoned (their workers send them again),
  // and every message received from the primary let go of, before its connection closes.
  for (int w = 0; w < cfg_.cluster.workers; ++w) state_->abandon_push(w, *this);
  spare_msgs_.clear();
  up_msg_ = comm::Message();
  upstream_.reset();
  replica_expected_ = true;  // a new backup may join it (the launcher starts one where the old primary was)
  const auto now = clock_.now();
  last_message_ = now;
  for (std::size_t r = 0; r < worker_ids_.size(); ++r)  // every worker has heartbeat_s from now to come over
    workers_.watch(r, barrier_open_ && !said_bye_[r] && !state_->dropped(int(r)), now);
  if (!metrics_) return;
  metrics_->write({{"kind", "took_over"}, {"shard", opt_.shard}, {"by", by}, {"version", state_->version()}, {"inputs", applied_}});
  metrics_->flush();
}

}  // namespace pslab
