#include "train_single.h"

#include <chrono>
#include <cstdio>

#include "run/metrics.h"
#include "core/optimizer.h"
#include "progress.h"
#include "core/replica.h"
#include "core/sampler.h"
#include "run/setup.h"
#include "train_log.h"

namespace pslab {

double run_single(const ExperimentConfig& cfg, const SingleRunOptions& opt) {
  auto be = make_backend(cfg.train.device == "cuda" ? Device::cuda : Device::cpu, blas_threads(cfg, 1));
  const DataSplit data = load_data(cfg);
  const ModelSpec spec = model_spec(cfg);
  Replica replica(*be, spec, data.train, std::max(cfg.train.batch, cfg.eval.batch));
  Model& model = replica.model();
  model.init(cfg.seed);
  Optimizer optimizer(*be, cfg.optimizer, model.num_params());

  ShardSampler sampler(std::size_t(data.train.n), 1, 0, cfg.seed);
  const int batch = cfg.train.batch;
  const long spe = sampler.steps_per_epoch(batch);
  const long steps = total_steps(cfg, spe);
  const ScheduleConfig schedule = schedule_for_run(cfg, spe);

  MetricsWriter metrics(opt.out_dir + "/metrics/worker0.jsonl", opt.run_start);
  Progress progress("train", opt.progress);
  TrainLog log(metrics, progress, 0, cfg.train.log_every, steps);
  std::fprintf(stderr, "[train] %s on %s; %s; %ld steps of batch %d (%ld per epoch)\n",
               model.describe().c_str(), be->describe().c_str(), cfg.optimizer.kind.c_str(),
               steps, batch, spe);

  long samples = 0;
  double last_metric = 0.0;
  for (long step = 0; step < steps; ++step) {
    const long epoch = step / spe, s = step % spe;
    sampler.set_epoch(epoch);
    const auto idx = sampler.batch(s, batch);
    const auto t0 = std::chrono::steady_clock::now();
    StepRecord rec;
    rec.loss = replica.compute_gradient(idx);
    rec.lr = learning_rate(schedule, cfg.optimizer.lr, batch, double(samples) / data.train.n);
    optimizer.step(model.params(), model.grads(), rec.lr);
    be->synchronize();
    rec.compute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rec.samples = int(idx.size());
    samples += rec.samples;

    const bool epoch_end = s == spe - 1 || step == steps - 1;
    log.add(step, double(samples) / data.train.n, rec, epoch_end);
    if (epoch_end) {
      const EvalCounts e = replica.evaluate(data.test);
      const double loss = e.loss_sum / double(e.samples);
      const double acc = data.test.classes > 0 ? double(e.correct) / double(e.samples) : -1.0;
      last_metric = acc >= 0 ? acc : loss;
      log.last_test_acc = acc;
      nlohmann::ordered_json j{{"kind", "eval"}, {"step", step + 1},
                               {"epoch", double(samples) / data.train.n}, {"test_loss", loss}};
      if (acc >= 0) j["test_acc"] = acc;
      metrics.write(j);
      metrics.flush();
      progress.epoch_done(double(samples) / data.train.n, loss, acc);
      log.restart_window();
    }
  }
  return last_metric;
}

}  // namespace pslab
