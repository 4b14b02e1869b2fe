// The evaluator: measures test loss and accuracy of θ every eval.interval_s (or every
// eval.every_epochs) without slowing any training worker. θ comes from the parameter servers
// (PS modes: an ungated pull of every shard) or from rank 0's snapshots (all-reduce mode).
//
// Two threads: a taker, at the process's priority, takes each θ when it is due (a pull, or a
// snapshot received) into a queue of copies; the main thread evaluates them in order at a
// lower CPU priority (nice +kEvaluateNice), so that on a host whose cores the workers keep
// busy evaluation waits for idle moments (and the end of training) instead of taking their
// CPU, and no tick is lost to a slow evaluation while the queue has room (taken_queue.h).
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
#include <stop_token>
#include <cstdio>
#include <exception>
#include <thread>
#include <vector>

#include "ps/client.h"
#include "role_context.h"
#include "run/setup.h"
#include "eval_schedule.h"
#include "taken_queue.h"
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
  // (stop: the evaluating thread failed; a wait for the next θ ends)
  virtual Info next(float* theta, std::stop_token stop = {}) = 0;
  virtual void finish() {}
};

// PS modes: θ from the servers when it is due (ServerTicks); after the last θ, Shutdown.
class ServerSource final : public ParamSource {
 public:
  explicit ServerSource(RoleContext& ctx)
      : client_(ctx.transport(), ctx.opt.servers, client_options(ctx.cfg, wire::Role::evaluator, wire::kEvaluator, ctx.opt.backups)),
        ticks_(ctx.clock(), client_, ctx.cfg.eval.interval_s, ctx.cfg.eval.every_epochs, double(ctx.data().train.n)) {
    client_.connect();
  }
  Info next(float* theta, std::stop_token stop) override {
    const PullResult r = ticks_.next(theta, stop);
    return Info{r.min_clock, r.samples_applied, r.min_version, r.max_version, r.training_done};
  }
  void finish() override { client_.shutdown(); }

 private:
  PsClient client_;
  ServerTicks ticks_;
};

// All-reduce mode: rank 0 sends snapshots every interval.
class SnapshotSource final : public ParamSource {
 public:
  SnapshotSource(RoleContext& ctx, std::size_t P)
      : rx_(ctx.transport(), ctx.opt.snapshots, ctx.cfg.cluster.timeout_s, /*each=*/ctx.cfg.eval.every_epochs > 0), P_(P) {}
  Info next(float* theta, std::stop_token) override {  // (its waits end at their timeouts)
    const Snapshot s = rx_.next(theta, P_);
    return Info{s.step, s.samples, -1, -1, s.final, s.dropped};
  }

 private:
  SnapshotReceiver rx_;
  std::size_t P_;
};

using Taken = TakenQueue<ParamSource::Info>;

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
double evaluate(RoleContext& ctx, const Taken::Item& item) {
  Replica& replica = ctx.replica();
  const DataSplit& data = ctx.data();
  const ParamSource::Info& info = item.info;
  const bool classification = data.test.classes > 0;
  std::copy(item.theta.begin(), item.theta.end(), replica.host_params());
  replica.upload_params();
  const EvalCounts e = replica.evaluate(data.test);
  EvalLine line;
  line.step = info.step, line.epoch = double(info.samples) / double(data.train.n);
  line.test_loss = e.loss_sum / double(e.samples);
  line.test_acc = classification ? double(e.correct) / double(e.samples) : -1.0;
  line.taken_s = item.taken_s, line.min_version = info.min_version, line.max_version = info.max_version;
  line.dropped = info.dropped, line.final = info.final;
  write_eval(ctx.metrics(), line, ctx.opt.progress);
  return classification ? line.test_acc : line.test_loss;
}

// A taker thread takes each θ when due into the queue; this thread evaluates them in order, at
// a lower priority.
double evaluate_queued(RoleContext& ctx, ParamSource& source) {
  const std::size_t P = ctx.replica().model().num_params();
  Taken queue(P, taken_queue_capacity(P));
  // A stop request (the evaluating thread failed) ends it at its next θ.
  std::jthread taker([&](std::stop_token stop) {
    try {
      for (bool final = false; !final && !stop.stop_requested();) {
        auto item = queue.take_buffer(stop);
        if (!item) return;
        item->info = source.next(item->theta.data(), stop);
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
  Taken::Item item;
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
