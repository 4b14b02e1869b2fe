// The roles of the worker binary, one loop each in worker/roles/: single-process training (the
// mainline), a PS worker, an all-reduce rank, the evaluator; and what the launcher tells each of
// the distributed ones (RoleOptions).
#pragma once

#include <string>
#include <vector>

#include "comm/transport/transport.h"
#include "core/data.h"
#include "run/config.h"

namespace pslab {

// ---- single-process training (roles/single.cpp): the plain mainline (load data, build the
// model, compute, step, log) that the distributed modes extend ----

struct SingleRunOptions {
  std::string out_dir = ".";  // metrics go to <out_dir>/metrics/worker0.jsonl
  double run_start = 0.0;     // Unix seconds; <= 0: now
  bool progress = true;       // a progress line on stderr every epoch and every few seconds
};

// Trains on one process and returns the final test accuracy (classification) or test loss
// (regression).
double run_single(const ExperimentConfig& cfg, const SingleRunOptions& opt);

// ---- the distributed roles ----

struct RoleOptions {
  int rank = 0;                      // worker rank in [0, cluster.workers)
  std::vector<std::string> servers;  // PS modes: server addresses, in shard order
  std::vector<std::string> backups;  // cluster.replicas = 2: their backups' addresses, in shard order
  std::string coordinator;           // allreduce: rank 0's rendezvous address
  std::string snapshots;             // allreduce: the evaluator's address for θ snapshots
  std::string host;                  // allreduce: address this rank's Gloo pairs listen on
                                     // ("" = cluster.bind)
  std::string out_dir = ".";         // metrics go to <out_dir>/metrics/<role><rank>.jsonl
  double run_start = 0.0;            // Unix seconds; metric times count from it
  int procs_on_host = 1;             // processes sharing this host's cores (sets BLAS threads)
  int gpu_slot = 0;                  // device = "cuda": this process's slot among those on its
                                     // host that use a GPU; it runs on GPU (slot mod GPUs)
  bool progress = true;              // progress lines on stderr
  bool resume = false;               // go on where the run stopped (PS: from the clock the servers'
                                     // checkpoints hold for this worker; allreduce: from
                                     // `checkpoint`); metrics are appended
  std::string checkpoint;            // allreduce: rank 0 writes θ and the optimizer's state here
                                     // every checkpoint.every_s and at the end; --resume reads it
  std::string auth_key;              // the run's key file (comm/run_key.h): peers authenticate
                                     // ("" = none; required by cluster.auth = "curve")
  comm::Transport* transport = nullptr;  // tests, the virtual cluster: one transport shared by the
                                         // threads of a run; null: the role makes one from cluster.transport
  const DataSplit* data = nullptr;       // the virtual cluster: the data set every role of the run
                                         // reads; null: the role loads its own
  bool evaluate_inline = false;          // the evaluator evaluates each θ on the thread that takes
                                         // it (the virtual cluster: evaluation takes no simulated time)
};

// One worker of a PS mode (bsp, ssp:s, asp, ...): pull -> compute -> push+pull, every step
// (roles/ps_worker.cpp; local:H and easgd: roles/local_worker.cpp).
void run_ps_worker(const ExperimentConfig& cfg, const RoleOptions& opt);

// One rank of the all-reduce mode (roles/allreduce_rank.cpp): forward, backward, all-reduce of the flat gradient,
// local optimizer step, every step; no servers. Returns the final θ (host copy); its
// checksum is also written to the rank's metrics ({"kind": "final", "params_checksum"}), so
// that replicas can be compared across processes.
std::vector<float> run_allreduce_worker(const ExperimentConfig& cfg, const RoleOptions& opt);

// The evaluator (roles/evaluator.cpp): takes θ every eval.interval_s (PS modes: from the servers; all-reduce:
// rank 0's snapshots, when opt.snapshots is set), measures test loss and accuracy on the
// whole test set, and after training ends evaluates once more (and shuts the servers down).
// Returns the final test accuracy (classification) or loss (regression).
double run_evaluator(const ExperimentConfig& cfg, const RoleOptions& opt);

}  // namespace pslab
