#include "virtual_cluster.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <queue>
#include <stdexcept>

#include <sys/resource.h>

#include "comm/wire.h"
#include "core/optimizer.h"
#include "core/replica.h"
#include "core/sampler.h"
#include "eval_schedule.h"
#include "progress.h"
#include "ps/codecs/codec.h"
#include "ps/order_trace.h"
#include "ps/shard_state.h"
#include "run/metrics.h"
#include "run/setup.h"
#include "straggler.h"
#include "train_log.h"

namespace pslab {

namespace {

// ---- simulated time -------------------------------------------------------------------------
enum class Ev { arrive, applied, reply, eval };

struct Event {
  double t;
  long seq;  // ties: the order they were scheduled in
  Ev kind;
  int worker, shard;
};

struct Later {
  bool operator()(const Event& a, const Event& b) const { return a.t > b.t || (a.t == b.t && a.seq > b.seq); }
};

class Events {
 public:
  void at(double t, Ev kind, int worker = -1, int shard = -1) { q_.push({t, seq_++, kind, worker, shard}); }
  bool empty() const { return q_.empty(); }
  Event next() {
    Event e = q_.top();
    q_.pop();
    now = e.t;
    return e;
  }
  double now = 0.0;  // simulated seconds since the run's start; the metrics' clock

 private:
  std::priority_queue<Event, std::vector<Event>, Later> q_;
  long seq_ = 0;
};

// ---- the cost model ([virtual]) -------------------------------------------------------------
struct Costs {
  double compute_s, latency_s, bytes_per_s, apply_bytes_per_s, allreduce_s;
  double message(std::size_t bytes) const { return latency_s + double(bytes) / bytes_per_s; }
  double apply(std::size_t bytes) const { return double(bytes) / apply_bytes_per_s; }
};

// A worker's step at the config's batch on this machine: the median of a few real ones.
double measure_compute_s(Replica& replica, ShardSampler& sampler, int batch) {
  using Clock = std::chrono::steady_clock;
  sampler.set_epoch(0);
  std::vector<double> times;
  for (int i = 0; i < 25; ++i) {
    const auto t0 = Clock::now();
    replica.compute_gradient(sampler.batch(i % std::max(1L, sampler.steps_per_epoch(batch)), batch));
    if (i >= 5) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::nth_element(times.begin(), times.begin() + long(times.size() / 2), times.end());
  return times[times.size() / 2];
}

// ---- what every engine shares -----------------------------------------------------------------
struct SimWorker {
  std::vector<float> buf;   // θ as its slices arrive, then ∇θ while its slices are pushed
  std::unique_ptr<ShardSampler> sampler;
  std::unique_ptr<MetricsWriter> metrics;
  std::unique_ptr<Progress> progress;
  std::unique_ptr<TrainLog> log;
  std::unique_ptr<Straggler> straggler;
  long step = 0;            // the step it is pulling θ for, computing, then pushing
  int replies = 0;          // shards that have answered this step's request
  std::vector<long> version_pulled;  // per shard, for the step being computed
  std::vector<std::unique_ptr<PushCodec>> encoders;  // per shard, codecs but f32 (as PsClient's)
  std::vector<std::byte> encoded;                   // a push's payload, reused
  int batch = 0;            // samples of the step being pushed
  double loss = 0.0;
  double sent_t = 0.0, compute_s = 0.0, delay_s = 0.0, held_s = 0.0;
  bool done = false;
};

struct SimServer {
  std::unique_ptr<ShardState> state;
  std::unique_ptr<MetricsWriter> metrics;
  double busy_until = 0.0;
  std::vector<std::pair<int, double>> held;  // (worker, since) whose pull waits for the rule
  long pushes = 0, pulls = 0, pulls_held = 0, bytes_in = 0, bytes_out = 0;
  double hold_ms_total = 0.0;
};

class VirtualCluster {
 public:
  VirtualCluster(const ExperimentConfig& cfg, const VirtualOptions& opt, int procs_on_host)
      : cfg_(cfg), opt_(opt), W_(cfg.cluster.workers), S_(cfg.uses_servers() ? cfg.cluster.servers : 0) {
    if (cfg.uses_servers() && make_rule(cfg.cluster.mode)->worker_protocol().push != WorkerProtocol::Push::gradient)
      throw std::invalid_argument("cluster.mode = \"" + cfg.cluster.mode +
                                  "\": the virtual cluster simulates gradient-pushing modes only (bsp, ssp, asp, "
                                  "dcasgd, allreduce); run this one on a real cluster (cluster.launcher = \"local\")");
    be_ = make_cpu_backend(blas_threads(cfg, procs_on_host));
    data_ = load_data(cfg);
    spec_ = model_spec(cfg);
    P_ = count_params(spec_);
    replica_ = std::make_unique<Replica>(*be_, spec_, data_.train, std::max(cfg.train.batch, cfg.eval.batch));
    spe_ = steps_per_epoch(cfg, W_);
    total_ = total_steps(cfg, spe_);
    workers_.resize(std::size_t(W_));
    for (int r = 0; r < W_; ++r) {
      SimWorker& w = workers_[std::size_t(r)];
      w.sampler = std::make_unique<ShardSampler>(std::size_t(data_.train.n), W_, r, cfg.seed);
      w.metrics = std::make_unique<MetricsWriter>(opt.out_dir + "/metrics/worker" + std::to_string(r) + ".jsonl", 0.0);
      w.metrics->use_clock(&ev_.now);
      w.progress = std::make_unique<Progress>("virtual worker " + std::to_string(r), opt.progress && r == 0);
      w.log = std::make_unique<TrainLog>(*w.metrics, *w.progress, r, cfg.train.log_every, total_);
      w.straggler = std::make_unique<Straggler>(cfg.straggler, cfg.seed, r, wall_clock());
      w.version_pulled.assign(std::size_t(S_), 0);
    }
    eval_metrics_ = std::make_unique<MetricsWriter>(opt.out_dir + "/metrics/evaluator.jsonl", 0.0);
    eval_metrics_->use_clock(&ev_.now);
    const VirtualConfig& v = cfg.virtual_cluster;
    const double compute_ms = S_ == 0 && v.allreduce_compute_ms > 0 ? v.allreduce_compute_ms : v.compute_ms;
    costs_ = {compute_ms * 1e-3, v.latency_us * 1e-6, v.bandwidth_gbps * 1e9, v.apply_gbps * 1e9, v.allreduce_ms * 1e-3};
    if (costs_.compute_s <= 0 && v.replay.empty()) {
      costs_.compute_s = measure_compute_s(*replica_, *workers_[0].sampler, cfg.train.batch);
      std::fprintf(stderr, "[virtual] a worker's step measured here: %.3f ms at batch %d (virtual.compute_ms)\n",
                   costs_.compute_s * 1e3, cfg.train.batch);
    }
    if (costs_.allreduce_s <= 0)  // a ring: 2 (W - 1) steps, each one message of P / W floats
      costs_.allreduce_s = W_ > 1 ? 2.0 * (W_ - 1) * costs_.message(P_ * sizeof(float) / std::size_t(W_)) : 0.0;
    if (S_ > 0) make_servers();
  }

  double run() {
    if (!cfg_.virtual_cluster.replay.empty()) replay(cfg_.virtual_cluster.replay);
    else if (S_ > 0) run_ps();
    else run_allreduce();
    return finish();
  }

 private:
  // ---- parameter servers --------------------------------------------------------------------
  void make_servers() {
    const std::vector<float> theta = initial_params(spec_, cfg_.seed);
    servers_.resize(std::size_t(S_));
    for (int k = 0; k < S_; ++k) {
      ShardState::Options so;
      so.mode = cfg_.cluster.mode;
      so.codec = cfg_.cluster.codec;
      so.workers = W_;
      so.range = shard_range(P_, S_, k);
      so.optimizer = cfg_.optimizer;
      so.layers = layer_sizes(spec_, so.range.offset, so.range.length);
      so.schedule = schedule_for_run(cfg_, spe_);
      so.train_size = train_set_size(cfg_);
      so.batch = cfg_.train.batch;
      so.threads = 1;
      std::vector<float> slice(theta.begin() + std::ptrdiff_t(so.range.offset),
                               theta.begin() + std::ptrdiff_t(so.range.offset + so.range.length));
      SimServer& s = servers_[std::size_t(k)];
      s.state = std::make_unique<ShardState>(*be_, so, std::move(slice));
      s.metrics = std::make_unique<MetricsWriter>(opt_.out_dir + "/metrics/server" + std::to_string(k) + ".jsonl", 0.0);
      s.metrics->use_clock(&ev_.now);
    }
    for (auto& w : workers_) {
      w.buf.assign(P_, 0.0f);
      if (servers_[0].state->codec().dense_f32()) continue;
      std::size_t most = 0;
      for (int k = 0; k < S_; ++k) {  // as PsClient: one encoder per shard, with the run's error feedback
        auto enc = make_codec(cfg_.cluster.codec);
        w.encoders.push_back(uses_error_feedback(cfg_) ? with_error_feedback(std::move(enc)) : std::move(enc));
        most = std::max(most, w.encoders.back()->max_bytes(range(k).length));
      }
      w.encoded.resize(most);
    }
  }

  ShardRange range(int k) const { return servers_[std::size_t(k)].state->options().range; }
  std::size_t shard_bytes(int k) const { return range(k).length * sizeof(float); }

  void run_ps() {
    std::fprintf(stderr, "[virtual] %s: %d workers, %d servers, %ld steps each, simulated (compute %.3f ms/step, "
                 "latency %.0f us, %.2f GB/s per link, servers apply %.2f GB/s)\n", cfg_.cluster.mode.c_str(), W_, S_,
                 total_, costs_.compute_s * 1e3, costs_.latency_s * 1e6, costs_.bytes_per_s * 1e-9,
                 costs_.apply_bytes_per_s * 1e-9);
    const double start = cfg_.virtual_cluster.startup_ms * 1e-3;
    for (int r = 0; r < W_; ++r)  // every worker asks every server for θ of step 0
      for (int k = 0; k < S_; ++k) ev_.at(start + costs_.latency_s, Ev::arrive, r, k);
    ev_.at(0.0, Ev::eval);
    while (!ev_.empty()) {
      const Event e = ev_.next();
      switch (e.kind) {
        case Ev::arrive: on_arrive(e.worker, e.shard); break;
        case Ev::applied: on_applied(e.worker, e.shard); break;
        case Ev::reply: on_reply(e.worker); break;
        case Ev::eval: on_eval(); break;
      }
    }
  }

  // A worker's request (its push of `step - 1`, if any, and its pull for `step`) reaches a
  // server, which takes one request at a time.
  void on_arrive(int r, int k) {
    SimServer& s = servers_[std::size_t(k)];
    const bool pushes = workers_[std::size_t(r)].step > 0;
    const double start = std::max(ev_.now, s.busy_until);
    s.busy_until = start + (pushes ? costs_.apply(shard_bytes(k)) : 0.0);
    ev_.at(s.busy_until, Ev::applied, r, k);
  }

  void on_applied(int r, int k) {
    SimWorker& w = workers_[std::size_t(r)];
    SimServer& s = servers_[std::size_t(k)];
    if (w.step > 0) {  // the request carries the push of its step before
      push_slice(r, k, w.step - 1, w.version_pulled[std::size_t(k)], w.batch);
      if (ticks_.due(double(s.state->samples_applied()) / double(data_.train.n))) ev_.at(ev_.now, Ev::eval);
    }
    if (w.done) {  // its last push: acknowledged, no pull
      ev_.at(ev_.now + costs_.latency_s, Ev::reply, r, k);
    } else if (s.state->pull_ready(w.step)) {
      serve(r, k, ev_.now);
    } else {
      ++s.pulls_held;
      s.held.emplace_back(r, ev_.now);
    }
    // A push may complete what held pulls wait for (bsp's clock, ssp's bound).
    for (std::size_t i = 0; i < s.held.size();) {
      const auto [h, since] = s.held[i];
      if (s.state->pull_ready(workers_[std::size_t(h)].step)) {
        s.held.erase(s.held.begin() + long(i));
        serve(h, k, since);
      } else {
        ++i;
      }
    }
  }

  // Worker r's gradient slice k, encoded as its PsClient would (dense f32: as it is), applied.
  void push_slice(int r, int k, long clock, long version_pulled, int batch) {
    SimWorker& w = workers_[std::size_t(r)];
    const ShardRange g = range(k);
    const float* grad = w.buf.data() + g.offset;
    std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(grad), g.length * sizeof(float));
    if (!w.encoders.empty())
      payload = {w.encoded.data(), w.encoders[std::size_t(k)]->encode(grad, g.length, w.encoded.data())};
    SimServer& s = servers_[std::size_t(k)];
    s.state->push(r, clock, version_pulled, batch, payload, wire::checksum_bytes(payload.data(), payload.size()));
    ++s.pushes;
    s.bytes_in += long(payload.size());
  }

  // θ's slice k, as it is now, into worker r's buffer (its pull for `step` served).
  void copy_slice(int r, int k, long step) {
    SimWorker& w = workers_[std::size_t(r)];
    SimServer& s = servers_[std::size_t(k)];
    const ShardRange g = range(k);
    std::memcpy(w.buf.data() + g.offset, s.state->current(), g.length * sizeof(float));
    s.state->record_pull(r, step);  // (dcasgd keeps what it served)
    w.version_pulled[std::size_t(k)] = s.state->version();
    ++s.pulls;
    s.bytes_out += long(shard_bytes(k));
  }

  // A pull served now, held since `since`; the reply reaches the worker after the link's time.
  void serve(int r, int k, double since) {
    SimWorker& w = workers_[std::size_t(r)];
    SimServer& s = servers_[std::size_t(k)];
    copy_slice(r, k, w.step);
    s.hold_ms_total += (ev_.now - since) * 1e3;
    w.held_s = std::max(w.held_s, ev_.now - since);
    ev_.at(ev_.now + costs_.message(shard_bytes(k)), Ev::reply, r, k);
  }

  // Every server has answered: the step's θ is complete (or, after the last push, the run is over
  // for this worker). Log the step before, compute this one, send its push with the next pull.
  void on_reply(int r) {
    SimWorker& w = workers_[std::size_t(r)];
    if (++w.replies < S_) return;
    w.replies = 0;
    if (w.step > 0) log_step(r);
    if (w.done) return;
    compute(r);
    const double leave = ev_.now + w.compute_s + w.delay_s;
    w.sent_t = leave;
    w.held_s = 0.0;
    if (++w.step == total_) w.done = true;  // the last push carries no pull
    for (int k = 0; k < S_; ++k) ev_.at(leave + costs_.message(shard_bytes(k)), Ev::arrive, r, k);
  }

  // The real gradient of worker r's batch at its step, on the θ it pulled, into its buffer.
  void compute(int r) {
    SimWorker& w = workers_[std::size_t(r)];
    const auto idx = batch_of(w, w.step);
    std::memcpy(replica_->host_params(), w.buf.data(), P_ * sizeof(float));
    replica_->upload_params();
    w.loss = replica_->compute_gradient(idx);
    std::memcpy(w.buf.data(), replica_->download_grads(), P_ * sizeof(float));
    w.batch = int(idx.size());
    w.compute_s = costs_.compute_s * double(idx.size()) / double(cfg_.train.batch);
    w.delay_s = w.straggler->delay_s(w.compute_s);
  }

  std::span<const std::uint32_t> batch_of(SimWorker& w, long step) {
    w.sampler->set_epoch(step / spe_);
    return w.sampler->batch(step % spe_, cfg_.train.batch);
  }

  void log_step(int r) {
    SimWorker& w = workers_[std::size_t(r)];
    const long step = w.step - 1;  // its push and the pull after it are answered
    StepRecord rec;
    rec.loss = w.loss;
    rec.samples = w.batch;
    rec.compute_s = w.compute_s;
    rec.delay_s = w.delay_s;
    rec.comm_s = ev_.now - w.sent_t;
    rec.wait_s = w.done ? 0.0 : w.held_s;
    rec.version = *std::min_element(w.version_pulled.begin(), w.version_pulled.end());
    w.log->add(step, double(step + 1) / double(spe_), rec, step == total_ - 1 || (step + 1) % spe_ == 0);
    if (w.done && ++finished_ == W_) ev_.at(ev_.now, Ev::eval);  // the evaluator's last evaluation
  }

  // The evaluator: an ungated pull of every shard every eval.interval_s, and once at the end.
  void on_eval() {
    if (final_done_) return;
    const bool final = finished_ == W_;
    final_done_ = final;
    std::vector<float>& theta = eval_theta();
    long min_v = -1, max_v = -1, min_clock = -1, samples = 0;
    for (int k = 0; k < S_; ++k) {
      const ShardState& st = *servers_[std::size_t(k)].state;
      std::memcpy(theta.data() + range(k).offset, st.current(), shard_bytes(k));
      min_v = min_v < 0 ? st.version() : std::min(min_v, st.version());
      max_v = std::max(max_v, st.version());
      min_clock = min_clock < 0 ? st.min_clock() : std::min(min_clock, st.min_clock());
      samples = k == 0 ? st.samples_applied() : std::min(samples, st.samples_applied());
    }
    ticks_.due(double(samples) / double(data_.train.n));  // (eval.every_epochs: this one counts as a tick)
    evaluate(theta, min_clock, samples, final, {min_v, max_v});
    if (!final && !ticks_.on()) ev_.at(ev_.now + cfg_.eval.interval_s, Ev::eval);  // (ticks: on_applied)
  }

  std::vector<float>& eval_theta() {
    if (eval_theta_.size() != P_) eval_theta_.assign(P_, 0.0f);
    return eval_theta_;
  }

  void evaluate(const std::vector<float>& theta, long step, long samples, bool final, std::pair<long, long> versions) {
    std::memcpy(replica_->host_params(), theta.data(), P_ * sizeof(float));
    replica_->upload_params();
    const EvalCounts e = replica_->evaluate(data_.test);
    const bool classification = data_.test.classes > 0;
    const double loss = e.loss_sum / double(e.samples), acc = classification ? double(e.correct) / double(e.samples) : -1.0;
    nlohmann::ordered_json j{{"kind", "eval"}, {"step", step}, {"epoch", double(samples) / double(data_.train.n)},
                             {"test_loss", loss}};
    if (classification) j["test_acc"] = acc;
    j["eval_ms"] = 0.0;  // no simulated time: the simulated evaluator keeps up
    if (versions.first >= 0) j["versions"] = {versions.first, versions.second};
    if (final) j["final"] = true;
    eval_metrics_->write(j);
    result_ = classification ? acc : loss;
    if (opt_.progress)
      std::fprintf(stderr, "[virtual] simulated %.3f s  epoch %.2f  step %ld  test loss %.4f%s%s\n", ev_.now,
                   double(samples) / double(data_.train.n), step, loss,
                   classification ? ("  test accuracy " + std::to_string(100 * acc).substr(0, 5) + "%").c_str() : "",
                   final ? "  (final)" : "");
  }

  // ---- all-reduce: every rank computes on the same θ; the step ends when the slowest rank's
  // gradient is in and the all-reduce is done ----------------------------------------------------
  void run_allreduce() {
    std::fprintf(stderr, "[virtual] allreduce: %d ranks, %ld steps each, simulated (compute %.3f ms/step, all-reduce "
                 "%.3f ms)\n", W_, total_, costs_.compute_s * 1e3, costs_.allreduce_s * 1e3);
    Model& model = replica_->model();
    model.init(cfg_.seed);  // every rank starts from the same θ
    Optimizer optimizer(*be_, cfg_.optimizer, P_, layer_sizes(spec_, 0, P_));
    const ScheduleConfig schedule = schedule_for_run(cfg_, spe_);
    std::vector<float> sum(P_);
    const double n_train = double(data_.train.n);
    long samples = 0;
    double next_eval = 0.0;
    std::vector<float>& theta = eval_theta();
    ev_.now = cfg_.virtual_cluster.startup_ms * 1e-3;
    for (long step = 0; step < total_; ++step) {
      long global = 0;
      for (auto& w : workers_) global += long(batch_of(w, step).size());
      std::fill(sum.begin(), sum.end(), 0.0f);
      double slowest = 0.0;
      std::vector<double> ready(static_cast<std::size_t>(W_));
      for (int r = 0; r < W_; ++r) {
        SimWorker& w = workers_[std::size_t(r)];
        const auto idx = batch_of(w, step);
        w.loss = replica_->compute_gradient(idx, 1.0f / float(global));
        const float* g = model.grads();
        for (std::size_t i = 0; i < P_; ++i) sum[i] += g[i];
        w.batch = int(idx.size());
        w.compute_s = costs_.compute_s * double(idx.size()) / double(cfg_.train.batch);
        w.delay_s = w.straggler->delay_s(w.compute_s);
        ready[std::size_t(r)] = ev_.now + w.compute_s + w.delay_s;
        slowest = std::max(slowest, ready[std::size_t(r)]);
      }
      const double end = slowest + costs_.allreduce_s;
      if (ticks_.on() && step + 1 < total_ && ticks_.due(double(samples) / n_train)) {  // eval.every_epochs
        const double t = ev_.now;
        ev_.now = end;
        model.store_params(theta.data());
        evaluate(theta, step, samples, false, {-1, -1});
        ev_.now = t;
      }
      while (!ticks_.on() && next_eval <= end && step + 1 < total_) {  // the evaluator's snapshots, between the steps
        const double t = ev_.now;
        ev_.now = std::max(next_eval, t);
        model.store_params(theta.data());
        evaluate(theta, step, samples, false, {-1, -1});
        ev_.now = t;
        next_eval += cfg_.eval.interval_s;
      }
      const double lr = learning_rate(schedule, cfg_.optimizer.lr, W_ * cfg_.train.batch, double(samples) / n_train);
      optimizer.step(model.params(), sum.data(), lr);
      samples += global;
      ev_.now = end;
      for (int r = 0; r < W_; ++r) {
        SimWorker& w = workers_[std::size_t(r)];
        StepRecord rec;
        rec.loss = w.loss;
        rec.samples = w.batch;
        rec.compute_s = w.compute_s;
        rec.delay_s = w.delay_s;
        rec.comm_s = end - ready[std::size_t(r)];
        rec.lr = lr;
        rec.allreduce_bytes = long(P_ * sizeof(float));
        w.log->add(step, double(samples) / n_train, rec, step == total_ - 1 || (step + 1) % spe_ == 0);
      }
    }
    model.store_params(theta.data());
    evaluate(theta, total_, samples, true, {-1, -1});
    char sum_hex[24];
    std::snprintf(sum_hex, sizeof sum_hex, "%016llx", static_cast<unsigned long long>(wire::checksum(theta.data(), P_)));
    for (int r = 0; r < W_; ++r)
      workers_[std::size_t(r)].metrics->write({{"kind", "final"}, {"worker", r}, {"steps", total_}, {"params_checksum", sum_hex}});
  }

  // ---- replay of a recorded run --------------------------------------------------------------
  void replay(const std::string& run_dir) {
    if (S_ == 0) throw std::invalid_argument("virtual.replay: an allreduce run has no order to replay (it is deterministic)");
    std::vector<std::vector<TraceOp>> ops(static_cast<std::size_t>(S_));
    for (int k = 0; k < S_; ++k) ops[std::size_t(k)] = read_order_trace(run_dir + "/trace/server" + std::to_string(k) + ".txt");
    std::fprintf(stderr, "[virtual] replaying the order of %s: %d workers, %d servers\n", run_dir.c_str(), W_, S_);
    std::vector<std::size_t> at(static_cast<std::size_t>(S_), 0);
    std::vector<long> computed(static_cast<std::size_t>(W_), -1);  // the step whose gradient is in the worker's buffer
    long done_ops = 0, total_ops = 0;
    for (const auto& o : ops) total_ops += long(o.size());
    auto fail = [&](int k, const TraceOp& op, const std::string& why) {
      throw std::runtime_error("replay: server " + std::to_string(k) + ", operation " + std::to_string(at[std::size_t(k)] + 1) +
                               " (" + (op.kind == TraceOp::push ? "push" : "pull") + " of worker " + std::to_string(op.worker) +
                               ", step " + std::to_string(op.clock) + "): " + why);
    };
    bool moved = true;
    while (moved) {
      moved = false;
      for (int k = 0; k < S_; ++k) {
        auto& list = ops[std::size_t(k)];
        while (at[std::size_t(k)] < list.size()) {
          const TraceOp& op = list[at[std::size_t(k)]];
          if (op.worker < 0 || op.worker >= W_) fail(k, op, "no such worker");
          SimWorker& w = workers_[std::size_t(op.worker)];
          SimServer& s = servers_[std::size_t(k)];
          if (op.kind == TraceOp::pull) {
            if (s.state->version() != op.version)
              fail(k, op, "the shard is at version " + std::to_string(s.state->version()) + ", the run served " +
                              std::to_string(op.version));
            w.step = op.clock;
            copy_slice(op.worker, k, op.clock);
            if (++w.replies == S_) {  // the step's θ is complete: its gradient, as the real worker computed it
              w.replies = 0;
              compute(op.worker);
              computed[std::size_t(op.worker)] = op.clock;
              log_replayed(op.worker, op.clock, done_ops, total_ops);
            }
          } else {
            if (computed[std::size_t(op.worker)] != op.clock) break;  // its gradient is not computed yet
            if (w.batch != op.batch) fail(k, op, "the batch is " + std::to_string(w.batch) + " samples, the run pushed " +
                                                    std::to_string(op.batch));
            push_slice(op.worker, k, op.clock, op.version, op.batch);
          }
          ++at[std::size_t(k)];
          ++done_ops;
          ev_.now = double(done_ops) * 1e-3;  // logical time: one millisecond per operation
          moved = true;
        }
      }
    }
    for (int k = 0; k < S_; ++k)
      if (at[std::size_t(k)] < ops[std::size_t(k)].size())
        fail(k, ops[std::size_t(k)][at[std::size_t(k)]], "it waits for a gradient the recorded order never lets the "
                                                           "worker compute: the traces do not belong together");
    std::vector<float>& theta = eval_theta();
    long samples = 0;
    for (int k = 0; k < S_; ++k) {
      std::memcpy(theta.data() + range(k).offset, servers_[std::size_t(k)].state->current(), shard_bytes(k));
      samples = k == 0 ? servers_[0].state->samples_applied() : std::min(samples, servers_[std::size_t(k)].state->samples_applied());
    }
    evaluate(theta, total_, samples, true, {-1, -1});
  }

  void log_replayed(int r, long step, long done, long total) {
    SimWorker& w = workers_[std::size_t(r)];
    StepRecord rec;
    rec.loss = w.loss;
    rec.samples = w.batch;
    rec.version = *std::min_element(w.version_pulled.begin(), w.version_pulled.end());
    w.log->add(step, double(step + 1) / double(spe_), rec, step == total_ - 1 || (step + 1) % spe_ == 0);
    if (opt_.progress && r == 0 && (step + 1) % spe_ == 0)
      std::fprintf(stderr, "[virtual] replay: %ld of %ld operations\n", done, total);
  }

  // ---- the end: the servers' final lines, as a real run's --------------------------------------
  double finish() {
    for (int k = 0; k < S_; ++k) {
      SimServer& s = servers_[std::size_t(k)];
      const ShardState& st = *s.state;
      nlohmann::ordered_json hist;
      for (std::size_t w = 0; w < st.staleness_histogram().size(); ++w) hist[std::to_string(w)] = st.staleness_histogram()[w];
      char sum[24];
      std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(st.current_checksum()));
      s.metrics->write({{"kind", "server_final"}, {"shard", k}, {"version", st.version()},
                        {"samples_applied", st.samples_applied()}, {"min_clock", st.min_clock()}, {"pushes", s.pushes},
                        {"pulls", s.pulls}, {"pulls_held", s.pulls_held}, {"hold_ms_total", s.hold_ms_total},
                        {"bytes_in", s.bytes_in}, {"bytes_out", s.bytes_out},
                        {"pushed", {{st.codec().name(), {{"pushes", s.pushes}, {"payload_bytes", s.bytes_in}}}}},
                        {"staleness_hist", hist}, {"params_checksum", sum},
                        {"pulled_params_bytes", st.pulled_params_bytes()}, {"simulated", true}});
      s.metrics->flush();
    }
    for (auto& w : workers_) w.metrics->flush();
    eval_metrics_->flush();
    return result_;
  }

  const ExperimentConfig& cfg_;
  const VirtualOptions& opt_;
  const int W_, S_;
  std::unique_ptr<Backend> be_;
  DataSplit data_;
  ModelSpec spec_;
  std::size_t P_ = 0;
  std::unique_ptr<Replica> replica_;  // every worker's compute and the evaluator's, in turn
  long spe_ = 0, total_ = 0;
  Events ev_;
  Costs costs_{};
  std::vector<SimWorker> workers_;
  std::vector<SimServer> servers_;
  std::unique_ptr<MetricsWriter> eval_metrics_;
  std::vector<float> eval_theta_;
  EpochTicks ticks_{cfg_.eval.every_epochs};  // eval.every_epochs: evaluations by epochs applied
  int finished_ = 0;
  bool final_done_ = false;
  double result_ = 0.0;
};

}  // namespace

double run_virtual_cluster(const ExperimentConfig& cfg, const VirtualOptions& opt) {
  // One metrics file per worker, open for the whole run: 1024 workers need more than the usual
  // soft limit of 1024 descriptors.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  VirtualCluster sim(cfg, opt, opt.procs_on_host);
  return sim.run();
}

}  // namespace pslab
