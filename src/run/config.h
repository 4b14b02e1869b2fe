// The experiment config: one TOML file, parsed once at the edge into a typed struct,
// validated with errors that name the file and the key, and written back with every default
// filled in so that a run directory holds exactly what ran.
//
// Every key is listed once, in visit_fields() (config.cpp), with its type, default and a
// one-line description; parsing, validation of unknown keys, writing back and the
// `pslab_worker config --keys` listing all walk that one list.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/optimizer.h"
#include "ps/modes/mode.h"

namespace pslab {

// A bad config. what() reads "<file>: <key>: <what was expected, what was found>".
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A key that is true, false or "auto" (the run decides; the key's description says how).
struct AutoBool {
  enum Value { off, on, automatic } value = automatic;
  bool is_auto() const { return value == automatic; }
  bool is_on() const { return value == on; }  // explicitly true
  bool operator==(const AutoBool&) const = default;
};

struct ModelConfig {
  std::string kind = "mlp";                   // "linear", "mlp", "cnn", "resnet"
  std::vector<int> hidden = {256, 128};       // mlp hidden widths
  std::vector<int> conv_channels = {16, 32};  // cnn channels (5x5, stride 2)
  int depth = 20;                             // resnet layers (6n + 2)
  int width = 16;                             // resnet channels of the first stage
  std::string init = "he";                    // "he" (He/Xavier-uniform) or "zeros"
  std::vector<int> sizes;                     // external: its parameter tensors' sizes, in θ's order
  std::string theta_file;                     // external: θ0, P float32 values ("": zeros)
};

struct DataConfig {
  std::string kind = "fashion-mnist";  // "fashion-mnist", "least-squares", "logistic"
  std::string path = "/usr/share/datasets/fashion-mnist";
  bool normalize = true;
  int train_samples = 0;  // 0 = all (fashion-mnist) ; synthetic: 0 = 8192
  int test_samples = 0;   // 0 = all (fashion-mnist) ; synthetic: 0 = 2048
  int dim = 32;           // synthetic: input features
  int outputs = 4;        // synthetic: regression outputs / classes
  std::string augment = "none";  // "none" or "crop-flip" (training images: random crop with padding, horizontal flip)
  int augment_pad = 4;           // crop-flip: zeros padded on each side before the crop (pixels)
};

struct TrainConfig {
  int batch = 64;        // samples per worker per step
  int accumulate = 1;    // batches per update (gradient accumulation): one push / all-reduce / step per this many
  double epochs = 10.0;  // passes over the training set (all workers together)
  long steps = 0;        // > 0: steps per worker, overrides epochs
  std::string device = "cpu";  // "cpu" or "cuda"
  bool tf32 = false;            // cuda: GEMMs may use TF32 tensor cores
  std::string cuda_graphs = "auto";  // cuda: a step's forward + backward as one CUDA graph: "auto", "on", "off"
  int threads = 0;       // BLAS threads per process; 0 = cores on the host / processes on it
  int log_every = 20;    // steps between metric lines
};

struct ClusterConfig {
  std::string mode = "bsp";  // a mode of ps/modes/: "allreduce", "bsp", "ssp:<s>", "asp", ...
  int workers = 1;
  int servers = 1;           // PS modes only
  int server_threads = 0;    // threads per server for large updates (0: run/setup.h's server_threads)
  std::string transport = "tcp";     // comm/transport/: "tcp", "ipc", "shm", "auto"
  std::string codec = "f32";         // ps/codecs/: how pushes encode gradients
  std::string pull_codec = "f32";    // how pull replies to workers encode θ: "f32", "f16", "bf16"
  std::string error_feedback = "auto";  // "on", "off", or "auto": on for the codecs that want it (topk, sign)
  int sync_every = 1;        // easgd: local steps between a worker's elastic exchanges with the centre
  // Send each finished piece of ∇θ while backward goes on; "auto": on for GPU workers, on for CPU
  // workers on a host with at least as many cores as processes (run/setup.h: overlaps()).
  AutoBool overlap;
  int bucket_kb = 256;       // allreduce with overlap: KiB of ∇θ per bucket
  int piece_kib = 512;       // PS modes: KiB per piece of a push or pull reply (0 = whole shards; ps/pieces.h)
  std::string collective = "auto";  // allreduce on GPUs: "nccl", "gloo" (through host memory), "auto"
  std::string mps = "auto";         // GPUs shared through a private CUDA MPS daemon: "auto", "on", "off" (the launcher)
  std::string launcher = "local";    // "local", "ssh", "slurm"
  std::vector<std::string> hosts;    // ssh: hosts, round-robin over processes
  std::string bind = "127.0.0.1";    // local launcher: address servers and rendezvous bind to
  std::string interface;             // ssh, Slurm: every host's address is this interface's (or this address)
  std::vector<std::string> addresses;  // ssh, Slurm: "HOST=ADDRESS" or "HOST=INTERFACE", per host
  std::string auth = "auto";         // "curve" (peers prove the run's key), "none", or "auto": curve
                                     // whenever a listener is a TCP port, loopback too (the launcher decides)
  double timeout_s = 60.0;   // longest any blocking wait may take before it fails, naming the peer
  double heartbeat_s = 5.0;  // a worker or all-reduce rank silent this long (no message, no heartbeat) is lost
  std::string on_worker_loss = "auto";  // "continue" (drop it, train on), "fail", or "auto":
                                        // continue where the mode allows it (asp, ssp), else fail
  // How long a link may be down and come back: a worker the servers dropped as silent that speaks
  // again within it is taken back, and a worker waits this long for a silent server (-1: auto, 0
  // on one host, 30 across hosts; 0: never).
  double reconnect_s = -1.0;
  // ssh: how long the launcher and a process it started over ssh go on without hearing each other
  // (the launcher's heartbeat on the remote end's stdin; ssh's keep-alive) before the process is
  // stopped on its host and the run fails (s); -1: auto, twice the reconnect window, at least 60.
  double ssh_alive_s = -1.0;
  std::string on_server_loss = "auto";  // "restart" (the launcher restarts a server that died from its
                                        // checkpoint; workers rejoin it), "fail", or "auto": restart
                                        // where the mode trains on when updates are lost (asp, ssp)
                                        // over tcp or ipc, and the launcher owns the processes (not
                                        // Slurm), else fail
  // Copies of each shard (1 or 2): with 2, each server has a backup in another process (on another
  // host where there is one) that takes every update before the primary answers (chain
  // replication, server/replication.cpp); when the primary dies the backup takes over, and the
  // workers fail over to it with nothing lost.
  int replicas = 1;
  // The push guard (server/push_guard.h): pushes with a batch beyond the plan's, values that are
  // not finite, or a norm over guard_norm_factor x the median of recent ones are refused,
  // counted, and count as empty; guard_drop_after refusals in a row drop the worker.
  bool push_guard = true;
  double guard_norm_factor = 4.0;  // at a batch of 32 or more; sqrt(32 / batch) x it below. 0: no norm bound
  int guard_drop_after = 10;        // 0: never dropped for it
};

// Who computes the workers' gradients: pslab_worker (model.kind), or a program of the user's
// through libpslab_client.so, started by the launcher for every worker and for the evaluator.
struct WorkerConfig {
  std::string kind = "builtin";    // "builtin" (pslab_worker) or "python" (worker.script)
  std::string script;              // python: the script (relative: to the config file's directory)
  std::string python = "python3";  // python: the interpreter that runs it
};

struct EvalConfig {
  double interval_s = 2.0;  // evaluator period in seconds (plus one at the end)
  double every_epochs = 0.0;  // > 0: evaluate each time this many more epochs were applied, instead
  int batch = 1000;         // evaluation batch
  double target_acc = 0.85; // for time_to_target_s in the summary
};

struct CheckpointConfig {
  double every_s = 30.0;  // PS servers write their shard this often (and when they stop); allreduce rank 0
                          // its θ and optimizer state (and at the end); 0: only then
};

struct StragglerConfig {
  std::vector<int> workers;  // ranks slowed by `slowdown`
  double slowdown = 1.0;     // those ranks' compute takes this many times as long
  double delay_ms = 0.0;     // fixed extra sleep per step, every worker
  double exp_delay_ms = 0.0; // extra sleep per step ~ Exp(mean), every worker, from the seed
};

// Workers that push garbage on purpose, for experiments on robustness (and on the servers' push
// guard, cluster.push_guard): instead of its gradient, each of these ranks pushes NaN ("nan"),
// uniform noise in ±scale ("noise"), or its gradient claiming a batch of 2^31 - 1 ("batch").
struct ByzantineConfig {
  std::vector<int> workers;   // the ranks that misbehave
  std::string kind = "nan";   // "nan", "noise" or "batch"
  double scale = 0.5;         // "noise": its amplitude
};

// cluster.launcher = "virtual": the cost model of the simulated cluster (worker/virtual_cluster.h);
// `launch.py calibrate` measures it on the machine at hand.
struct VirtualConfig {
  double compute_ms = 0.0;      // one worker's forward + backward at train.batch (0: measured at start, here)
  double latency_us = 50.0;     // one message, one way
  double bandwidth_gbps = 5.0;  // one link, GB/s, each direction
  double apply_gbps = 5.0;      // a server's update (the rule's step), GB/s of its shard
  double allreduce_ms = 0.0;    // one all-reduce of ∇θ (0: a ring over the links)
  double allreduce_compute_ms = 0.0;  // compute_ms in allreduce mode (0: compute_ms): no servers share the cores
  double startup_ms = 0.0;      // before the first step: connections, first-touch costs (a real run's span less its steps)
  std::string replay;           // a recorded asp/ssp/bsp run's directory: re-execute its order (launch.py replay)
};

struct ExperimentConfig {
  std::string name = "experiment";
  std::uint64_t seed = 1;
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  TrainConfig train;
  ClusterConfig cluster;
  WorkerConfig worker;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  StragglerConfig straggler;
  ByzantineConfig byzantine;
  VirtualConfig virtual_cluster;  // [virtual]

  // The mode cluster.mode names (made once per process; ps/modes/mode.h). Throws
  // std::invalid_argument for an unknown mode.
  const Mode& mode() const;
  // Whether the run has parameter servers: every mode but "allreduce".
  bool uses_servers() const { return mode().uses_servers(); }
};

// Whether a lost worker fails the run (cluster.on_worker_loss resolved: "auto" is "continue"
// for the modes whose rule trains on without it, asp and ssp, and "fail" for bsp and allreduce).
bool continues_without_lost_workers(const ExperimentConfig& c);
// Whether a server that dies is restarted from its checkpoint while the run goes on
// (cluster.on_server_loss resolved: "auto" is "restart" for asp and ssp over tcp or ipc, not
// under Slurm).
bool restarts_lost_servers(const ExperimentConfig& c);
// cluster.reconnect_s resolved (s): "auto" (-1) is 0 when every process runs on one host (the
// local launcher, one ssh host) and 30 across hosts (ssh with several, Slurm).
double reconnect_window_s(const ExperimentConfig& c);
// cluster.ssh_alive_s resolved (s): "auto" (-1) is twice reconnect_window_s, at least 60.
double ssh_alive_window_s(const ExperimentConfig& c);
// Whether the workers' push encoders keep what a lossy codec left out and add it to the next push
// (cluster.error_feedback resolved: "auto" is on for the codecs that want it, topk and sign).
bool uses_error_feedback(const ExperimentConfig& c);

// Parses a TOML file, applies `overrides` ("section.key=value", value in TOML syntax, bare
// words taken as strings) and validates. Throws ConfigError naming the file and the key.
ExperimentConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same from TOML text; `origin` names it in errors.
ExperimentConfig parse_config(const std::string& toml_text, const std::string& origin,
                              const std::vector<std::string>& overrides = {});
// Every key with its value, defaults included, as TOML that parse_config reads back equal.
std::string to_toml(const ExperimentConfig& c);
// The same as JSON ({"model": {"kind": ...}, ...}), for workers in other languages.
std::string to_json(const ExperimentConfig& c);
// A 64-bit fingerprint of the config (FNV-1a of to_toml): peers of one run must agree on it.
std::uint64_t config_fingerprint(const ExperimentConfig& c);
// Range and cross-field checks; throws ConfigError("<origin>: <key>: ...").
void validate(const ExperimentConfig& c, const std::string& origin);

// One line per key: "section.key  type  default  description".
std::string describe_keys();

// Sweeps: a key given a list where a single value is expected (a list of lists for list
// keys) is swept. `overrides` apply first (so overriding a swept key with one value ends that
// sweep). Returns one TOML text per point of the cross product, in the order of the keys in
// visit_fields(), each validated, and sets `labels` to a "key=value,..." name of each point.
std::vector<std::string> expand_sweep(const std::string& toml_text, const std::string& origin,
                                      std::vector<std::string>& labels,
                                      const std::vector<std::string>& overrides = {});

}  // namespace pslab
