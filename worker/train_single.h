// Single-process training: the plain mainline (load data, build model, compute, step, log)
// that the distributed modes extend.
#pragma once

#include <string>

#include "run/config.h"

namespace pslab {

struct SingleRunOptions {
  std::string out_dir = ".";  // metrics go to <out_dir>/metrics/worker0.jsonl
  double run_start = 0.0;     // Unix seconds; <= 0: now
  bool progress = true;       // a progress line on stderr every epoch and every few seconds
};

// Trains on one process and returns the final test accuracy (classification) or test loss
// (regression).
double run_single(const ExperimentConfig& cfg, const SingleRunOptions& opt);

}  // namespace pslab
