// The evaluator of a parameter-server run: measures test loss and accuracy of the current θ
// every eval.interval_s without slowing any training worker.
#include <chrono>
#include <cstdio>
#include <thread>

#include "metrics.h"
#include "net.h"
#include "ps_client.h"
#include "replica.h"
#include "roles.h"
#include "setup.h"

namespace pslab {

double run_evaluator(const ExperimentConfig& cfg, const RoleOptions& opt) {
  auto be = make_backend(cfg.train.device == "cuda" ? Device::cuda : Device::cpu, blas_threads(cfg, opt.procs_on_host));
  const DataSplit data = load_data(cfg);
  Replica replica(*be, model_spec(cfg), data.train, cfg.eval.batch);
  Model& model = replica.model();
  const std::size_t P = model.num_params();
  std::vector<float> theta(P);

  std::unique_ptr<zmq::context_t> own_ctx;
  zmq::context_t& ctx = opt.ctx ? *opt.ctx : *(own_ctx = std::make_unique<zmq::context_t>(1));
  PsClient client(ctx, opt.servers, wire::Role::evaluator, wire::kEvaluator, P, net::fnv1a(to_toml(cfg)),
                  cfg.cluster.timeout_s);
  client.connect();
  MetricsWriter metrics(opt.out_dir + "/metrics/evaluator.jsonl", opt.run_start);
  const double train_n = double(data.train.n);
  const auto interval = std::chrono::duration<double>(cfg.eval.interval_s);
  double result = 0.0;
  for (auto next = std::chrono::steady_clock::now();; next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(interval)) {
    std::this_thread::sleep_until(next);
    const PullResult r = client.pull(0, theta.data());
    model.load_params(theta.data());
    const EvalCounts e = replica.evaluate(data.test);
    const bool classification = data.test.classes > 0;
    const double loss = e.loss_sum / double(e.samples);
    const double acc = classification ? double(e.correct) / double(e.samples) : -1.0;
    nlohmann::ordered_json j{{"kind", "eval"}, {"step", r.min_version}, {"epoch", double(r.samples_applied) / train_n},
                             {"test_loss", loss}};
    if (classification) j["test_acc"] = acc;
    j["versions"] = {r.min_version, r.max_version};
    if (r.training_done) j["final"] = true;
    metrics.write(j);
    metrics.flush();
    result = classification ? acc : loss;
    if (opt.progress) {
      if (classification)
        std::fprintf(stderr, "[evaluator] %.1fs  epoch %.2f  version %ld  test loss %.4f  test accuracy %.2f%%%s\n",
                     metrics.now(), double(r.samples_applied) / train_n, r.min_version, loss, 100 * acc,
                     r.training_done ? "  (final)" : "");
      else
        std::fprintf(stderr, "[evaluator] %.1fs  epoch %.2f  test loss %.6g%s\n", metrics.now(),
                     double(r.samples_applied) / train_n, loss, r.training_done ? "  (final)" : "");
    }
    if (r.training_done) break;
    // Evaluation can take longer than the interval: never queue up missed ticks.
    next = std::max(next, std::chrono::steady_clock::now() - std::chrono::duration_cast<std::chrono::steady_clock::duration>(interval));
  }
  client.shutdown();
  return result;
}

}  // namespace pslab
