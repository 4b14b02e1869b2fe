// The virtual cluster (cluster.launcher = "virtual"): every server, worker and the evaluator of
// a run in one process, in simulated time. It runs pslab's own runtime — the real Server with
// its ShardState, consistency rule, codecs and statistics, the real worker loops with PsClient
// and the all-reduce rank, the real evaluator — as threads of a discrete-event simulation
// (scheduler.h), over a simulated transport (sim_transport.h) and clock (sim_clock.h). So a new
// mode, codec, optimizer, model or metric is simulated with no change here.
//
// What is real: the model, the data, every gradient and update, every message's bytes. What is
// modelled ([virtual] in the config, measured by `launch.py calibrate`; sim_clock.h):
//   a worker's step      compute_ms at train.batch (allreduce: allreduce_compute_ms; scaled by
//                        its samples); the straggler's slowdown and delays as a real run draws them
//   a message            latency_us + bytes / bandwidth_gbps on its link (each pair of peers
//                        one link each way; no contention between links)
//   a server's update    payload bytes / apply_gbps; one message at a time per server (a FIFO queue)
//   an all-reduce        allreduce_ms, or a ring: 2 (W - 1) x (latency + P x 4 / W / bandwidth)
//   start-up             startup_ms before the workers start (processes, data, connections)
// Ignored: contention for cores and memory bandwidth between processes of one host, the
// evaluator's cost (it evaluates each θ as it takes it), the kernel's queues, congestion. A run
// is deterministic.
//
// It writes the metrics a real run writes, with simulated times (metrics/worker<r>.jsonl,
// server<k>.jsonl, evaluator.jsonl): the real roles write them.
//
// Replay (virtual.replay = RUN_DIR of a real parameter-server run): each server takes the
// pushes and pulls of the workers in the order its real counterpart recorded (ps/order_trace.h,
// replay.h), so that the same versions are served to the same pulls and the same pushes are
// applied in the same order. On the CPU backend the final θ is then the real run's bit for bit
// (each shard's params_checksum).
#pragma once

#include <string>

#include "run/config.h"

namespace pslab {

struct VirtualOptions {
  std::string out_dir = ".";  // metrics go to <out_dir>/metrics/
  bool progress = true;       // progress lines on stderr
  int procs_on_host = 1;      // BLAS threads as for a process among this many (a replay: the real run's)
};

// Runs the config's servers and workers (or all-reduce ranks) and the evaluator in simulated
// time; returns the final test accuracy (classification) or loss.
double run_virtual_cluster(const ExperimentConfig& cfg, const VirtualOptions& opt);

}  // namespace pslab
