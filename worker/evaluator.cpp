// The evaluator: measures test loss and accuracy of the current θ every eval.interval_s
// without slowing any training worker. θ comes from the parameter servers (PS modes: an
// ungated pull of every shard) or from rank 0's snapshots (all-reduce mode).
#include <chrono>
#include <cstdio>
#include <thread>

#include "run/metrics.h"
#include "comm/net.h"
#include "ps/client.h"
#include "core/replica.h"
#include "roles.h"
#include "run/setup.h"
#include "snapshots.h"

namespace pslab {

namespace {

// Where θ comes from. next() fills theta and says what it is.
struct ParamSource {
  virtual ~ParamSource() = default;
  struct Info {
    long step = 0, samples = 0, min_version = 0, max_version = 0;
    bool final = false;
  };
  virtual Info next(float* theta) = 0;
  virtual void finish() {}
};

// PS modes: every interval, an ungated pull of every shard; after the last, Shutdown.
class ServerSource final : public ParamSource {
 public:
  ServerSource(zmq::context_t& ctx, const ExperimentConfig& cfg, const RoleOptions& opt, std::size_t P)
      : client_(ctx, opt.servers, wire::Role::evaluator, wire::kEvaluator, P, net::fnv1a(to_toml(cfg)),
                cfg.cluster.timeout_s),
        interval_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(cfg.eval.interval_s))) {
    client_.connect();
    next_ = std::chrono::steady_clock::now();
  }
  Info next(float* theta) override {
    std::this_thread::sleep_until(next_);
    // Evaluation may take longer than the interval: never queue up missed ticks.
    next_ = std::max(next_ + interval_, std::chrono::steady_clock::now());
    const PullResult r = client_.pull(0, theta);
    return Info{r.min_version, r.samples_applied, r.min_version, r.max_version, r.training_done};
  }
  void finish() override { client_.shutdown(); }

 private:
  PsClient client_;
  std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point next_;
};

// All-reduce mode: rank 0 pushes snapshots every interval.
class SnapshotSource final : public ParamSource {
 public:
  SnapshotSource(zmq::context_t& ctx, const ExperimentConfig& cfg, const std::string& endpoint, std::size_t P)
      : rx_(ctx, endpoint, cfg.cluster.timeout_s), P_(P) {}
  Info next(float* theta) override {
    const Snapshot s = rx_.next(theta, P_);
    return Info{s.step, s.samples, s.step, s.step, s.final};
  }

 private:
  SnapshotReceiver rx_;
  std::size_t P_;
};

}  // namespace

double run_evaluator(const ExperimentConfig& cfg, const RoleOptions& opt) {
  auto be = make_role_backend(cfg, opt);
  const DataSplit data = load_data(cfg);
  Replica replica(*be, model_spec(cfg), data.train, cfg.eval.batch);
  Model& model = replica.model();
  const std::size_t P = model.num_params();
  std::vector<float> theta(P);

  std::unique_ptr<zmq::context_t> own_ctx;
  zmq::context_t& ctx = opt.ctx ? *opt.ctx : *(own_ctx = std::make_unique<zmq::context_t>(1));
  std::unique_ptr<ParamSource> source;
  if (!opt.snapshots.empty()) source = std::make_unique<SnapshotSource>(ctx, cfg, opt.snapshots, P);
  else source = std::make_unique<ServerSource>(ctx, cfg, opt, P);

  MetricsWriter metrics(opt.out_dir + "/metrics/evaluator.jsonl", opt.run_start);
  const double train_n = double(data.train.n);
  const bool classification = data.test.classes > 0;
  double result = 0.0;
  while (true) {
    const ParamSource::Info info = source->next(theta.data());
    model.load_params(theta.data());
    const EvalCounts e = replica.evaluate(data.test);
    const double loss = e.loss_sum / double(e.samples);
    const double acc = classification ? double(e.correct) / double(e.samples) : -1.0;
    const double epoch = double(info.samples) / train_n;
    nlohmann::ordered_json j{{"kind", "eval"}, {"step", info.step}, {"epoch", epoch}, {"test_loss", loss}};
    if (classification) j["test_acc"] = acc;
    if (info.max_version != info.min_version) j["versions"] = {info.min_version, info.max_version};
    if (info.final) j["final"] = true;
    metrics.write(j);
    metrics.flush();
    result = classification ? acc : loss;
    if (opt.progress)
      std::fprintf(stderr, "[evaluator] %.1fs  epoch %.2f  step %ld  test loss %.4f%s%s\n", metrics.now(), epoch,
                   info.step, loss,
                   classification ? ("  test accuracy " + std::to_string(100 * acc).substr(0, 5) + "%").c_str() : "",
                   info.final ? "  (final)" : "");
    if (info.final) break;
  }
  source->finish();
  return result;
}

}  // namespace pslab
