// From a config to the things a process builds: the model spec, the data, step counts.
// Every process of a run derives these the same way, so they agree without talking.
#pragma once

#include <memory>
#include <string>

#include "comm/transport/transport.h"
#include "core/data.h"
#include "core/datasets.h"
#include "core/model.h"
#include "ps/client.h"
#include "run/config.h"

namespace pslab {

// Input shape and outputs follow the data kind (Fashion-MNIST: 1x28x28, 10 classes;
// synthetic: data.dim features, data.outputs outputs), so the server can size θ without
// loading any data.
// The data.* keys as its data kind reads them, and what the data set is before it is read
// (core/datasets.h: a sample's shape, the task, the samples used; from at most files' headers).
DataSpec data_spec(const ExperimentConfig& c);
DataShape data_shape(const ExperimentConfig& c);
ModelSpec model_spec(const ExperimentConfig& c);
DataSplit load_data(const ExperimentConfig& c);

// Samples in the training / test set the config names, without loading any data
// (Fashion-MNIST: 60000 / 10000, or the data.*_samples prefix; synthetic: data.*_samples,
// 0 meaning 8192 / 2048).
std::size_t train_set_size(const ExperimentConfig& c);
std::size_t test_set_size(const ExperimentConfig& c);
// Steps per epoch of each of `workers` workers sharing the training set (ShardSampler's
// count: ceil(ceil(N / workers) / batch)).
long steps_per_epoch(const ExperimentConfig& c, int workers);
// Steps every worker runs: train.steps if > 0, else ceil(epochs * steps per epoch).
long total_steps(const ExperimentConfig& c, long steps_per_epoch);
// How the run's shards travel (cluster.piece_kib; whole with an optimizer that needs_whole_range),
// the same for its workers and servers.
Pieces pieces_of(const ExperimentConfig& c);
// The sizes of the model's layers, which no shard may split, for an optimizer that needs whole
// layers (lars, lamb: a trust ratio per layer); empty otherwise (shard_range()).
std::vector<std::size_t> shard_layers(const ExperimentConfig& c);
// How a worker (role worker, its rank) or the evaluator (role evaluator, wire::kEvaluator)
// of this run talks to the servers.
PsClient::Options client_options(const ExperimentConfig& c, wire::Role role, int rank,
                                 const std::vector<std::string>& backups = {});
// The run's transport (cluster.transport); with `auth_key_file` (the run's key, made by the
// launcher) its peers authenticate. cluster.auth = "curve" without a key file is refused.
std::unique_ptr<comm::Transport> run_transport(const ExperimentConfig& c, const std::string& auth_key_file);
// BLAS threads for a process: train.threads, or the host's cores / processes_on_host.
int blas_threads(const ExperimentConfig& c, int processes_on_host);
// Threads a server splits a large update over: cluster.server_threads, or the host's cores /
// processes_on_host; in a GPU run (train.device = "cuda") the servers on the host share the
// cores its other processes leave, a core each (they compute on GPUs; at least the share
// above). cores: the host's (0: std::thread::hardware_concurrency()).
int server_threads(const ExperimentConfig& c, int processes_on_host, int servers_on_host = 1, int cores = 0);
// Whether a training process overlaps communication with backward (cluster.overlap): true or
// false as set; "auto": on for GPU workers of the modes that push gradients (∇θ leaves the GPU
// on its copy engine while the GPU computes the rest, the host idle otherwise), on for CPU
// workers of those modes and of allreduce when the host has at least as many cores as processes
// (sending takes cores that backward needs), on for GPU all-reduce unless cluster.collective =
// "nccl" (the rank overlaps only if its collective goes through host memory: "gloo", or "auto"
// where ranks share a GPU), off with train.accumulate > 1, for rules that push models
// (local:H, easgd) and in the virtual cluster (simulated time). NCCL all-reduce does not overlap.
bool overlaps(const ExperimentConfig& c, int processes_on_host);
// The schedule with its length (total_epochs) set from the run: train.epochs, or, when
// train.steps decides the run's length, those steps in epochs of `steps_per_epoch` steps.
ScheduleConfig schedule_for_run(const ExperimentConfig& c, long steps_per_epoch);

}  // namespace pslab
