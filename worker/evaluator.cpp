// The evaluator: measures test loss and accuracy of the current θ every eval.interval_s
// without slowing any training worker. θ comes from the parameter servers (PS modes: an
// ungated pull of every shard) or from rank 0's snapshots (all-reduce mode).
//
// Its metrics lines ({"kind": "eval"}) name progress the same way in every mode:
//   t       when the evaluated θ was taken: the pull's answer came (PS modes) or the
//           snapshot was received (all-reduce), not when its evaluation ended, so that
//           "time to target" does not count the evaluator's own work
//   eval_ms how long the evaluation of that θ took (the evaluator's lag behind training)
//   step    steps every worker has completed (PS modes: the slowest worker's clock as the
//           servers know it; all-reduce: the ranks' common step)
//   epoch   samples applied to θ / training-set size (all workers together)
//   versions  PS modes: [oldest, newest] shard version evaluated (updates applied)
#include <chrono>
#include <cstdio>
#include <thread>

#include "ps/client.h"
#include "role_context.h"
#include "run/setup.h"
#include "eval_schedule.h"
#include "snapshots.h"

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

// PS modes: every interval, an ungated pull of every shard; after the last, Shutdown.
class ServerSource final : public ParamSource {
 public:
  explicit ServerSource(RoleContext& ctx)
      : client_(ctx.transport(), ctx.opt.servers, client_options(ctx.cfg, wire::Role::evaluator, wire::kEvaluator)),
        interval_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(ticks_on(ctx) ? kPoll : ctx.cfg.eval.interval_s))),
        ticks_(ctx.cfg.eval.every_epochs), train_n_(double(ctx.data().train.n)) {
    client_.connect();
    next_ = std::chrono::steady_clock::now();
  }
  Info next(float* theta) override {
    while (true) {
      std::this_thread::sleep_until(next_);
      // Evaluation may take longer than the interval: never queue up missed ticks.
      next_ = std::max(next_ + interval_, std::chrono::steady_clock::now());
      const PullResult r = client_.pull(0, theta);
      // eval.every_epochs: pulled every kPoll, evaluated when the samples applied reach a tick
      if (!ticks_.on() || r.training_done || ticks_.due(double(r.samples_applied) / train_n_))
        return Info{r.min_clock, r.samples_applied, r.min_version, r.max_version, r.training_done};
    }
  }
  void finish() override { client_.shutdown(); }

 private:
  static bool ticks_on(const RoleContext& ctx) { return ctx.cfg.eval.every_epochs > 0; }
  static constexpr double kPoll = 0.02;  // s between pulls with eval.every_epochs
  PsClient client_;
  std::chrono::steady_clock::duration interval_;
  EpochTicks ticks_;
  double train_n_;
  std::chrono::steady_clock::time_point next_;
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

}  // namespace

double run_evaluator(const ExperimentConfig& cfg, const RoleOptions& opt) {
  RoleContext ctx(cfg, opt, RoleKind::evaluator);
  Replica& replica = ctx.replica();
  const std::size_t P = replica.model().num_params();
  std::unique_ptr<ParamSource> source;
  if (!opt.snapshots.empty()) source = std::make_unique<SnapshotSource>(ctx, P);
  else source = std::make_unique<ServerSource>(ctx);

  const DataSplit& data = ctx.data();
  const double train_n = double(data.train.n);
  const bool classification = data.test.classes > 0;
  double result = 0.0;
  while (true) {
    const ParamSource::Info info = source->next(replica.host_params());
    const double taken_s = ctx.metrics().now();
    replica.upload_params();
    const EvalCounts e = replica.evaluate(data.test);
    const double loss = e.loss_sum / double(e.samples);
    const double acc = classification ? double(e.correct) / double(e.samples) : -1.0;
    const double epoch = double(info.samples) / train_n;
    nlohmann::ordered_json j{{"kind", "eval"}, {"step", info.step}, {"epoch", epoch}, {"test_loss", loss}};
    if (classification) j["test_acc"] = acc;
    j["eval_ms"] = (ctx.metrics().now() - taken_s) * 1e3;
    if (info.min_version >= 0) j["versions"] = {info.min_version, info.max_version};
    if (info.dropped) j["dropped_messages"] = info.dropped;
    if (info.final) j["final"] = true;
    ctx.metrics().write(j, taken_s);
    ctx.metrics().flush();
    result = classification ? acc : loss;
    if (opt.progress)
      std::fprintf(stderr, "[evaluator] %.1fs  epoch %.2f  step %ld  test loss %.4f%s%s\n", ctx.metrics().now(), epoch,
                   info.step, loss,
                   classification ? ("  test accuracy " + std::to_string(100 * acc).substr(0, 5) + "%").c_str() : "",
                   info.final ? "  (final)" : "");
    if (info.final) break;
  }
  source->finish();
  return result;
}

}  // namespace pslab
