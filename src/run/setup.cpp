#include "run/setup.h"

#include "core/optimizer.h"
#include "core/sampler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <thread>

namespace pslab {

DataSpec data_spec(const ExperimentConfig& c) {
  DataSpec d;
  d.kind = c.data.kind, d.path = c.data.path, d.normalize = c.data.normalize;
  d.train_samples = c.data.train_samples, d.test_samples = c.data.test_samples;
  d.dim = c.data.dim, d.outputs = c.data.outputs, d.seed = c.seed;
  return d;
}

DataShape data_shape(const ExperimentConfig& c) { return data_registry().make(c.data.kind)->shape(data_spec(c)); }

ModelSpec model_spec(const ExperimentConfig& c) {
  ModelSpec s;
  s.kind = c.model.kind;
  s.hidden = c.model.hidden;
  s.conv_channels = c.model.conv_channels;
  s.depth = c.model.depth, s.stage_width = c.model.width;
  s.init = c.model.init;
  s.sizes = c.model.sizes;
  s.theta_file = c.model.theta_file;
  const DataShape d = data_shape(c);
  s.channels = d.channels, s.height = d.height, s.width = d.width, s.outputs = d.outputs;
  s.loss = d.classification ? Loss::softmax_xent : Loss::mse;
  return s;
}

DataSplit load_data(const ExperimentConfig& c) { return data_registry().make(c.data.kind)->load(data_spec(c)); }

std::size_t train_set_size(const ExperimentConfig& c) { return data_shape(c).train_n; }

std::size_t test_set_size(const ExperimentConfig& c) { return data_shape(c).test_n; }

long steps_per_epoch(const ExperimentConfig& c, int workers) {
  return ShardSampler::steps_per_epoch(train_set_size(c), workers, c.train.batch);
}

long total_steps(const ExperimentConfig& c, long steps_per_epoch) {
  if (c.train.steps > 0) return c.train.steps;
  return std::max(1L, long(std::ceil(c.train.epochs * double(steps_per_epoch) - 1e-9)));
}

Pieces pieces_of(const ExperimentConfig& c) {
  if (optimizer_registry().make(c.optimizer.kind)->needs_whole_range()) return {};  // lars, lamb: whole shards
  return Pieces::of_kib(c.cluster.piece_kib);
}

std::vector<std::size_t> shard_layers(const ExperimentConfig& c) {
  if (!optimizer_registry().make(c.optimizer.kind)->needs_whole_range()) return {};
  const ModelSpec spec = model_spec(c);
  return layer_sizes(spec, 0, count_params(spec));
}

PsClient::Options client_options(const ExperimentConfig& c, wire::Role role, int rank, const std::vector<std::string>& backups) {
  PsClient::Options o;
  o.role = role;
  o.rank = rank;
  o.num_params = count_params(model_spec(c));
  o.shard_layers = shard_layers(c);
  o.config_hash = config_fingerprint(c);
  o.timeout_s = c.cluster.timeout_s;
  o.codec = c.cluster.codec;
  o.error_feedback = uses_error_feedback(c);
  o.pieces = pieces_of(c);
  if (role == wire::Role::worker) o.pull_codec = c.cluster.pull_codec;  // the evaluator tests θ in f32
  // Workers: servers drop silent ones. Both: Beats while waiting, so that a connection that was cut
  // and came back is noticed (the server does not know it) and the session resumed.
  o.heartbeat_s = c.cluster.heartbeat_s;
  o.rejoin = restarts_lost_servers(c);  // a server that dies comes back: wait for it and rejoin
  o.reconnect_s = reconnect_window_s(c);  // a link that was down comes back: wait for it
  o.backups = backups;                    // cluster.replicas = 2: a dead server's shard goes to its backup
  o.total_steps = total_steps(c, steps_per_epoch(c, c.cluster.workers));  // (the bound servers hold Hellos to)
  return o;
}

int blas_threads(const ExperimentConfig& c, int processes_on_host) {
  if (c.train.threads > 0) return c.train.threads;
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, processes_on_host));
}

int server_threads(const ExperimentConfig& c, int processes_on_host, int servers_on_host, int cores) {
  if (c.cluster.server_threads > 0) return c.cluster.server_threads;
  if (cores <= 0) cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int procs = std::max(1, processes_on_host);
  const int share = std::max(1, cores / procs);
  if (c.train.device != "cuda") return share;
  const int servers = std::clamp(servers_on_host, 1, procs);
  return std::max(share, (cores - (procs - servers)) / servers);
}

bool overlaps(const ExperimentConfig& c, int processes_on_host) {
  if (!c.cluster.overlap.is_auto()) return c.cluster.overlap.is_on();
  const WorkerProtocol::Kind kind = c.mode().worker_protocol().kind;
  if (c.train.accumulate != 1 || (kind != WorkerProtocol::Kind::gradient && kind != WorkerProtocol::Kind::allreduce) ||
      c.cluster.launcher == "virtual")
    return false;
  if (c.train.device == "cuda") return kind == WorkerProtocol::Kind::gradient || c.cluster.collective != "nccl";
  return int(std::thread::hardware_concurrency()) >= std::max(1, processes_on_host);
}

ScheduleConfig schedule_for_run(const ExperimentConfig& c, long steps_per_epoch) {
  ScheduleConfig s = c.schedule;
  s.total_epochs = c.train.steps > 0 ? double(c.train.steps) / double(steps_per_epoch) : c.train.epochs;
  return s;
}

std::unique_ptr<comm::Transport> run_transport(const ExperimentConfig& c, const std::string& auth_key_file) {
  if (auth_key_file.empty() && c.cluster.auth == "curve")
    throw std::invalid_argument("cluster.auth = \"curve\": this process needs the run's key (--auth-key FILE; the "
                                "launcher makes one for each run)");
  auto t = comm::make_transport(c.cluster.transport);
  if (!auth_key_file.empty()) t->authenticate(comm::read_run_key(auth_key_file));
  return t;
}

}  // namespace pslab
