// The server's event loop: receive and answer, then the timers (held pulls, lost workers,
// Beats, stats, checkpoints), then the waits that end it with an error naming whom it waited for.
#include "server.h"

#include <algorithm>
#include <cstdio>

#include "run/setup.h"

namespace pslab {

namespace {

RunClock::duration from_s(double s) { return std::chrono::duration_cast<RunClock::duration>(std::chrono::duration<double>(s)); }

comm::Liveness::Options liveness_of_workers(const ExperimentConfig& cfg) {
  comm::Liveness::Options o;
  o.silence = from_s(cfg.cluster.heartbeat_s);
  o.beat_every = from_s(cfg.cluster.heartbeat_s / 4);
  // Watched once the start barrier is open (before it, the barrier's own timeout names who is
  // missing): open_barrier_when_full(), resume_from().
  return o;
}

}  // namespace

Server::Server(comm::Transport& transport, const ExperimentConfig& cfg, const ServerOptions& opt)
    : cfg_(cfg), opt_(opt), transport_(transport), clock_(transport.clock()),
      workers_(std::size_t(cfg.cluster.workers), liveness_of_workers(cfg), transport.clock().now()) {
  if (!cfg.uses_servers())
    throw std::invalid_argument("cluster.mode = \"" + cfg.cluster.mode + "\" runs without parameter servers");
  const ModelSpec spec = model_spec(cfg);
  num_params_ = count_params(spec);
  range_ = shard_range(num_params_, cfg.cluster.servers, opt.shard, shard_layers(cfg));
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
  total_steps_ = total_steps(cfg, steps_per_epoch(cfg, cfg.cluster.workers));
  so.train_size = train_set_size(cfg);
  so.batch = cfg.train.batch * cfg.train.accumulate;  // samples behind one push
  so.record_pulls = opt.record_pulls;
  so.threads = server_threads(cfg, opt.procs_on_host, opt.servers_on_host);
  so.memory = [&transport](std::size_t bytes) { return transport.payload_memory(bytes); };  // shm: replies without a copy
  so.pieces = pieces_of(cfg);
  state_ = std::make_unique<ShardState>(*cpu_, so, std::move(slice));
  if (cfg.cluster.pull_codec != "f32")
    pull_encoded_ = std::make_unique<EncodedVersions>(make_codec(cfg.cluster.pull_codec), range_.length);

  const int W = cfg.cluster.workers;
  worker_ids_.assign(std::size_t(W), "");
  said_bye_.assign(std::size_t(W), 0);
  may_return_until_.assign(std::size_t(W), time_point::min());
  awaited_.assign(std::size_t(W), 0);
  reconnect_window_ = from_s(reconnect_window_s(cfg));
  pushing_.resize(std::size_t(W));
  held_msgs_.resize(std::size_t(W));
  if (!opt.resume_path.empty()) resume_from(opt.resume_path);
  if (opt.restarted) restart_fresh();
  continue_on_loss_ = continues_without_lost_workers(cfg);
  if (cfg.cluster.push_guard) {
    guard_ = std::make_unique<PushGuard>(PushGuard::options_for(cfg), W);
    auto codec = make_codec(cfg.cluster.codec);  // the empty push: zeros, encoded as every push is
    const std::vector<float> zeros(range_.length, 0.0f);
    empty_payload_.resize(codec->max_bytes(range_.length));
    empty_payload_.resize(codec->encode(zeros.data(), zeros.size(), empty_payload_.data()));
    empty_checksum_ = wire::checksum_bytes(empty_payload_.data(), empty_payload_.size());
  }

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
  if (!opt.backup_of.empty()) {  // a backup: its primary's inputs come on a connection of its own
    comm::ConnectOptions co;
    co.linger = std::chrono::milliseconds(1000);
    upstream_ = transport.connect({opt.backup_of}, co);
    hello_upstream();
  } else {
    replica_expected_ = cfg.cluster.replicas > 1;
  }
  if (!opt.metrics_path.empty())
    metrics_ = std::make_unique<MetricsWriter>(opt.metrics_path, opt.run_start,  // (a backup may replace a copy that ended)
                                               !opt.resume_path.empty() || opt.restarted || !opt.backup_of.empty(), clock_);
  if (!opt.trace_path.empty()) {
    trace_ = std::make_unique<OrderTrace>(opt.trace_path, !opt.resume_path.empty() || opt.restarted);
    if (!opt.resume_path.empty() || opt.restarted) trace_->event("resume");
  }
}

Server::~Server() {
  // What a backup received from its primary goes before its connection, and the listener (whose
  // sends reference θ's buffers and the backup's copies) before those.
  held_msgs_.clear();
  spare_msgs_.clear();
  up_msg_ = comm::Message();
  upstream_.reset();
  listener_.reset();
}

bool Server::done() const {
  return finished() == cfg_.cluster.workers && (!opt_.wait_for_shutdown || shutdown_);
}

std::string Server::who() const { return "server " + std::to_string(opt_.shard) + " (" + opt_.endpoint + ")"; }

void Server::run() {
  started_ = last_message_ = upstream_heard_ = clock_.now();
  const auto timeout = from_s(cfg_.cluster.timeout_s), stats_every = from_s(opt_.stats_every_s);
  const auto checkpoint_every = from_s(cfg_.checkpoint.every_s);
  auto next_stats = started_ + stats_every, next_checkpoint = started_ + checkpoint_every;
  // Silence is looked for every 20th of heartbeat_s (at most every 50 ms), not after every message.
  const auto silence_every = std::min<RunClock::duration>(from_s(cfg_.cluster.heartbeat_s / 20), std::chrono::milliseconds(50));
  auto next_silence_check = started_;
  try {
    while (!done()) {
      if (opt_.stop && opt_.stop->load()) throw std::runtime_error(who() + ": stopped by a signal");
      const auto now = clock_.now();
      // (Silence is checked at least every 200 ms: heartbeat_s is seconds.)
      auto wake = std::min(next_stats, now + std::chrono::milliseconds(200));
      for (const auto& h : held_) wake = std::min({wake, h.since + timeout, workers_.next_beat(std::size_t(h.rank))});
      if (is_backup()) {
        serve_as_backup(wake);  // until a worker or the evaluator comes over
      } else if (serve_until(wake) && clock_.now() >= next_silence_check) {  // silence now is the peers', not this loop's
        find_lost_workers(clock_.now());
        watch_open_pushes(clock_.now());  // (a pass over the workers: as often as silence is looked for)
        check_replica(clock_.now());
        next_silence_check = clock_.now() + silence_every;
      }
      attach_joining_replica();  // a backup that joins a run under way, once no push is half-way
      release_ready_pulls();  // a worker dropped as lost may be what held pulls waited for
      expire_held_pulls(clock_.now());
      beat_held_pulls(clock_.now());
      const auto t = clock_.now();
      check_waits(t);
      if (t >= next_stats) {
        write_stats(false);
        next_stats = t + stats_every;
      }
      if (checkpoint_every.count() > 0 && !opt_.checkpoint_path.empty() && t >= next_checkpoint) {
        write_checkpoint_now("periodic");
        next_checkpoint = clock_.now() + checkpoint_every;
      }
    }
  } catch (...) {
    try {  // what the server holds is saved; an error saving it (a full disk) is said, the first error thrown
      write_stats(true);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "server %d: %s\n", opt_.shard, e.what());
    }
    try {
      if (!opt_.checkpoint_path.empty()) write_checkpoint_now("stopped");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "server %d: %s\n", opt_.shard, e.what());
    }
    throw;
  }
  // The last replies (the Shutdown's Ack) wait for the backup: until it has what came before them.
  for (const auto until = clock_.now() + from_s(cfg_.cluster.heartbeat_s); waiting_front_ < waiting_.size();) {
    if (clock_.now() >= until) lose_replica("no answer for the last inputs within cluster.heartbeat_s");
    else serve_until(std::min(until, clock_.now() + std::chrono::milliseconds(50)));
  }
  write_stats(true);
  if (!opt_.checkpoint_path.empty()) write_checkpoint_now("final");
}

bool Server::serve_until(time_point wake) {
  int i = 0;
  for (auto until = wake; i < 256 && listener_->recv(msg_, from_, until); ++i, until = clock_.now()) {
    handle(from_, msg_);
    // Pulls a message made ready are served before the next message is taken, so that what a
    // server does depends only on the order of its messages (a replay re-executes that order).
    release_ready_pulls();
  }
  return i < 256;
}

void Server::check_waits(time_point t) {
  const auto timeout = from_s(cfg_.cluster.timeout_s);
  char timeout_text[32];
  std::snprintf(timeout_text, sizeof timeout_text, "%g", cfg_.cluster.timeout_s);
  if (is_backup()) {  // its primary beats while idle: silent this long, it is gone, and nobody came over
    if (t - upstream_heard_ > timeout)
      throw std::runtime_error(who() + " (backup): nothing from its primary at " + opt_.backup_of + " for " + timeout_text +
                               " s, and no worker came over" + (barrier_open_ ? "" : " (the start barrier never opened)"));
    return;
  }
  if (!barrier_open_ && t - started_ > timeout)
    throw std::runtime_error(who() + ": start barrier: waited " + timeout_text + " s for Hello from " + missing_hellos());
  // Silence while nobody is held: held pulls expire first, with the more precise message.
  if (barrier_open_ && finished() < cfg_.cluster.workers && held_.empty() && t - last_message_ > timeout) {
    // A worker whose next pull the mode would hold is waiting for the others, not training.
    std::string training, waiting;
    for (int r = 0; r < cfg_.cluster.workers; ++r)
      if (!said_bye_[std::size_t(r)] && !state_->dropped(r)) {
        const long clock = state_->clock_of(r);
        std::string& list = state_->pull_ready(clock) ? training : waiting;
        char b[96];
        std::snprintf(b, sizeof b, "%sworker %d (clock %ld, last heard %.0f s ago)", list.empty() ? "" : ", ", r, clock,
                      workers_.silent_s(std::size_t(r), t));
        list += b;
      }
    throw std::runtime_error(who() + ": no message from any worker for " + timeout_text + " s; still training: " +
                             (training.empty() ? "nobody" : training) + (waiting.empty() ? "" : "; waiting for them: " + waiting));
  }
  // Training is over but the Shutdown that --wait-for-shutdown waits for does not come.
  if (finished() == cfg_.cluster.workers && !shutdown_ && t - last_message_ > timeout)
    throw std::runtime_error(who() + ": every worker said Bye " + timeout_text +
                             " s ago, but no Shutdown came (is the evaluator running? its log says why it stopped)");
}

}  // namespace pslab
