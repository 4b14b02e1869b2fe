// The virtual cluster (cluster.launcher = "virtual"): every worker, server and the evaluator
// of a run in one process, in simulated time. What is real: the model, the data, every
// gradient, and the servers' ShardStates with pslab's own consistency rules, codecs and
// optimizer. What is modelled ([virtual] in the config, measured by `launch.py calibrate`):
//   a worker's step      compute_ms at train.batch (allreduce: allreduce_compute_ms; scaled by
//                        its samples) x the straggler's slowdown, plus its delay_ms /
//                        exp_delay_ms, drawn as a real run does
//   a message            latency_us + bytes / bandwidth_gbps, per link (each worker-server pair
//                        its own link: no contention on the wire)
//   a server's update    shard bytes / apply_gbps; one at a time per server (a FIFO queue)
//   an all-reduce        allreduce_ms, or a ring: 2 (W - 1) x (latency + P x 4 / W / bandwidth)
//   start-up             startup_ms before the first step (connections, first-touch costs)
// Ignored: contention for cores and memory bandwidth between processes of one host, the
// evaluator's cost, the kernel's and ZeroMQ's queues, congestion. Events run in simulated-time
// order; ties keep the order they were scheduled in, so a run is deterministic.
//
// It writes the metrics a real run writes, with simulated times (metrics/worker<r>.jsonl,
// server<k>.jsonl, evaluator.jsonl), so the launcher's summary, comparison and plots read them
// as they read a real run's.
//
// Replay (virtual.replay = RUN_DIR of a real parameter-server run): instead of the cost model,
// each server re-executes the order its real counterpart recorded (ps/order_trace.h): the same
// pushes applied in the same order, the same versions served to the same pulls. On the CPU
// backend the final θ is then the real run's bit for bit (each shard's params_checksum);
// times in the replay's metrics are a count of operations, not a prediction.
//
// Threading: one thread.
#pragma once

#include <string>

#include "run/config.h"

namespace pslab {

struct VirtualOptions {
  std::string out_dir = ".";  // metrics go to <out_dir>/metrics/
  bool progress = true;       // progress lines on stderr
  int procs_on_host = 1;      // BLAS threads as for a process among this many (a replay: the real run's)
};

// Runs the config's workers and servers (or all-reduce ranks) and the evaluator in simulated
// time; returns the final test accuracy (classification) or loss.
double run_virtual_cluster(const ExperimentConfig& cfg, const VirtualOptions& opt);

}  // namespace pslab
