#include "ps/client.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <type_traits>

namespace pslab {

namespace {

comm::Liveness::Options liveness_of_servers(std::chrono::milliseconds beat_every) {
  comm::Liveness::Options o;
  o.silence = beat_every * 4;  // = cluster.heartbeat_s: a server that holds a request beats while it does
  o.beat_every = beat_every;
  o.beat_all = true;  // every server hears from this client at least every beat_every
  return o;
}

std::chrono::milliseconds beat_every_of(const PsClient::Options& opt) {
  return opt.heartbeat_s > 0 ? std::chrono::milliseconds(std::max(10L, long(opt.heartbeat_s * 250))) : std::chrono::milliseconds(0);
}

}  // namespace

PsClient::PsClient(comm::Transport& transport, std::vector<std::string> endpoints, const Options& opt)
    : clock_(transport.clock()), opt_(opt),
      // A little longer than the servers' own timeout, so that a server's Error (which names
      // whom it waited for) arrives before this side gives up.
      timeout_(std::chrono::milliseconds(long(opt.timeout_s * 1000 * 1.25) + 1000)), codec_(make_codec(opt.codec)),
      beat_every_(beat_every_of(opt)), servers_(endpoints.size(), liveness_of_servers(beat_every_), transport.clock().now()) {
  if (endpoints.empty()) throw std::invalid_argument("PsClient: no server endpoints");
  if (opt.pull_codec != "f32") pull_codec_ = make_codec(opt.pull_codec);
  const int S = int(endpoints.size());
  reply_piece_.assign(std::size_t(S), 0);
  hello_sent_.assign(std::size_t(S), RunClock::time_point{});
  asked_since_hello_.assign(std::size_t(S), 0);
  to_backup_pending_.assign(std::size_t(S), 0);
  for (int k = 0; k < S; ++k) {
    shards_.push_back(ShardInfo{endpoints[std::size_t(k)], shard_range(opt.num_params, S, k, opt.shard_layers), 0});
    if (!codec_->dense_f32() && opt.role == wire::Role::worker) {
      auto enc = make_codec(opt.codec);
      encoders_.push_back(opt.error_feedback ? with_error_feedback(std::move(enc)) : std::move(enc));
      encoded_.emplace_back(codec_->max_bytes(shards_.back().range.length));
      encoded_bytes_.push_back(0);
      encoded_clock_.push_back(-1);
    }
  }
  for (int k = 0; k < S; ++k) active_.push_back(std::size_t(k));
  if (!opt.backups.empty() && opt.backups.size() != endpoints.size())
    throw std::invalid_argument("PsClient: " + std::to_string(opt.backups.size()) + " backups for " + std::to_string(S) + " servers");
  if (!opt.backups.empty() && opt.heartbeat_s <= 0)
    throw std::invalid_argument("PsClient: backups need heartbeats (a silent server is how a dead one is told)");
  std::vector<std::string> addresses = endpoints;  // servers, then their backups
  addresses.insert(addresses.end(), opt.backups.begin(), opt.backups.end());
  comm::ConnectOptions co;
  co.linger = std::chrono::milliseconds(1000);
  // No reply is larger than the whole θ (a shard's pull, whole): a larger message is dropped
  // unread (the server's bound on what it takes, server/server.cpp, the other way).
  co.max_message_bytes = std::max<std::size_t>(opt.num_params * sizeof(float) + (1 << 16), std::size_t(16) << 20);
  conns_ = transport.connect(addresses, co);
}

PsClient::~PsClient() {
  heartbeats_.reset();  // stops and joins the heartbeat thread
  // The transport may still hold zero-copy payloads of a gradient (e.g. after an error):
  // close the connections and wait for it to let go before the counter goes away.
  conns_.reset();
  try {
    in_flight_.wait_idle(std::chrono::milliseconds(3000), "a gradient at shutdown");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "PsClient: %s\n", e.what());
  }
}

void PsClient::fail(int k, const std::string& what) const {
  throw std::runtime_error("server " + std::to_string(k) + " at " + shards_[std::size_t(k)].endpoint + ": " + what);
}

void PsClient::send(int k, const wire::Body& body, comm::OutPayload payload) {
  const std::size_t i = std::size_t(k);
  const bool hello = std::holds_alternative<wire::Hello>(body);
  if (to_backup_pending_[i] && !hello) return comm::release(payload);  // after its Welcome, the request goes anew
  const auto* push = std::get_if<wire::Push>(&body);
  if (std::holds_alternative<wire::Pull>(body) || (push && push->piece == 0)) reply_piece_[i] = 0;  // a new request
  if (!hello) asked_since_hello_[i] = 1;  // (Beats go by beat_if_due)
  // A server with a backup to go to gets heartbeat_s: one that takes nothing for that long is gone.
  const bool can_fail_over = !opt_.backups.empty() && !hello;  // (a Hello to the other copy fails plainly)
  const auto wait = can_fail_over ? beat_every_ * 4 : RunClock::duration(timeout_);
  if (conns_->send(active_[i], enc_.encode(wire::Header{opt_.rank, k, body}), payload, clock_.now() + wait)) {
    servers_.sent(i, clock_.now());
    return;
  }
  if (can_fail_over) {
    char b[64];
    std::snprintf(b, sizeof b, " for cluster.heartbeat_s = %g s", opt_.heartbeat_s);
    return fail_over(k, std::string("took no ") + wire::body_name(body) + b);
  }
  fail(k, std::string("could not send ") + wire::body_name(body) + " within " + std::to_string(timeout_.count() / 1000) +
              " s: its queue stayed full, or it stopped listening (is it running? its log says why it stopped)");
}

void PsClient::beat_if_due() {
  const auto now = clock_.now();
  servers_.beats_due(now, [&](std::size_t k) {
    return conns_->send(active_[k], enc_.encode(wire::Header{opt_.rank, int(k), wire::Beat{beat_step_}}), {}, now);
  });
}

void PsClient::heartbeat_loop(std::stop_token stop) {
  while (clock_.sleep_for(beat_every_ / 4, stop)) {
    std::unique_lock lock(mu_, std::try_to_lock);  // busy: a call is sending, or waiting (and beats itself)
    if (lock.owns_lock()) beat_if_due();
  }
}

// ---- waiting for replies ----

template <typename F>
void PsClient::collect(const Expect& e, std::vector<char>& pending, F&& on_reply) {
  // A server that holds a request sends heartbeats while it does (Server::beat_held_pulls), so
  // one silent for heartbeat_s is stopped, hung or gone: named now, not at the timeout. With
  // rejoin (cluster.on_server_loss = "restart"), the launcher restarts a server that died: this
  // client says Hello to it again (with its clock) until it answers, then sends the request anew.
  const Wait w{e, pending, e.watch && beat_every_.count() > 0,
               (opt_.rejoin || opt_.reconnect_s > 0 || !opt_.backups.empty()) && bool(e.resend),
               clock_.now() + timeout_};
  const auto now = clock_.now();
  latest_asked_ = std::max(latest_asked_, e.clock);
  for (std::size_t k = 0; k < pending.size(); ++k)
    if (pending[k]) servers_.watch(k, w.watch, now);
  while (std::find(pending.begin(), pending.end(), 1) != pending.end()) {
    const int k = receive(w);
    const std::optional<wire::Header> h = reply_from(k, w);
    if (!h) continue;
    if constexpr (std::is_same_v<std::invoke_result_t<F&, int, const wire::Body&>, bool>) {
      if (!on_reply(k, h->body)) continue;  // a reply in pieces: more to come
    } else {
      on_reply(k, h->body);
    }
    pending[std::size_t(k)] = 0;
    servers_.watch(std::size_t(k), false, clock_.now());
  }
}

int PsClient::receive(const Wait& w) {
  std::size_t from = 0;
  const std::size_t S = shards_.size();
  for (;;) {
    if (conns_->recv(msg_, from, beat_every_.count() ? std::min(w.deadline, clock_.now() + beat_every_ / 2) : w.deadline)) {
      if (active_[from % S] == from) break;
      continue;  // a server whose shard went to its backup: what it says no longer counts
    }
    const auto now = clock_.now();
    if (now >= w.deadline) {
      std::string who;
      for (std::size_t k = 0; k < w.pending.size(); ++k)
        if (w.pending[k])
          who += (who.empty() ? "" : "; ") + ("server " + std::to_string(k) + " at " + shards_[k].endpoint) +
                 (servers_.state(k) == comm::Liveness::State::rejoining ? " (said Hello again; no Welcome came)" : "");
      const bool hello = w.e.what.rfind("Hello", 0) == 0;  // (a keyless peer's handshake fails without a word)
      throw std::runtime_error("no reply to " + w.e.what + " within " + std::to_string(timeout_.count() / 1000) +
                               " s from " + who + " (is it running? its log says why it stopped" +
                               (hello ? "; a run with cluster.auth = \"curve\" hears only processes that hold its key: "
                                        "pslab_worker --auth-key, PSLAB_AUTH_KEY for a Python worker)"
                                      : ")"));
    }
    beat_if_due();  // a held pull, or a slow server: the other servers still hear from us
    if (!w.watch) continue;
    servers_.check_silence(now, [&](std::size_t k) { on_silent(int(k), w); });
    for (std::size_t k = 0; k < w.pending.size(); ++k)  // a rejoining server that has not answered: say Hello again
      if (w.pending[k] && servers_.state(k) == comm::Liveness::State::rejoining &&
          servers_.silent_s(k, now) * 1000 > double((beat_every_ * 4).count())) {
        if (opt_.backups.empty() || !w.e.resend) say_hello_again(int(k), w);
        else fail_over(int(k), "no Welcome to a Hello again during " + w.e.what);  // the other copy, then (until timeout_s)
      }
  }
  from %= S;
  servers_.heard(from, clock_.now());
  return int(from);
}

void PsClient::on_silent(int k, const Wait& w) {
  if (!opt_.backups.empty() && w.e.resend) {
    char b[96];
    std::snprintf(b, sizeof b, " (%.1f s, cluster.heartbeat_s = %g)", servers_.silent_s(std::size_t(k), clock_.now()), opt_.heartbeat_s);
    return fail_over(k, "went silent during " + w.e.what + b);
  }
  if (w.can_rejoin) return say_hello_again(k, w);
  char b[96];
  std::snprintf(b, sizeof b, "silent for %.1f s while ", servers_.silent_s(std::size_t(k), clock_.now()));
  char hb[80];
  std::snprintf(hb, sizeof hb, " waited for its reply (cluster.heartbeat_s = %g): ", opt_.heartbeat_s);
  fail(k, b + w.e.what + hb + "a server sends heartbeats while it holds a request, so it is stopped, hung or gone");
}

RunClock::duration PsClient::back_within() const {
  // The launcher starts a restarted server within a second of the death; a link that was down
  // comes back within cluster.reconnect_s. Past this, the server is hung or gone for good, and
  // the wait fails naming it.
  RunClock::duration d = std::chrono::duration_cast<RunClock::duration>(std::chrono::duration<double>(opt_.reconnect_s));
  if (opt_.rejoin || !opt_.backups.empty())  // (a backup answers at once, unless it is gone too)
    d = std::max<RunClock::duration>({d, beat_every_ * 16, std::chrono::seconds(10)});
  return std::min<RunClock::duration>(timeout_, d);
}

std::string PsClient::waiting_for_what() const {
  char b[160];
  std::snprintf(b, sizeof b, "%sits link coming back, cluster.reconnect_s = %g",
                opt_.rejoin ? "a restart, cluster.on_server_loss = \"restart\", or " : "", opt_.reconnect_s);
  return b;
}

void PsClient::say_hello_again(int k, const Wait& w) {
  const auto now = clock_.now();
  const std::size_t i = std::size_t(k);
  if (servers_.state(i) != comm::Liveness::State::rejoining) {
    servers_.rejoin(i, now);
    std::fprintf(stderr, "%s: server %d at %s went silent during %s: waiting up to %.0f s for it to come back (%s)\n",
                 who().c_str(), k, shards_[i].endpoint.c_str(), w.e.what.c_str(),
                 std::chrono::duration<double>(back_within()).count(), waiting_for_what().c_str());
  } else if (servers_.rejoining_s(i, now) > std::chrono::duration<double>(back_within()).count()) {
    char b[120];
    std::snprintf(b, sizeof b, "silent for %.1f s and not back (cluster.heartbeat_s = %g; ",
                  servers_.rejoining_s(i, now) + std::chrono::duration<double>(beat_every_ * 4).count(), opt_.heartbeat_s);
    fail(k, b + waiting_for_what() + "): it is hung or gone for good, during " + w.e.what);
  }
  servers_.heard(i, now);  // the next Hello after another heartbeat_s of silence
  send_hello_again(k);
}

comm::OutPayload PsClient::gradient_payload(const void* data, std::size_t bytes) {
  // With backups, copied as it is sent: a server that dies never lets go of what it was lent,
  // and its backup takes the push instead.
  return opt_.backups.empty() ? in_flight_.payload(data, bytes) : comm::OutPayload{data, bytes};
}

void PsClient::fail_over(int k, const std::string& why) {
  const std::size_t i = std::size_t(k), S = shards_.size();
  // To the other copy of the shard: the backup, or, once that took over and died too, the new
  // backup the launcher started where the first server was.
  active_[i] = on_backup(i) ? i : S + i;
  const std::string& to = conns_->address(active_[i]);
  if (++failovers_ <= 10 || failovers_ % 100 == 0)
    std::fprintf(stderr, "%s: server %d at %s %s: going to %s at %s\n", who().c_str(), k, shards_[i].endpoint.c_str(),
                 why.c_str(), on_backup(i) ? "its backup" : "the shard's other copy", to.c_str());
  shards_[i].endpoint = to;
  servers_.rejoin(i, clock_.now());
  servers_.heard(i, clock_.now());
  to_backup_pending_[i] = 1;  // nothing but the Hello goes there before its Welcome
  send_hello_again(k);
}

void PsClient::send_hello_again(int k) {
  hello_sent_[std::size_t(k)] = clock_.now();
  asked_since_hello_[std::size_t(k)] = 0;
  send(k, wire::Hello{opt_.role, opt_.rank, opt_.num_params, opt_.config_hash, opt_.role == wire::Role::worker ? beat_step_ : -1});
}

void PsClient::on_unknown_peer(int k, const Wait& w) {
  const std::size_t i = std::size_t(k);
  const auto now = clock_.now();
  if (servers_.state(i) == comm::Liveness::State::rejoining) {
    // Answers to what reached it before our Hello come first; one to a message sent well after
    // it means that Hello was lost (another cut): say it again.
    if (now - hello_sent_[i] > std::max<RunClock::duration>(beat_every_, std::chrono::milliseconds(500))) send_hello_again(k);
    return;
  }
  servers_.rejoin(i, now);
  if (++reconnects_ <= 10 || reconnects_ % 100 == 0)
    std::fprintf(stderr, "%s: server %d at %s does not know this connection (it was cut and came back, or the server "
                 "restarted): saying Hello again at clock %ld during %s (%ld so far)\n", who().c_str(), k,
                 shards_[i].endpoint.c_str(), beat_step_, w.e.what.c_str(), reconnects_);
  send_hello_again(k);
}

namespace {
// A PushAck or PullReply for another clock than the request's: an answer to a request sent twice
// (again after a cut), or to one before it. A request answered by neither (clock -1) skips those
// for a clock asked before (`asked`: the latest); one for a clock never asked is a wrong answer.
bool stale(const wire::Body& body, long clock, long asked) {
  long answers = -1;
  if (const auto* a = std::get_if<wire::PushAck>(&body)) answers = a->clock;
  else if (const auto* r = std::get_if<wire::PullReply>(&body)) answers = r->clock;
  else return false;
  return clock < 0 ? answers <= asked : answers != clock;
}
}  // namespace

std::optional<wire::Header> PsClient::reply_from(int k, const Wait& w) {
  const std::size_t i = std::size_t(k);
  if (!msg_.malformed().empty()) fail(k, "malformed reply to " + w.e.what + ": " + msg_.malformed());
  std::string why;
  std::optional<wire::Header> h = wire::decode(msg_.header(), why);
  if (!h) fail(k, "malformed reply to " + w.e.what + ": " + why);
  if (std::holds_alternative<wire::Beat>(h->body)) return std::nullopt;  // the server is alive and still holds it
  const bool rejoining = servers_.state(i) == comm::Liveness::State::rejoining;
  if (const auto* e = std::get_if<wire::Error>(&h->body)) {
    if (e->code == wire::ErrorCode::unknown_peer) {
      on_unknown_peer(k, w);
      return std::nullopt;
    }
    if (e->code == wire::ErrorCode::backup && !opt_.backups.empty()) {  // the shard's other copy serves it
      fail_over(k, "says it is a backup (" + e->message + ") during " + w.e.what);
      return std::nullopt;
    }
    if (rejoining) return std::nullopt;  // a restarted server's answers to what reached it before our Hello
    fail(k, std::string(wire::error_code_name(e->code)) + ": " + e->message);
  }
  if (const auto* welcome = std::get_if<wire::Welcome>(&h->body)) {
    if (!rejoining) return w.e.hello && w.pending[i] ? h : std::nullopt;  // else: a late Welcome to a Hello again
    const std::int64_t pulled = shards_[i].version;
    check_welcome(k, *welcome);
    // A push sent again was computed on the θ pulled before, not on the version the server is at
    // now (dcasgd corrects by it, staleness counts from it); a server back from an older
    // checkpoint is at a lower one.
    shards_[i].version = std::min(pulled, welcome->version);
    // The request goes again if it left before the Hello (then it was lost, or answered
    // unknown_peer); one sent after the Hello reached the session the Hello moved.
    const bool resend = w.pending[i] && !w.e.hello && !asked_since_hello_[i];
    std::fprintf(stderr, "%s: server %d is back (version %lld) after %.1f s%s\n", who().c_str(), k,
                 static_cast<long long>(welcome->version), servers_.rejoining_s(i, clock_.now()),
                 resend ? (": " + w.e.what + " sent again").c_str() : "");
    servers_.back(i, clock_.now());
    to_backup_pending_[i] = 0;
    if (w.e.hello) return h;
    if (resend) w.e.resend(k);
    return std::nullopt;
  }
  if (!w.pending[i] || stale(h->body, w.e.clock, latest_asked_)) {
    ++stale_replies_;
    return std::nullopt;
  }
  if (rejoining) servers_.back(i, clock_.now());  // the answer itself: the server was slow, not gone
  return h;
}

std::string PsClient::who() const {
  return opt_.role == wire::Role::worker ? "worker " + std::to_string(opt_.rank) : std::string("evaluator");
}

void PsClient::check_welcome(int k, const wire::Welcome& w) {
  const int S = int(shards_.size());
  const ShardRange& mine = shards_[std::size_t(k)].range;
  if (w.shard != k || w.num_shards != S || w.offset != mine.offset || w.length != mine.length)
    fail(k, "serves shard " + std::to_string(w.shard) + "/" + std::to_string(w.num_shards) + " = floats [" +
                std::to_string(w.offset) + ", " + std::to_string(w.offset + w.length) + "), but this process expects shard " +
                std::to_string(k) + "/" + std::to_string(S) + " = [" + std::to_string(mine.offset) + ", " +
                std::to_string(mine.offset + mine.length) + "): the server list is in the wrong order or incomplete");
  // (Taken as this worker's clock: catch_up() would push empty batches up to it, or end the run.)
  if (w.worker_clock < 0 || (opt_.total_steps > 0 && w.worker_clock > opt_.total_steps))
    fail(k, "says " + who() + " is at clock " + std::to_string(w.worker_clock) + ", outside the run's " +
                std::to_string(opt_.total_steps) + " steps");
  shards_[std::size_t(k)].version = w.version;
}

void PsClient::connect() {
  std::lock_guard lock(mu_);
  const int S = int(shards_.size());
  for (int k = 0; k < S; ++k) send(k, wire::Hello{opt_.role, opt_.rank, opt_.num_params, opt_.config_hash});
  std::vector<char> pending(std::size_t(S), 1);
  const std::string what = opt_.role == wire::Role::worker ? "Hello (the start barrier: a server answers once every worker said Hello)" : "Hello";
  // (The start barrier waits for every worker's start, with timeout_s: silence is not watched.)
  collect(Expect{what, -1, /*watch*/ false, {}, /*hello*/ true}, pending, [&](int k, const wire::Body& body) {
    const auto* w = std::get_if<wire::Welcome>(&body);
    if (!w) fail(k, std::string("answered Hello with ") + wire::body_name(body));
    check_welcome(k, *w);
    shards_[std::size_t(k)].clock = w->worker_clock;
  });
  if (beat_every_.count() && opt_.role == wire::Role::worker)
    heartbeats_ = clock_.start([this](std::stop_token stop) { heartbeat_loop(stop); });
}

bool PsClient::take_params(int k, const wire::PullReply& r, std::span<const std::byte> payload, float* theta,
                           PullResult& acc) {
  ShardInfo& s = shards_[std::size_t(k)];
  if (pull_codec_) {  // cluster.pull_codec: checked, then decoded into θ (whole)
    if (r.offset != s.range.offset || r.length != s.range.length || r.pieces != 1)
      fail(k, "PullReply for floats [" + std::to_string(r.offset) + ", " + std::to_string(r.offset + r.length) + ")");
    if (r.codec != pull_codec_->wire_id() || payload.size() != r.bytes)
      fail(k, "PullReply payload of " + std::to_string(payload.size()) + " bytes in codec " + std::to_string(r.codec) +
                  ", expected " + opt_.pull_codec + " (codec " + std::to_string(pull_codec_->wire_id()) + ")");
    if (wire::checksum_bytes(payload.data(), payload.size()) != r.checksum)
      fail(k, "PullReply payload checksum mismatch (corrupted in transit)");
    try {
      pull_codec_->decode(payload, r.length, theta + r.offset);
    } catch (const PayloadError& e) {
      fail(k, std::string("PullReply payload: ") + e.what());
    }
    s.version = r.version;
    note_progress(r, acc);
    if (params_landed_) params_landed_(r.offset, r.length);
    return true;
  }
  // Dense f32, whole or piece `piece` of the shard's pieces, in order, all of one version. A
  // reply that starts again from piece 0 replaces the pieces before it (the push guard refused
  // the push whose version they were streamed from). (A GPU worker's earlier upload of such a
  // piece may still be reading the bytes rewritten here: the piece's new upload, queued after
  // it on the same copy lane, lands after it, and the next forward waits for the last one.)
  std::size_t& next = reply_piece_[std::size_t(k)];
  if (r.piece == 0) next = 0;
  const std::size_t pieces = opt_.pieces.count(s.range.length);
  const std::size_t lo = opt_.pieces.begin(s.range.length, next), n = opt_.pieces.size(s.range.length, next);
  if (r.pieces != pieces || r.piece != next || r.offset != s.range.offset + lo || r.length != n)
    fail(k, "PullReply for floats [" + std::to_string(r.offset) + ", " + std::to_string(r.offset + r.length) +
                ") as piece " + std::to_string(r.piece) + " of " + std::to_string(r.pieces) + ", expected piece " +
                std::to_string(next) + " of " + std::to_string(pieces) + " = [" + std::to_string(s.range.offset + lo) +
                ", " + std::to_string(s.range.offset + lo + n) + ")");
  if (next > 0 && r.version != s.version)
    fail(k, "PullReply piece " + std::to_string(next) + " of version " + std::to_string(r.version) + ", piece 0 was of " +
                std::to_string(s.version) + " (a torn version)");
  if (r.codec != 0 || r.bytes != r.length * sizeof(float) || payload.size() != r.bytes)
    fail(k, "PullReply payload of " + std::to_string(payload.size()) + " bytes in codec " + std::to_string(r.codec) +
                ", expected " + std::to_string(r.length * sizeof(float)) + " bytes of dense f32 (codec 0)");
  const std::uint64_t sum =
      wire::copy_with_checksum(theta + r.offset, reinterpret_cast<const float*>(payload.data()), r.length);
  if (sum != r.checksum) fail(k, "PullReply payload checksum mismatch (corrupted in transit)");
  s.version = r.version;
  if (next == 0) note_progress(r, acc);
  if (params_landed_) params_landed_(r.offset, r.length);
  if (++next < pieces) return false;
  next = 0;
  return true;
}

void PsClient::note_progress(const wire::PullReply& r, PullResult& acc) {
  acc.min_version = std::min(acc.min_version, r.version);
  acc.max_version = std::max(acc.max_version, r.version);
  acc.samples_applied = std::min(acc.samples_applied, r.samples_applied);
  acc.held_us = std::max(acc.held_us, r.held_us);
  acc.min_clock = std::min(acc.min_clock, r.min_clock);
  acc.training_done = acc.training_done && r.training_done;
}

namespace {
PullResult empty_result() {
  PullResult r;
  r.min_version = r.samples_applied = r.min_clock = std::numeric_limits<long>::max();
  r.max_version = 0;
  r.training_done = true;
  return r;
}
}  // namespace

PullResult PsClient::pull(long clock, float* theta) {
  std::lock_guard lock(mu_);
  beat_step_ = clock;
  if (opt_.role == wire::Role::evaluator) clock = ++evaluator_asks_;  // ungated: the clock numbers its requests
  const int S = int(shards_.size());
  for (int k = 0; k < S; ++k) send(k, wire::Pull{clock});
  std::vector<char> pending(std::size_t(S), 1);
  PullResult acc = empty_result();
  const Expect e{"Pull (clock " + std::to_string(clock) + ")", clock, true, [&](int k) { send(k, wire::Pull{clock}); }};
  collect(e, pending, [&](int k, const wire::Body& body) {
    const auto* pr = std::get_if<wire::PullReply>(&body);
    if (!pr) fail(k, std::string("answered Pull with ") + wire::body_name(body));
    return take_params(k, *pr, msg_.payload(), theta, acc);
  });
  return acc;
}

PullResult PsClient::progress() {
  std::lock_guard lock(mu_);
  const int S = int(shards_.size());
  const wire::Pull ask{++evaluator_asks_, /*progress_only*/ true};
  for (int k = 0; k < S; ++k) send(k, ask);
  std::vector<char> pending(std::size_t(S), 1);
  PullResult acc = empty_result();
  collect(Expect{"Pull (progress only)", ask.clock, true, [&](int k) { send(k, ask); }}, pending, [&](int k, const wire::Body& body) {
    const auto* pr = std::get_if<wire::PullReply>(&body);
    if (!pr) fail(k, std::string("answered a progress-only Pull with ") + wire::body_name(body));
    if (pr->length != 0 || msg_.has_payload()) fail(k, "answered a progress-only Pull with a payload");
    note_progress(*pr, acc);
  });
  return acc;
}

PullResult PsClient::push(long clock, int batch, const float* grad, float* theta) {
  begin_push(clock, batch, grad, theta);
  return finish_push();
}

void PsClient::begin_push(long clock, int batch, const float* grad, float* theta) {
  std::lock_guard lock(mu_);
  beat_step_ = clock;
  if (push_.next >= 0) throw std::logic_error("PsClient: begin_push before the last push finished");
  push_ = PushInProgress{clock, batch, grad, theta, int(shards_.size()) - 1};
}

void PsClient::push_ready(std::size_t lo) {
  std::lock_guard lock(mu_);
  while (push_.next >= 0 && shards_[std::size_t(push_.next)].range.offset >= lo) send_push(push_.next--);
}

void PsClient::send_push(int k) {
  const ShardInfo& s = shards_[std::size_t(k)];
  const float* g = push_.grad + s.range.offset;
  wire::Push h{push_.clock, s.version, push_.batch, 0, s.range.offset, s.range.length, push_.theta != nullptr,
               codec_->wire_id(), 0};
  const void* bytes = g;
  if (codec_->dense_f32()) {
    const std::size_t pieces = opt_.pieces.count(s.range.length);
    if (pieces > 1) {  // in pieces, each checksummed while the ones before it travel
      h.pieces = std::uint32_t(pieces);
      for (std::size_t q = 0; q < pieces; ++q) {
        const std::size_t lo = opt_.pieces.begin(s.range.length, q), n = opt_.pieces.size(s.range.length, q);
        h.piece = std::uint32_t(q), h.offset = s.range.offset + lo, h.length = n, h.bytes = n * sizeof(float);
        h.checksum = wire::checksum(g + lo, n);
        send(k, h, gradient_payload(g + lo, h.bytes));
      }
      return;
    }
    h.bytes = s.range.length * sizeof(float);
  } else {
    const std::size_t i = std::size_t(k);
    if (push_.batch == 0) {  // an empty batch (which the server applies as nothing): zeros, the residual kept owed
      const std::vector<float> zeros(s.range.length, 0.0f);  // (rare: a shard's last batch of an epoch)
      encoded_bytes_[i] = codec_->encode(zeros.data(), s.range.length, encoded_[i].data());
      encoded_clock_[i] = -1;
    } else if (encoded_clock_[i] != push_.clock) {  // encoded once: a resend must not feed the residual twice
      encoded_bytes_[i] = encoders_[i]->encode(g, s.range.length, encoded_[i].data());
      encoded_clock_[i] = push_.clock;
    }
    h.bytes = encoded_bytes_[i];
    bytes = encoded_[i].data();
  }
  h.checksum = wire::checksum_bytes(bytes, h.bytes);
  send(k, h, gradient_payload(bytes, h.bytes));
}

PullResult PsClient::finish_push() {
  std::lock_guard lock(mu_);
  while (push_.next >= 0) send_push(push_.next--);
  const int S = int(shards_.size());
  const long clock = push_.clock;
  float* theta = push_.theta;
  std::vector<char> pending(std::size_t(S), 1);
  PullResult acc = empty_result();
  // Answered by a PullReply for the next clock (push+pull) or a PushAck for this one.
  const Expect e{"Push (clock " + std::to_string(clock) + ")", theta ? clock + 1 : clock, true, [&](int k) { send_push(k); }};
  collect(e, pending, [&](int k, const wire::Body& body) {
    if (theta) {
      const auto* pr = std::get_if<wire::PullReply>(&body);
      if (!pr) fail(k, std::string("answered Push+Pull with ") + wire::body_name(body));
      return take_params(k, *pr, msg_.payload(), theta, acc);
    }
    if (!std::holds_alternative<wire::PushAck>(body)) fail(k, std::string("answered Push with ") + wire::body_name(body));
    return true;
  });
  // Every server has the gradient, so the transport is done with our buffer or about to be.
  in_flight_.wait_idle(timeout_, "the gradient", [&] { conns_->progress(); });
  return acc;
}

ResumePoint PsClient::catch_up() {
  std::lock_guard lock(mu_);
  ResumePoint r;
  std::size_t longest = 0;
  for (const ShardInfo& s : shards_) {
    r.clock = std::max(r.clock, s.clock);
    longest = std::max(longest, s.range.length);
  }
  std::vector<float> zeros, scratch;  // (scratch: θ's pieces taken back, unused)
  for (int k = 0; k < int(shards_.size()); ++k) {
    ShardInfo& s = shards_[std::size_t(k)];
    if (s.clock < r.clock && zeros.empty()) zeros.assign(longest, 0.0f), scratch.assign(opt_.num_params, 0.0f);
    for (; s.clock < r.clock; ++s.clock, ++r.lost_pushes) {
      // Each with a pull of the next clock, which the mode answers when it would take the next
      // push (bsp: once every worker's push of this clock came; the next was refused before).
      const auto send_empty = [&](int q) {
        wire::Push h{s.clock, s.version, 0, 0, s.range.offset, s.range.length, true, codec_->wire_id(), 0};
        const void* bytes = zeros.data();
        if (codec_->dense_f32()) {
          h.bytes = s.range.length * sizeof(float);
        } else {
          std::vector<std::byte>& buf = encoded_[std::size_t(q)];
          h.bytes = codec_->encode(zeros.data(), s.range.length, buf.data());
          bytes = buf.data();
        }
        h.checksum = wire::checksum_bytes(bytes, h.bytes);
        send(q, h, gradient_payload(bytes, h.bytes));
      };
      send_empty(k);
      std::vector<char> pending(shards_.size(), 0);
      pending[std::size_t(k)] = 1;
      const Expect e{"empty Push+Pull (clock " + std::to_string(s.clock) + ", catching up after a resume)", s.clock + 1, true,
                     send_empty};
      PullResult ignored = empty_result();
      collect(e, pending, [&](int q, const wire::Body& body) {
        const auto* pr = std::get_if<wire::PullReply>(&body);
        if (!pr) fail(q, std::string("answered Push+Pull with ") + wire::body_name(body));
        return take_params(q, *pr, msg_.payload(), scratch.data(), ignored);
      });
      in_flight_.wait_idle(timeout_, "an empty gradient", [&] { conns_->progress(); });
    }
  }
  return r;
}

void PsClient::expect_ack(const char* what, const wire::Body& request) {
  std::vector<char> pending(shards_.size(), 1);
  collect(Expect{what, -1, true, [&](int k) { send(k, request); }}, pending, [&](int k, const wire::Body& body) {
    if (!std::holds_alternative<wire::Ack>(body)) fail(k, std::string("answered ") + what + " with " + wire::body_name(body));
  });
}

void PsClient::bye(long clock) {
  heartbeats_.reset();  // done: no more heartbeats after the Bye
  std::lock_guard lock(mu_);
  for (int k = 0; k < int(shards_.size()); ++k) send(k, wire::Bye{clock});
  expect_ack("Bye", wire::Bye{clock});
}

void PsClient::shutdown() {
  std::lock_guard lock(mu_);
  for (int k = 0; k < int(shards_.size()); ++k) send(k, wire::Shutdown{});
  expect_ack("Shutdown", wire::Shutdown{});
}

std::string PsClient::stats(int shard) {
  std::lock_guard lock(mu_);
  send(shard, wire::Stats{});
  std::vector<char> pending(shards_.size(), 0);
  pending[std::size_t(shard)] = 1;
  std::string json;
  collect(Expect{"Stats", -1, true, [&](int k) { send(k, wire::Stats{}); }}, pending, [&](int k, const wire::Body& body) {
    const auto* s = std::get_if<wire::StatsReply>(&body);
    if (!s) fail(k, std::string("answered Stats with ") + wire::body_name(body));
    json = s->json;
  });
  return json;
}

}  // namespace pslab
