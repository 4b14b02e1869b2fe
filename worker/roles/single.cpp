// Single-process training, the mainline: load data, build the model, then every step compute
// the gradient and step the optimizer (with train.accumulate = N, every N steps, on the mean of
// their gradients); evaluate at every epoch's end.
// A GPU step is not waited for: reading its loss waits for its forward only, so the host queues
// the next step while the GPU finishes this one's backward and update (the host is at most one
// step ahead). A step's compute time is therefore the host's, which over a log window is the
// GPU's; an epoch's last step is waited for, so that its evaluation is timed alone.
#include "roles.h"

#include "core/optimizer.h"
#include "grad_accumulator.h"
#include "role_context.h"
#include "run/setup.h"

namespace pslab {

double run_single(const ExperimentConfig& cfg, const SingleRunOptions& single) {
  RoleOptions opt;
  opt.out_dir = single.out_dir;
  opt.run_start = single.run_start;
  opt.progress = single.progress;
  RoleContext ctx(cfg, opt, RoleKind::single);
  Replica& replica = ctx.replica();
  Model& model = replica.model();
  model.init(cfg.seed);
  Optimizer optimizer(ctx.backend(), cfg.optimizer, model.num_params(), layer_sizes(model.spec(), 0, model.num_params()));
  const long spe = ctx.steps_per_epoch(), steps = ctx.total_steps();
  const ScheduleConfig schedule = schedule_for_run(cfg, spe);
  const DataSplit& data = ctx.data();
  ctx.announce(cfg.optimizer.kind);

  GradAccumulator acc(ctx.backend(), cfg.train.accumulate, model.num_params());
  long samples = 0;
  double last_metric = 0.0;
  for (long step = 0; step < steps; ++step) {
    const auto idx = ctx.batch(step);
    const auto t0 = ctx.clock().now();
    StepRecord rec;
    if (cfg.train.accumulate == 1) {  // the update in the step (one graph with it, where steps are graphs)
      rec.lr = learning_rate(schedule, cfg.optimizer.lr, cfg.train.batch, double(samples) / data.train.n);
      rec.loss = replica.train_step(idx, optimizer, rec.lr);
    } else {
      rec.loss = replica.compute_gradient(idx);
      if (acc.add(model.grads(), double(idx.size()), step == steps - 1)) {
        const double applied = double(samples) - (acc.weight() - double(idx.size()));  // (before this update's batches)
        rec.lr = learning_rate(schedule, cfg.optimizer.lr, cfg.train.batch * acc.batches(), applied / data.train.n);
        optimizer.step(model.params(), acc.mean(), rec.lr);
      }
    }
    // (Not waited for, but at an epoch's end, before the evaluation is timed: run_single's comment.)
    const bool epoch_end = (step + 1) % spe == 0 || step == steps - 1;
    if (epoch_end) ctx.backend().synchronize();
    rec.compute_s = ctx.clock().computed(t0, long(idx.size()));
    rec.samples = int(idx.size());
    samples += rec.samples;

    const double epoch = double(samples) / data.train.n;
    ctx.log().add(step, epoch, rec, epoch_end);
    if (epoch_end) {
      const double taken_s = ctx.metrics().now();  // the line's time: θ as it is now, as the evaluator stamps it
      const EvalCounts e = replica.evaluate(data.test);
      const double loss = e.loss_sum / double(e.samples);
      const double acc = data.test.classes > 0 ? double(e.correct) / double(e.samples) : -1.0;
      last_metric = acc >= 0 ? acc : loss;
      ctx.log().last_test_acc = acc;
      nlohmann::ordered_json j{{"kind", "eval"}, {"step", step + 1}, {"epoch", epoch}, {"test_loss", loss}};
      if (acc >= 0) j["test_acc"] = acc;
      j["eval_ms"] = (ctx.metrics().now() - taken_s) * 1e3;
      ctx.metrics().write(j, taken_s);
      ctx.metrics().flush();
      ctx.progress().epoch_done(epoch, loss, acc);
      ctx.log().restart_window();
    }
  }
  return last_metric;
}

}  // namespace pslab
