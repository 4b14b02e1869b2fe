#include "train_log.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace pslab {

TrainLog::TrainLog(MetricsWriter& metrics, Progress& progress, int rank, int log_every, long total_steps)
    : metrics_(metrics), progress_(progress), rank_(rank), log_every_(log_every), total_steps_(total_steps),
      window_start_(metrics.now()) {}

void TrainLog::add(long step, double epoch, const StepRecord& r, bool force) {
  if (!started_) {  // (wait_s is part of comm_s)
    started_ = true;
    const double took = r.compute_s + r.comm_s + r.delay_s;
    window_start_ = std::max(0.0, metrics_.now() - took);  // (the first window: from the first step, not the start-up)
    metrics_.write({{"kind", "start"}, {"worker", rank_}, {"step", step}}, window_start_);
  }
  if (!std::isfinite(r.loss) && !diverged_) {
    diverged_ = true;
    std::fprintf(stderr,
                 "[worker %d] warning: training diverged: the loss is %s at step %ld (epoch %.2f)%s; try a lower "
                 "optimizer.lr or a longer schedule.warmup_epochs\n",
                 rank_, std::isnan(r.loss) ? "NaN" : r.loss > 0 ? "+inf" : "-inf", step + 1, epoch, r.lr >= 0 ? (" with lr " + std::to_string(r.lr)).c_str() : "");
    metrics_.write({{"kind", "diverged"}, {"worker", rank_}, {"step", step + 1}, {"epoch", epoch}});
  }
  sum_.loss += r.loss * r.samples;  // (a step's loss is its batch's mean: an empty or partial batch weighs as much as it holds)
  sum_.samples += r.samples;
  if (r.lr >= 0) lr_ = r.lr;
  sum_.compute_s += r.compute_s;
  sum_.comm_s += r.comm_s;
  sum_.wait_s += r.wait_s;
  sum_.delay_s += r.delay_s;
  allreduce_bytes_ += r.allreduce_bytes;
  ++n_;
  if (n_ < log_every_ && !force) return;
  const double t = metrics_.now();
  const double rate = sum_.samples / std::max(1e-9, t - window_start_);
  const double loss = sum_.samples > 0 ? sum_.loss / sum_.samples : std::nan("");  // (none in the window: null)
  nlohmann::ordered_json j{{"kind", "train"}, {"worker", rank_}, {"step", step + 1}, {"epoch", epoch},
                           {"loss", loss}, {"samples_per_s", rate},
                           {"compute_ms", 1e3 * sum_.compute_s / n_}, {"comm_ms", 1e3 * sum_.comm_s / n_},
                           {"wait_ms", 1e3 * sum_.wait_s / n_}, {"delay_ms", 1e3 * sum_.delay_s / n_}};
  if (r.version >= 0) j["version"] = r.version;
  if (lr_ >= 0) j["lr"] = lr_;  // (the last applied: with train.accumulate, steps between updates apply none)
  if (allreduce_bytes_ > 0) j["allreduce_bytes"] = allreduce_bytes_;
  metrics_.write(j);
  progress_.update({step + 1, total_steps_, epoch, loss, last_test_acc, rate, t});
  sum_ = StepRecord{};
  n_ = 0;
  window_start_ = t;
}

void write_eval(MetricsWriter& metrics, const EvalLine& e, bool progress) {
  const bool classification = e.test_acc >= 0;
  nlohmann::ordered_json j{{"kind", "eval"}, {"step", e.step}, {"epoch", e.epoch}, {"test_loss", e.test_loss}};
  if (classification) j["test_acc"] = e.test_acc;
  j["eval_ms"] = (metrics.now() - e.taken_s) * 1e3;
  if (e.min_version >= 0) j["versions"] = {e.min_version, e.max_version};
  if (e.dropped) j["dropped_messages"] = e.dropped;
  if (e.final) j["final"] = true;
  metrics.write(j, e.taken_s);
  metrics.flush();
  if (progress)
    std::fprintf(stderr, "[evaluator] %.1fs  epoch %.2f  step %ld  test loss %.4f%s%s\n", e.taken_s, e.epoch, e.step,
                 e.test_loss,
                 classification ? ("  test accuracy " + std::to_string(100 * e.test_acc).substr(0, 5) + "%").c_str() : "",
                 e.final ? "  (final)" : "");
}

}  // namespace pslab
