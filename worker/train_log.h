// Per-step training metrics of a worker, averaged over windows of `log_every` steps and
// written as one JSON line per window (kind "train"), with a progress line on stderr now and
// then. The same fields in every mode, so that plots compare like with like:
//   step, epoch, loss, samples_per_s, compute_ms, comm_ms, wait_ms, delay_ms, version
// (allreduce mode: allreduce_bytes, the running total this rank all-reduced)
// (times are means per step over the window, in milliseconds; wait_ms is the part of
// comm_ms that a server held the request for consistency; delay_ms is injected straggling).
// (loss: the mean over the window's samples, null for a window without any; lr: the last a step
// applied.) The first step this process takes is marked by {"kind": "start", "worker", "step",
// "t"}, t when that step began (its end less its compute, comm and delay; the first window's
// samples/s counts from there, not from the start-up): plots put the runs of
// several seeds on one time axis from there, whatever their start-up took.
// The first step whose loss is not finite is reported once: a warning on stderr and a
// metrics line {"kind": "diverged", "worker", "step", "epoch"}.
#pragma once

#include <optional>

#include "run/metrics.h"
#include "progress.h"

namespace pslab {

struct StepRecord {
  double loss = 0.0;
  int samples = 0;
  double compute_s = 0.0, comm_s = 0.0, wait_s = 0.0, delay_s = 0.0;
  long version = -1;  // parameter version the step computed on (PS modes), -1 if none
  double lr = -1.0;   // learning rate applied locally (single / allreduce), -1 if none
  long allreduce_bytes = 0;  // bytes this rank all-reduced this step (allreduce mode)
};

// One evaluation of θ (worker/roles/evaluator.cpp says what its fields mean).
struct EvalLine {
  long step = 0;          // steps every worker has completed
  double epoch = 0.0;     // samples applied to θ / training-set size
  double test_loss = 0.0;
  double test_acc = -1.0; // classification; < 0: none (regression)
  double taken_s = 0.0;   // when θ was taken (s since run start)
  long min_version = -1, max_version = -1;  // PS modes: the shards' versions evaluated
  long dropped = 0;       // all-reduce mode: bad snapshot messages dropped so far
  bool final = false;     // θ after training
};
// Writes its metrics line ({"kind": "eval"}, flushed) and, with progress, a line on stderr.
void write_eval(MetricsWriter& metrics, const EvalLine& e, bool progress);

class TrainLog {
 public:
  TrainLog(MetricsWriter& metrics, Progress& progress, int rank, int log_every, long total_steps);
  // Adds step `step` (0-based); writes a line when the window is full or `force` is set.
  // `epoch` is the fractional number of passes over the training set after this step.
  void add(long step, double epoch, const StepRecord& r, bool force = false);
  // Starts the next window now (after an evaluation, which is not training time).
  void restart_window() { window_start_ = metrics_.now(); }
  double last_test_acc = -1.0;  // shown in progress lines

 private:
  MetricsWriter& metrics_;
  Progress& progress_;
  int rank_, log_every_;
  long total_steps_;
  StepRecord sum_;
  int n_ = 0;
  long allreduce_bytes_ = 0;  // since the start
  bool diverged_ = false, started_ = false;
  double window_start_;
  double lr_ = -1.0;  // the last learning rate a step applied (-1: none yet, or not this mode's)
};

}  // namespace pslab
