// The evaluator: measures test loss and accuracy of θ every eval.interval_s (or every
// eval.every_epochs) without slowing any training worker. θ comes from the parameter servers
// (PS modes: an ungated pull of every shard) or from rank 0's snapshots (all-reduce mode).
//
// Two threads: a taker, at the process's priority, takes each θ when it is due (a pull, or a
// snapshot received) into a queue of copies; the main thread evaluates them in order at a
// lower CPU priority (nice +kEvaluateNice), so that on a host whose cores the workers keep
// busy evaluation waits for idle moments (and the end of training) instead of taking their
// CPU, and no tick is lost to a slow evaluation while the queue has room (kQueueBytes).
//
// Its metrics lines ({"kind": "eval"}) name progress the same way in every mode:
//   t       when the evaluated θ was taken: the pull's answer came (PS modes) or the
//           snapshot was received (all-reduce), not when its evaluation ended, so that
//           "time to target" does not count the evaluator's own work
//   eval_ms how long after that the evaluation ended (the evaluator's lag behind training)
//   step    steps every worker has completed (PS modes: the slowest worker's clock as the
//           servers know it; all-reduce: the ranks' common step)
//   epoch   samples applied to θ / training-set size (all workers together)
//   versions  PS modes: [oldest, newest] shard version evaluated (updates applied)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <stop_token>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "ps/client.h"
#include "role_context.h"
#include "run/setup.h"
#include "eval_schedule.h"
#include "comm/snapshots.h"

namespace pslab {

namespace {

// Where θ comes from. next() fills theta and says what it is.
struct ParamSource {
  virtual ~ParamSource() = default;
  struct Info {
    long step = 0, samples = 0;
    long min_version = -1, max_version = -1;  // PS modes only
    bool final = false;
    long dropped = 0;  // all-reduce mode: bad messages dropped on the snapshot port so far
  };
  virtual Info next(float* theta) = 0;
  virtual void finish() {}
};

// PS modes: θ by an ungated pull of every shard, when it is due: every eval.interval_s, or when
// the samples applied reach the next eval.every_epochs tick, and when training is done. Between
// θs the servers are asked only for their progress (headers, no θ) every kPoll, so that the end
// of training is seen within kPoll however long the interval. After the last θ, Shutdown.
class ServerSource final : public ParamSource {
 public:
  explicit ServerSource(RoleContext& ctx)
      : clock_(ctx.clock()),
        client_(ctx.transport(), ctx.opt.servers, client_options(ctx.cfg, wire::Role::evaluator, wire::kEvaluator, ctx.opt.backups)),
        interval_(std::chrono::duration_cast<RunClock::duration>(std::chrono::duration<double>(ctx.cfg.eval.interval_s))),
        ticks_(ctx.cfg.eval.every_epochs), train_n_(double(ctx.data().train.n)) {
    client_.connect();
    next_ = clock_.now();
  }
  Info next(float* theta) override {
    const auto poll = std::chrono::duration_cast<RunClock::duration>(std::chrono::duration<double>(kPoll));
    while (true) {
      bool due = !ticks_.on() && clock_.now() >= next_;  // eval.interval_s: the tick has come
      if (!due) {
        const PullResult p = client_.progress();
        due = p.training_done || ticks_.due(double(p.samples_applied) / train_n_);
      }
      if (due) {
        // Evaluation may take longer than the interval: never queue up missed ticks.
        next_ = std::max(next_ + interval_, clock_.now());
        const PullResult r = client_.pull(0, theta);
        return Info{r.min_clock, r.samples_applied, r.min_version, r.max_version, r.training_done};
      }
      clock_.sleep_until(ticks_.on() ? clock_.now() + poll : std::min(next_, clock_.now() + poll));
    }
  }
  void finish() override { client_.shutdown(); }

 private:
  static constexpr double kPoll = 0.02;  // s between progress polls
  RunClock& clock_;  // the role's
  PsClient client_;
  RunClock::duration interval_;
  EpochTicks ticks_;
  double train_n_;
  RunClock::time_point next_;
};

// All-reduce mode: rank 0 sends snapshots every interval.
class SnapshotSource final : public ParamSource {
 public:
  SnapshotSource(RoleContext& ctx, std::size_t P) : rx_(ctx.transport(), ctx.opt.snapshots, ctx.cfg.cluster.timeout_s), P_(P) {}
  Info next(float* theta) override {
    const Snapshot s = rx_.next(theta, P_);
    return Info{s.step, s.samples, -1, -1, s.final, s.dropped};
  }

 private:
  SnapshotReceiver rx_;
  std::size_t P_;
};

// θs taken and not yet evaluated, in order; their buffers are reused once evaluated.
// Threading: the taker calls take_buffer/put/fail, the evaluator next/give_back.
class TakenQueue {
 public:
  struct Item {
    std::vector<float> theta;
    ParamSource::Info info;
    double taken_s = 0.0;
  };
  TakenQueue(std::size_t floats, std::size_t capacity) : floats_(floats), capacity_(capacity) {}
  // A buffer to take θ into: a free one, a new one while fewer than `capacity` exist, or else
  // the next one evaluated (waiting for it; null if `stop` is requested meanwhile).
  std::unique_ptr<Item> take_buffer(std::stop_token stop) {
    std::unique_lock lock(mu_);
    if (free_.empty() && made_ < capacity_) {
      ++made_;
      auto item = std::make_unique<Item>();
      item->theta.resize(floats_);
      return item;
    }
    if (!cv_.wait(lock, stop, [&] { return !free_.empty(); })) return nullptr;
    auto item = std::move(free_.back());
    free_.pop_back();
    return item;
  }
  void put(std::unique_ptr<Item> item) {
    std::lock_guard lock(mu_);
    queued_.push_back(std::move(item));
    cv_.notify_all();
  }
  // The taker failed: next() rethrows `e` once every θ taken before was evaluated.
  void fail(std::exception_ptr e) {
    std::lock_guard lock(mu_);
    error_ = e;
    cv_.notify_all();
  }
  std::exception_ptr error() {
    std::lock_guard lock(mu_);
    return error_;
  }
  std::unique_ptr<Item> next() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !queued_.empty() || error_; });
    if (queued_.empty()) std::rethrow_exception(error_);
    auto item = std::move(queued_.front());
    queued_.pop_front();
    return item;
  }
  void give_back(std::unique_ptr<Item> item) {
    std::lock_guard lock(mu_);
    free_.push_back(std::move(item));
    cv_.notify_all();
  }

 private:
  std::size_t floats_, capacity_, made_ = 0;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<std::unique_ptr<Item>> queued_;
  std::vector<std::unique_ptr<Item>> free_;
  std::exception_ptr error_;
};

constexpr std::size_t kQueueBytes = std::size_t(256) << 20;  // θ copies waiting for evaluation
constexpr int kEvaluateNice = 10;  // weight 110 against a worker's 1024

// Lowers the calling thread's CPU priority (Linux: nice is per thread); says so if it cannot.
void lower_this_threads_priority(int nice) {
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  if (::setpriority(PRIO_PROCESS, tid, nice) != 0)
    std::fprintf(stderr, "[evaluator] could not lower the evaluating thread's priority (nice %d): evaluating at the "
                         "workers' priority\n", nice);
}

}  // namespace

namespace {

// Evaluates one θ taken by the source and writes its metrics line; returns the test accuracy
// (classification) or loss.
double evaluate(RoleContext& ctx, const TakenQueue::Item& item) {
  Replica& replica = ctx.replica();
  const DataSplit& data = ctx.data();
  const ParamSource::Info& info = item.info;
  const bool classification = data.test.classes > 0;
  std::copy(item.theta.begin(), item.theta.end(), replica.host_params());
  replica.upload_params();
  const EvalCounts e = replica.evaluate(data.test);
  const double loss = e.loss_sum / double(e.samples);
  const double acc = classification ? double(e.correct) / double(e.samples) : -1.0;
  const double epoch = double(info.samples) / double(data.train.n);
  nlohmann::ordered_json j{{"kind", "eval"}, {"step", info.step}, {"epoch", epoch}, {"test_loss", loss}};
  if (classification) j["test_acc"] = acc;
  j["eval_ms"] = (ctx.metrics().now() - item.taken_s) * 1e3;
  if (info.min_version >= 0) j["versions"] = {info.min_version, info.max_version};
  if (info.dropped) j["dropped_messages"] = info.dropped;
  if (info.final) j["final"] = true;
  ctx.metrics().write(j, item.taken_s);
  ctx.metrics().flush();
  if (ctx.opt.progress)
    std::fprintf(stderr, "[evaluator] %.1fs  epoch %.2f  step %ld  test loss %.4f%s%s\n", item.taken_s, epoch, info.step, loss,
                 classification ? ("  test accuracy " + std::to_string(100 * acc).substr(0, 5) + "%").c_str() : "",
                 info.final ? "  (final)" : "");
  return classification ? acc : loss;
}

// A taker thread takes each θ when due into the queue; this thread evaluates them in order, at
// a lower priority.
double evaluate_queued(RoleContext& ctx, ParamSource& source) {
  const std::size_t P = ctx.replica().model().num_params();
  TakenQueue queue(P, std::max<std::size_t>(2, kQueueBytes / (P * sizeof(float))));
  // A stop request (the evaluating thread failed) ends it at its next θ.
  std::jthread taker([&](std::stop_token stop) {
    try {
      for (bool final = false; !final && !stop.stop_requested();) {
        auto item = queue.take_buffer(stop);
        if (!item) return;
        item->info = source.next(item->theta.data());
        item->taken_s = ctx.metrics().now();
        final = item->info.final;
        queue.put(std::move(item));
      }
      if (!stop.stop_requested()) source.finish();
    } catch (...) {
      queue.fail(std::current_exception());
    }
  });
  lower_this_threads_priority(kEvaluateNice);  // after the taker started: it keeps the process's priority
  double result = 0.0;
  for (bool final = false; !final;) {
    auto item = queue.next();
    result = evaluate(ctx, *item);
    final = item->info.final;
    queue.give_back(std::move(item));
  }
  taker.join();
  if (const std::exception_ptr e = queue.error()) std::rethrow_exception(e);  // e.g. the servers' Shutdown failed
  return result;
}

// The virtual cluster: evaluation takes no simulated time, so each θ is evaluated as it is taken.
double evaluate_inline(RoleContext& ctx, ParamSource& source) {
  TakenQueue::Item item;
  item.theta.resize(ctx.replica().model().num_params());
  double result = 0.0;
  for (bool final = false; !final;) {
    item.info = source.next(item.theta.data());
    item.taken_s = ctx.metrics().now();
    result = evaluate(ctx, item);
    final = item.info.final;
  }
  source.finish();
  return result;
}

}  // namespace

double run_evaluator(const ExperimentConfig& cfg, const RoleOptions& opt) {
  RoleContext ctx(cfg, opt, RoleKind::evaluator);
  std::unique_ptr<ParamSource> source;
  if (!opt.snapshots.empty()) source = std::make_unique<SnapshotSource>(ctx, ctx.replica().model().num_params());
  else source = std::make_unique<ServerSource>(ctx);
  return opt.evaluate_inline ? evaluate_inline(ctx, *source) : evaluate_queued(ctx, *source);
}

}  // namespace pslab
