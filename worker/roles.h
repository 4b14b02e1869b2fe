// The distributed roles of the worker binary, and what the launcher tells each of them.
#pragma once

#include <string>
#include <vector>

#include <zmq.hpp>

#include "config.h"

namespace pslab {

struct RoleOptions {
  int rank = 0;                      // worker rank in [0, cluster.workers)
  std::vector<std::string> servers;  // PS modes: server endpoints, in shard order
  std::string coordinator;           // allreduce: rank 0's rendezvous endpoint
  std::string out_dir = ".";         // metrics go to <out_dir>/metrics/<role><rank>.jsonl
  double run_start = 0.0;            // Unix seconds; metric times count from it
  int procs_on_host = 1;             // processes sharing this host's cores (sets BLAS threads)
  bool progress = true;              // progress lines on stderr
  zmq::context_t* ctx = nullptr;     // tests: a shared context for inproc:// endpoints
};

// One worker of a PS mode (bsp, ssp:s, asp): pull -> compute -> push+pull, every step.
void run_ps_worker(const ExperimentConfig& cfg, const RoleOptions& opt);

// The evaluator of a PS run: pulls θ every eval.interval_s, measures test loss and accuracy
// on the whole test set, and after training ends evaluates once more and shuts the servers
// down. Returns the final test accuracy (classification) or loss (regression).
double run_evaluator(const ExperimentConfig& cfg, const RoleOptions& opt);

}  // namespace pslab
