// The run plan: what a config makes a run do, derived once, here, by the binary, so that the
// launcher and the plots never recompute it: the mode and whether it has servers, data sizes,
// steps per epoch and in all, the processes of the run. `pslab_worker config --plan FILE`
// writes it as JSON; the launcher keeps a copy in each run directory (plan.json).
#pragma once

#include <nlohmann/json.hpp>

#include "run/config.h"

namespace pslab {

//  {"name", "mode", "uses_servers", "workers", "servers" (0 without), "transport",
//   "addresses" (the transport's: "tcp"; "ipc" = Unix sockets, every process on one host; "auto" =
//   ipc when the launcher places every process on one host, tcp otherwise), "codec",
//   "launcher", "hosts", "bind", "device", "seed", "batch" (per worker),
//   "data": {"kind", "train_samples", "test_samples", "classification"},
//   "params", "steps_per_epoch", "total_steps", "epochs" (what the steps amount to),
//   "target_acc", "eval_interval_s", "timeout_s", "heartbeat_s",
//   "on_worker_loss" ("continue": a lost worker is dropped and the run goes on; "fail"),
//   "on_server_loss" ("restart": the launcher restarts a server that died from its checkpoint; "fail"),
//   "processes": [{"name": "server0", "role": "server", "rank": 0}, ...,
//                 {"name": "evaluator", "role": "evaluator", "rank": -1}]}
// Processes are in start order: servers, workers, the evaluator.
nlohmann::ordered_json run_plan(const ExperimentConfig& c);

}  // namespace pslab
