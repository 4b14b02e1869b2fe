#include "server.h"

#include <algorithm>
#include <cstdio>

#include "run/setup.h"

namespace pslab {

using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// {"f32": {"pushes": N, "payload_bytes": B}}: accepted pushes by codec.
nlohmann::ordered_json pushed_json(const ServerCounters& c) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [codec, p] : c.pushed) j[codec] = {{"pushes", p.pushes}, {"payload_bytes", p.payload_bytes}};
  return j;
}

void free_param_buffer(void*, void* hint) {
  ParamVersions::release(static_cast<ParamVersions::Buffer*>(hint));
}
void free_encoded_buffer(void*, void* hint) {
  EncodedVersions::release(static_cast<EncodedVersions::Buffer*>(hint));
}

}  // namespace

long ServerCounters::bad_total() const {
  long n = 0;
  for (const auto& [reason, count] : bad) n += count;
  return n;
}

Server::Server(comm::Transport& transport, const ExperimentConfig& cfg, const ServerOptions& opt)
    : cfg_(cfg), opt_(opt), transport_(transport) {
  if (!cfg.uses_servers())
    throw std::invalid_argument("cluster.mode = \"" + cfg.cluster.mode + "\" runs without parameter servers");
  const ModelSpec spec = model_spec(cfg);
  num_params_ = count_params(spec);
  range_ = shard_range(num_params_, cfg.cluster.servers, opt.shard);
  config_hash_ = config_fingerprint(cfg);
  const std::vector<float> theta = initial_params(spec, cfg.seed);
  std::vector<float> slice(theta.begin() + std::ptrdiff_t(range_.offset),
                           theta.begin() + std::ptrdiff_t(range_.offset + range_.length));
  cpu_ = make_cpu_backend(0);  // BLAS threads are the process's setting (server/main.cpp: 1)
  ShardState::Options so;
  so.mode = cfg.cluster.mode;
  so.codec = cfg.cluster.codec;
  so.workers = cfg.cluster.workers;
  so.range = range_;
  so.optimizer = cfg.optimizer;
  so.layers = layer_sizes(spec, range_.offset, range_.length);
  so.schedule = schedule_for_run(cfg, steps_per_epoch(cfg, cfg.cluster.workers));
  so.train_size = train_set_size(cfg);
  so.batch = cfg.train.batch * cfg.train.accumulate;  // samples behind one push
  so.record_pulls = opt.record_pulls;
  so.threads = server_threads(cfg, opt.procs_on_host);
  so.memory = [&transport](std::size_t bytes) { return transport.payload_memory(bytes); };  // shm: replies without a copy
  state_ = std::make_unique<ShardState>(*cpu_, so, std::move(slice));
  if (cfg.cluster.pull_codec != "f32")
    pull_encoded_ = std::make_unique<EncodedVersions>(make_codec(cfg.cluster.pull_codec), range_.length);

  const int W = cfg.cluster.workers;
  worker_ids_.assign(std::size_t(W), "");
  worker_heard_.assign(std::size_t(W), Clock::now());
  said_bye_.assign(std::size_t(W), 0);
  if (!opt.resume_path.empty()) resume_from(opt.resume_path);
  continue_on_loss_ = continues_without_lost_workers(cfg);

  // A peer cannot make us allocate more than one shard plus a header per message, or 16 MiB where
  // that is less: garbage up to that size is read, answered and counted like any bad input (a
  // larger message makes the transport drop the connection, with what was queued behind it).
  comm::ListenOptions lo;
  lo.max_message_bytes = std::max<std::size_t>(range_.length * sizeof(float) + (1 << 16), std::size_t(16) << 20);
  lo.linger = std::chrono::milliseconds(2000);  // let final replies leave at exit
  try {
    listener_ = transport.listen(opt.endpoint, lo);
  } catch (const std::exception& e) {
    throw std::runtime_error("server " + std::to_string(opt.shard) + ": " + e.what());
  }
  if (!opt.metrics_path.empty())
    metrics_ = std::make_unique<MetricsWriter>(opt.metrics_path, opt.run_start, !opt.resume_path.empty());
  if (!opt.trace_path.empty()) {
    trace_ = std::make_unique<OrderTrace>(opt.trace_path, !opt.resume_path.empty());
    if (!opt.resume_path.empty()) trace_->event("resume");
  }
}

Server::~Server() = default;

int Server::finished() const {
  int n = 0;
  for (int r = 0; r < cfg_.cluster.workers; ++r) n += said_bye_[std::size_t(r)] || state_->dropped(r);
  return n;
}

bool Server::done() const {
  return finished() == cfg_.cluster.workers && (!opt_.wait_for_shutdown || shutdown_);
}

void Server::run() {
  started_ = last_message_ = Clock::now();
  const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cfg_.cluster.timeout_s));
  const auto stats_every = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt_.stats_every_s));
  const auto beat_every = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cfg_.cluster.heartbeat_s / 4));
  auto next_stats = started_ + stats_every;
  const auto checkpoint_every =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cfg_.checkpoint.every_s));
  auto next_checkpoint = started_ + checkpoint_every;
  const std::string who = "server " + std::to_string(opt_.shard) + " (" + opt_.endpoint + ")";
  char timeout_text[32];
  std::snprintf(timeout_text, sizeof timeout_text, "%g", cfg_.cluster.timeout_s);
  try {
    while (!done()) {
      if (opt_.stop && opt_.stop->load()) throw std::runtime_error(who + ": stopped by a signal");
      const auto now = Clock::now();
      auto wake = std::min(next_stats, now + std::chrono::milliseconds(200));
      for (const auto& h : held_) wake = std::min({wake, h.since + timeout, h.beat_at + beat_every});
      // Handle what is waiting (bounded, so that timers run under a flood).
      bool drained = true;  // nothing left queued: silence now is the peers', not this loop's
      if (listener_->recv(msg_, from_, wake)) {
        handle(from_, msg_);
        int i = 1;
        while (i < 256 && listener_->recv(msg_, from_, Clock::now())) handle(from_, msg_), ++i;
        drained = i < 256;
      }
      if (drained) find_lost_workers(Clock::now());
      release_ready_pulls();
      expire_held_pulls();
      beat_held_pulls(Clock::now());

      const auto t = Clock::now();
      if (!barrier_open_ && t - started_ > timeout)
        throw std::runtime_error(who + ": start barrier: waited " + timeout_text +
                                 " s for Hello from " + missing_hellos());
      // Silence while nobody is held: held pulls expire first, with the more precise message.
      if (barrier_open_ && finished() < cfg_.cluster.workers && held_.empty() && t - last_message_ > timeout) {
        // A worker whose next pull the mode would hold is waiting for the others, not training.
        std::string training, waiting;
        for (int r = 0; r < cfg_.cluster.workers; ++r)
          if (!said_bye_[std::size_t(r)] && !state_->dropped(r)) {
            const long clock = state_->clock_of(r);
            std::string& list = state_->pull_ready(clock) ? training : waiting;
            char b[96];
            std::snprintf(b, sizeof b, "%sworker %d (clock %ld, last heard %.0f s ago)", list.empty() ? "" : ", ", r,
                          clock, seconds(t - worker_heard_[std::size_t(r)]));
            list += b;
          }
        throw std::runtime_error(who + ": no message from any worker for " + timeout_text +
                                 " s; still training: " + (training.empty() ? "nobody" : training) +
                                 (waiting.empty() ? "" : "; waiting for them: " + waiting));
      }
      // Training is over but the Shutdown that --wait-for-shutdown waits for does not come.
      if (finished() == cfg_.cluster.workers && !shutdown_ && t - last_message_ > timeout)
        throw std::runtime_error(who + ": every worker said Bye " + timeout_text +
                                 " s ago, but no Shutdown came (is the evaluator running? its log says why it stopped)");
      if (t >= next_stats) {
        write_stats(false);
        next_stats = t + stats_every;
      }
      if (checkpoint_every.count() > 0 && !opt_.checkpoint_path.empty() && t >= next_checkpoint) {
        write_checkpoint_now("periodic");
        next_checkpoint = Clock::now() + checkpoint_every;
      }
    }
  } catch (...) {
    write_stats(true);
    if (!opt_.checkpoint_path.empty()) write_checkpoint_now("stopped");
    throw;
  }
  write_stats(true);
  if (!opt_.checkpoint_path.empty()) write_checkpoint_now("final");
}

void Server::resume_from(const std::string& path) {
  const std::string who = "server " + std::to_string(opt_.shard) + ": cannot resume from " + path + ": ";
  ShardCheckpoint c = read_checkpoint(path);
  if (c.shard != opt_.shard || c.num_shards != cfg_.cluster.servers)
    throw std::runtime_error(who + "it is shard " + std::to_string(c.shard) + " of " + std::to_string(c.num_shards) +
                             ", this server is shard " + std::to_string(opt_.shard) + " of " + std::to_string(cfg_.cluster.servers));
  if (c.config_hash != config_hash_)
    throw std::runtime_error(who + "it was written by a run with a different config (fingerprints differ)");
  for (std::size_t r = 0; r < c.lost.size() && r < said_bye_.size(); ++r) {
    said_bye_[r] = (c.lost[r] & kSaidBye) != 0;  // workers that had said Bye stay done
    c.lost[r] &= ~kSaidBye;
  }
  try {
    state_->restore(c);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(who + e.what());
  }
  barrier_open_ = true;  // the run started long ago: no start barrier
  std::fprintf(stderr, "server %d: resumed from %s at version %ld\n", opt_.shard, path.c_str(), c.version);
}

void Server::write_checkpoint_now(const char* why) {
  const auto t0 = Clock::now();
  try {
    ShardCheckpoint c = state_->checkpoint();
    for (std::size_t r = 0; r < c.lost.size(); ++r) c.lost[r] |= said_bye_[r] ? kSaidBye : 0;
    c.shard = opt_.shard;
    c.num_shards = cfg_.cluster.servers;
    c.config_hash = config_hash_;
    write_checkpoint(opt_.checkpoint_path, c);
    if (metrics_) {
      metrics_->write({{"kind", "checkpoint"}, {"shard", opt_.shard}, {"why", why}, {"version", c.version},
                       {"ms", seconds(Clock::now() - t0) * 1e3}});
      metrics_->flush();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "server %d: %s checkpoint not written: %s\n", opt_.shard, why, e.what());
  }
}

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
  if (!h) {
    reply_error(id, wire::ErrorCode::malformed, why);
    return;
  }
  if (m.has_payload() && !std::holds_alternative<wire::Push>(h->body)) {
    reply_error(id, wire::ErrorCode::wrong_size, std::string("a payload frame after a ") + wire::body_name(h->body));
    return;
  }
  if (const auto* hello = std::get_if<wire::Hello>(&h->body)) {
    on_hello(id, *hello);
    return;
  }
  auto it = peers_.find(id);
  if (it == peers_.end()) {
    reply_error(id, wire::ErrorCode::unknown_peer,
                std::string(wire::body_name(h->body)) + " from a connection that has not said Hello");
    return;
  }
  Peer& peer = it->second;
  if (h->sender != peer.rank) {
    reply_error(id, wire::ErrorCode::unknown_peer, "sender " + std::to_string(h->sender) +
                                                       " on a connection that said Hello as " + std::to_string(peer.rank));
    return;
  }
  if (peer.role == wire::Role::worker && state_->dropped(peer.rank)) {
    reply_error(id, wire::ErrorCode::protocol, "worker " + std::to_string(peer.rank) +
                                                   " was dropped from this run as lost (silent for more than "
                                                   "cluster.heartbeat_s); it cannot rejoin");
    return;
  }
  const auto now = Clock::now();
  peer.last_heard = now;
  if (peer.role == wire::Role::worker) {
    last_message_ = now;
    worker_heard_[std::size_t(peer.rank)] = now;
  }
  const bool about_shard = std::holds_alternative<wire::Pull>(h->body) || std::holds_alternative<wire::Push>(h->body);
  if (about_shard && h->shard != opt_.shard) {
    reply_error(id, wire::ErrorCode::wrong_shard, "message for shard " + std::to_string(h->shard) +
                                                      " reached server " + std::to_string(opt_.shard));
    return;
  }
  if (const auto* m = std::get_if<wire::Pull>(&h->body)) {
    if (m->progress_only) return serve_progress(id, peer);
    ++counters_.pulls;
    on_pull(id, peer, m->clock);
  } else if (const auto* m = std::get_if<wire::Push>(&h->body)) {
    on_push(id, peer, *m, msg_);
  } else if (const auto* m = std::get_if<wire::Bye>(&h->body)) {
    if (peer.role == wire::Role::worker && !said_bye_[std::size_t(peer.rank)]) {
      said_bye_[std::size_t(peer.rank)] = 1;
      last_message_ = Clock::now();
    }
    (void)m;
    send(id, header(wire::Ack{}));
  } else if (std::holds_alternative<wire::Shutdown>(h->body)) {
    if (peer.role != wire::Role::evaluator) {  // the run ends when its evaluator has taken the final θ
      reply_error(id, wire::ErrorCode::protocol, "Shutdown from worker " + std::to_string(peer.rank) +
                                                     ": only the evaluator ends a run");
      return;
    }
    shutdown_ = true;
    send(id, header(wire::Ack{}));
  } else if (std::holds_alternative<wire::Beat>(h->body)) {
    // A heartbeat: the peer is alive (noted above); no answer.
  } else if (std::holds_alternative<wire::Stats>(h->body)) {
    nlohmann::ordered_json j{{"shard", opt_.shard},
                             {"version", state_->version()},
                             {"samples_applied", state_->samples_applied()},
                             {"pushes", counters_.pushes},
                             {"pulls", counters_.pulls},
                             {"bad_total", counters_.bad_total()},
                             {"bad", counters_.bad},
                             {"dropped_replies", counters_.dropped_replies},
                             {"peers_refused", transport_.peers_refused()},
                             {"bytes_in", counters_.bytes_in},
                             {"bytes_bad", counters_.bytes_bad},
                             {"pushed", pushed_json(counters_)},
                             {"workers_lost", losses_},
                             {"updates_lost", updates_lost_}};
    send(id, header(wire::StatsReply{j.dump()}));
  } else {
    reply_error(id, wire::ErrorCode::unknown_type, std::string("a server does not take ") + wire::body_name(h->body));
  }
}

void Server::on_hello(const std::string& id, const wire::Hello& m) {
  const int W = cfg_.cluster.workers;
  if (m.param_count != num_params_) {
    reply_error(id, wire::ErrorCode::config, "peer has a model of " + std::to_string(m.param_count) +
                                                 " parameters, this server's has " + std::to_string(num_params_) +
                                                 ": are both started from the same config?");
    return;
  }
  if (m.config_hash != config_hash_) {
    reply_error(id, wire::ErrorCode::config, "peer's config differs from this server's (fingerprints differ): "
                                             "start every process of a run from the same config file");
    return;
  }
  if (m.role == wire::Role::evaluator) {
    peers_[id] = Peer{m.role, wire::kEvaluator, Clock::now()};
  } else {
    if (m.rank < 0 || m.rank >= W) {
      reply_error(id, wire::ErrorCode::protocol, "worker rank " + std::to_string(m.rank) +
                                                     " is not in [0, " + std::to_string(W) + ")");
      return;
    }
    std::string& slot = worker_ids_[std::size_t(m.rank)];
    if (state_->dropped(m.rank)) {
      reply_error(id, wire::ErrorCode::protocol, "worker " + std::to_string(m.rank) +
                                                     " was dropped from this run as lost; it cannot rejoin");
      return;
    }
    if (!slot.empty() && slot != id) {
      reply_error(id, wire::ErrorCode::protocol, "worker " + std::to_string(m.rank) +
                                                     " already said Hello from another connection");
      return;
    }
    slot = id;
    peers_[id] = Peer{m.role, m.rank, Clock::now()};
    worker_heard_[std::size_t(m.rank)] = Clock::now();
    if (m.rejoin_clock >= 0) rejoin(m.rank, m.rejoin_clock);
  }
  // Each worker is told its clock here (a server resumed from a checkpoint: where it goes on).
  auto welcome = [&](const std::string& to) {
    const Peer& p = peers_.at(to);
    return header(wire::Welcome{opt_.shard, cfg_.cluster.servers, range_.offset, range_.length, W, state_->rule().name(),
                                state_->version(), p.role == wire::Role::worker ? state_->clock_of(p.rank) : 0});
  };
  if (m.role == wire::Role::evaluator || barrier_open_) {
    send(id, welcome(id));
    return;
  }
  welcome_waiting_.push_back(id);
  if (std::all_of(worker_ids_.begin(), worker_ids_.end(), [](const std::string& s) { return !s.empty(); })) {
    barrier_open_ = true;
    last_message_ = Clock::now();
    for (const auto& w : welcome_waiting_) send(w, welcome(w));
    welcome_waiting_.clear();
  }
}

void Server::on_pull(const std::string& id, const Peer& p, long clock) {
  const auto now = Clock::now();
  if (p.role == wire::Role::evaluator) {
    serve_pull(id, p.rank, clock, now);
    return;
  }
  if (clock != state_->clock_of(p.rank)) {
    reply_error(id, wire::ErrorCode::protocol, "pull for clock " + std::to_string(clock) + " from worker " +
                                                   std::to_string(p.rank) + ", whose clock here is " +
                                                   std::to_string(state_->clock_of(p.rank)));
    return;
  }
  if (state_->pull_ready(clock)) {
    serve_pull(id, p.rank, clock, now);
  } else {
    held_.push_back(HeldPull{id, p.rank, clock, now, now});
    ++counters_.pulls_held;
  }
}

void Server::on_push(const std::string& id, const Peer& p, const wire::Push& m, const comm::Message& msg) {
  if (p.role != wire::Role::worker) {
    reply_error(id, wire::ErrorCode::protocol, "only workers push");
    return;
  }
  if (m.offset != range_.offset || m.length != range_.length) {
    reply_error(id, wire::ErrorCode::wrong_shard,
                "push for floats [" + std::to_string(m.offset) + ", " + std::to_string(m.offset + m.length) +
                    "); server " + std::to_string(opt_.shard) + " holds [" + std::to_string(range_.offset) + ", " +
                    std::to_string(range_.offset + range_.length) + ")");
    return;
  }
  const PushCodec& codec = state_->codec();
  if (m.codec != codec.wire_id()) {
    reply_error(id, wire::ErrorCode::config, "push encoded with codec id " + std::to_string(m.codec) +
                                                 "; this run's cluster.codec is \"" + codec.name() + "\" (id " +
                                                 std::to_string(codec.wire_id()) + ")");
    return;
  }
  const std::size_t got = msg.has_payload() ? msg.payload().size() : 0, most = codec.max_bytes(m.length);
  if (!msg.has_payload() || got != m.bytes || got > most) {
    reply_error(id, wire::ErrorCode::wrong_size, "push payload of " + std::to_string(got) + " bytes; the header says " +
                                                     std::to_string(m.bytes) + " bytes, " + codec.name() + " of " +
                                                     std::to_string(m.length) + " floats takes at most " +
                                                     std::to_string(most));
    return;
  }
  // The gradient is applied (or accumulated, or refused) before any answer leaves: its bytes go
  // back to the worker first (shm lends them), so the worker may reuse them once answered.
  try {
    state_->push(p.rank, m.clock, m.version_pulled, m.batch, msg.payload(), m.checksum);
    msg_.done_with_payload();
  } catch (const ProtocolError& e) {
    msg_.done_with_payload();
    reply_error(id, wire::ErrorCode::protocol, e.what());
    return;
  } catch (const ChecksumError& e) {
    msg_.done_with_payload();
    reply_error(id, wire::ErrorCode::bad_checksum, e.what());
    return;
  } catch (const PayloadError& e) {
    msg_.done_with_payload();
    reply_error(id, wire::ErrorCode::bad_payload, e.what());
    return;
  }
  if (trace_) trace_->push(p.rank, m.clock, m.version_pulled, m.batch);
  ++counters_.pushes;
  auto& pushed = counters_.pushed[codec.name()];
  ++pushed.pushes;
  pushed.payload_bytes += long(got);
  if (m.then_pull) {
    ++counters_.pulls;
    on_pull(id, p, m.clock + 1);
  } else {
    send(id, header(wire::PushAck{m.clock, state_->version()}));
  }
}

void Server::serve_progress(const std::string& id, const Peer& p) {
  if (p.role != wire::Role::evaluator) {
    reply_error(id, wire::ErrorCode::protocol, "a progress-only Pull from worker " + std::to_string(p.rank) +
                                                   ": only the evaluator asks for progress without θ");
    return;
  }
  ++counters_.progress_polls;
  send(id, header(wire::PullReply{state_->min_clock(), state_->version(), state_->min_clock(),
                                  state_->samples_applied(), 0, finished() == cfg_.cluster.workers, 0,
                                  range_.offset, /*length*/ 0, /*codec*/ 0, /*bytes*/ 0}));
}

void Server::serve_pull(const std::string& id, int rank, long clock, Clock::time_point since) {
  const double held_s = seconds(Clock::now() - since);
  counters_.hold_ms_total += held_s * 1e3;
  counters_.hold_ms_max = std::max(counters_.hold_ms_max, held_s * 1e3);
  if (rank >= 0) state_->record_pull(rank, clock);
  if (trace_ && rank >= 0) trace_->pull(rank, clock, state_->version());
  ParamVersions& pv = state_->params();
  wire::PullReply r{clock, state_->version(), state_->min_clock(), state_->samples_applied(), long(held_s * 1e6),
                    finished() == cfg_.cluster.workers, state_->current_checksum(), range_.offset, range_.length,
                    /*codec: dense f32*/ 0, range_.length * sizeof(float)};
  if (pull_encoded_ && rank >= 0) {  // cluster.pull_codec: workers get θ encoded (the evaluator f32)
    EncodedVersions::Buffer* e = pull_encoded_->acquire(pv.current(), state_->version());  // released once sent
    r.codec = pull_encoded_->wire_id();
    r.bytes = e->size;
    r.checksum = e->checksum;
    send(id, header(r), comm::OutPayload{e->bytes.data(), e->size, &free_encoded_buffer, e});
  } else {
    ParamVersions::Buffer* buf = pv.acquire_current();  // released by the transport once sent
    send(id, header(r), comm::OutPayload{buf->data, pv.size() * sizeof(float), &free_param_buffer, buf});
  }
  if (opt_.record_pulls && metrics_ && rank >= 0)
    metrics_->write({{"kind", "pull"}, {"worker", rank}, {"clock", clock}, {"min_clock", r.min_clock},
                     {"version", r.version}, {"held_ms", held_s * 1e3}});
}

void Server::release_ready_pulls() {
  for (std::size_t i = 0; i < held_.size();) {
    if (state_->pull_ready(held_[i].clock)) {
      const HeldPull h = held_[i];
      held_.erase(held_.begin() + std::ptrdiff_t(i));
      serve_pull(h.identity, h.rank, h.clock, h.since);
    } else {
      ++i;
    }
  }
}

void Server::expire_held_pulls() {
  const auto now = Clock::now();
  const auto timeout = std::chrono::duration<double>(cfg_.cluster.timeout_s);
  for (std::size_t i = 0; i < held_.size();) {
    if (now - held_[i].since > timeout) {
      const HeldPull h = held_[i];
      held_.erase(held_.begin() + std::ptrdiff_t(i));
      char b[64];
      std::snprintf(b, sizeof b, " held %.1f s: ", seconds(now - h.since));
      reply_error(h.identity, wire::ErrorCode::timeout,
                  "pull of worker " + std::to_string(h.rank) + " for clock " + std::to_string(h.clock) + b + state_->why_held(h.clock));
      std::fprintf(stderr, "server %d: timeout: pull of worker %d for clock %ld: %s\n", opt_.shard, h.rank, h.clock,
                   state_->why_held(h.clock).c_str());
    } else {
      ++i;
    }
  }
}

void Server::find_lost_workers(Clock::time_point now) {
  if (!barrier_open_) return;  // before it, the start barrier's own timeout names who is missing
  const auto limit = std::chrono::duration<double>(cfg_.cluster.heartbeat_s);
  for (int r = 0; r < cfg_.cluster.workers; ++r) {
    if (said_bye_[std::size_t(r)] || state_->dropped(r)) continue;
    const auto silent = now - worker_heard_[std::size_t(r)];
    if (silent <= limit) continue;
    if (!continue_on_loss_) {
      char b[200];
      std::snprintf(b, sizeof b, ": worker %d lost: silent for %.1f s at clock %ld (cluster.heartbeat_s = %g); ", r,
                    seconds(silent), state_->clock_of(r), cfg_.cluster.heartbeat_s);
      throw std::runtime_error("server " + std::to_string(opt_.shard) + " (" + opt_.endpoint + ")" + b +
                               (state_->rule().trains_without_lost_workers()
                                    ? "cluster.on_worker_loss = \"fail\""
                                    : cfg_.cluster.mode + " cannot train on without it"));
    }
    lose_worker(r, seconds(silent));
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
  std::fprintf(stderr, "server %d: worker %d rejoined at clock %ld (this server's checkpoint had it at %ld: %ld update(s) lost)\n",
               opt_.shard, rank, clock, was, lost);
  if (metrics_) {
    metrics_->write({{"kind", "worker_rejoined"}, {"shard", opt_.shard}, {"worker", rank}, {"clock", clock},
                     {"checkpoint_clock", was}, {"updates_lost", lost}});
    metrics_->flush();
  }
}

void Server::beat_held_pulls(Clock::time_point now) {
  const auto every = std::chrono::duration<double>(cfg_.cluster.heartbeat_s / 4);
  for (auto& h : held_)
    if (now - h.beat_at >= every) {
      // Not a reply: not counted in bytes_out (the summary's bytes_pulled); a Beat that cannot
      // leave is one the worker's own timeout covers.
      (void)listener_->send(h.identity, enc_.encode(header(wire::Beat{state_->version()})));
      h.beat_at = now;
    }
}

void Server::lose_worker(int rank, double silent_s) {
  state_->drop_worker(rank);
  if (trace_) trace_->event("drop " + std::to_string(rank));
  const long clock = state_->clock_of(rank);
  losses_.push_back({{"worker", rank}, {"clock", clock}, {"silent_s", silent_s}});
  std::fprintf(stderr, "server %d: worker %d lost: silent for %.1f s at clock %ld (cluster.heartbeat_s = %g); "
               "training goes on without it (cluster.on_worker_loss)\n", opt_.shard, rank, silent_s, clock,
               cfg_.cluster.heartbeat_s);
  for (std::size_t i = 0; i < held_.size();) {  // its held pull, if it hangs rather than died
    if (held_[i].rank == rank) {
      const HeldPull h = held_[i];
      held_.erase(held_.begin() + std::ptrdiff_t(i));
      send(h.identity, header(wire::Error{wire::ErrorCode::protocol, "worker " + std::to_string(rank) +
                                                                         " was dropped from this run as lost"}));
    } else {
      ++i;
    }
  }
  if (metrics_) {
    metrics_->write({{"kind", "worker_lost"}, {"shard", opt_.shard}, {"worker", rank}, {"clock", clock}, {"silent_s", silent_s}});
    metrics_->flush();
  }
}

std::string Server::missing_hellos() const {
  std::string m;
  for (int r = 0; r < cfg_.cluster.workers; ++r)
    if (worker_ids_[std::size_t(r)].empty()) m += (m.empty() ? "workers " : ", ") + std::to_string(r);
  return m.empty() ? "nobody" : m;
}

void Server::send(const std::string& id, const wire::Header& h, comm::OutPayload payload) {
  const std::span<const std::byte> head = enc_.encode(h);
  const long bytes = long(head.size() + payload.size);
  if (listener_->send(id, head, payload)) {
    counters_.bytes_out += bytes;
    return;
  }
  // The peer is gone, or not reading its replies: the reply is dropped. Counted, and said on
  // stderr for the first few, so that a timeout elsewhere can be traced back here.
  if (++counters_.dropped_replies <= 5) {
    const auto it = peers_.find(id);
    const std::string who = it == peers_.end()                      ? "a peer that never said Hello"
                            : it->second.role == wire::Role::worker ? "worker " + std::to_string(it->second.rank)
                                                                    : "the evaluator";
    std::fprintf(stderr, "server %d: could not queue the %s reply (%ld bytes) to %s: gone, or not reading%s\n", opt_.shard,
                 wire::body_name(h.body), bytes, who.c_str(), counters_.dropped_replies == 5 ? " (further drops are only counted)" : "");
  }
}

void Server::reply_error(const std::string& id, wire::ErrorCode code, const std::string& message) {
  if (code != wire::ErrorCode::timeout) ++counters_.bad[wire::error_code_name(code)];
  send(id, header(wire::Error{code, message}));
}

void Server::write_stats(bool final) {
  if (!metrics_) return;
  nlohmann::ordered_json j{{"kind", final ? "server_final" : "server"},
                           {"shard", opt_.shard},
                           {"version", state_->version()},
                           {"samples_applied", state_->samples_applied()},
                           {"min_clock", state_->min_clock()},
                           {"pushes", counters_.pushes},
                           {"pulls", counters_.pulls},
                           {"pulls_held", counters_.pulls_held},
                           {"progress_polls", counters_.progress_polls},
                           {"hold_ms_total", counters_.hold_ms_total},
                           {"hold_ms_max", counters_.hold_ms_max},
                           {"bytes_in", counters_.bytes_in},
                           {"bytes_bad", counters_.bytes_bad},
                           {"bytes_out", counters_.bytes_out},
                           {"bad_total", counters_.bad_total()},
                           {"bad", counters_.bad},
                           {"dropped_replies", counters_.dropped_replies},
                           {"peers_refused", transport_.peers_refused()},
                           {"pushed", pushed_json(counters_)},
                           {"workers_lost", losses_},
                           {"updates_lost", updates_lost_}};
  if (final) {
    // The histograms only: the launcher's summary derives the statistics, once, over every shard.
    nlohmann::ordered_json hist;
    for (std::size_t w = 0; w < state_->staleness_histogram().size(); ++w)
      hist[std::to_string(w)] = state_->staleness_histogram()[w];
    j["staleness_hist"] = hist;
    j["param_buffers"] = state_->params().buffers();
    char sum[24];  // the shard's θ: a replay of this run's order (launch.py replay) must end on the same
    std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(state_->current_checksum()));
    j["params_checksum"] = sum;
    if (state_->pulled_params_bytes()) j["pulled_params_bytes"] = state_->pulled_params_bytes();  // dcasgd's copies of θ
  }
  if (trace_) trace_->flush();
  metrics_->write(j);
  metrics_->flush();
}

}  // namespace pslab
