// libpslab_client.so: the C API of pslab_client.h over PsClient (src/ps/client.h). Every C++
// exception becomes -1 and its message (pslab_client_error); nothing is thrown across the C
// boundary.
#include "pslab_client.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/data.h"
#include "core/model.h"
#include "core/sampler.h"
#include "ps/client.h"
#include "run/config.h"
#include "run/metrics.h"
#include "run/setup.h"
#include "train_log.h"

struct pslab_client {
  std::string error;  // of the last call
  std::unique_ptr<pslab::ExperimentConfig> cfg;
  std::unique_ptr<pslab::comm::Transport> transport;
  std::unique_ptr<pslab::PsClient> client;
  std::unique_ptr<pslab::ShardSampler> sampler;  // this worker's batches
  long steps_per_epoch = 0, total_steps = 0;
  std::unique_ptr<pslab::DataSplit> data;  // loaded on first use
  int rank = 0;
  std::unique_ptr<pslab::MetricsWriter> metrics;  // pslab_client_metrics
  std::unique_ptr<pslab::Progress> progress;
  std::unique_ptr<pslab::TrainLog> log;

  const pslab::Dataset& train() {
    if (!data) data = std::make_unique<pslab::DataSplit>(pslab::load_data(*cfg));
    return data->train;
  }
};

namespace {

std::vector<std::string> split_commas(const char* s) {
  std::vector<std::string> out;
  if (!s) return out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) out.push_back(part);
  return out;
}

void fill(pslab_pull_info* info, const pslab::PullResult& r) {
  if (!info) return;
  *info = pslab_pull_info{r.min_version, r.max_version, r.samples_applied, r.held_us, r.min_clock, r.training_done ? 1 : 0};
}

// Runs f on c's client, turning what it throws into -1 and c->error.
template <typename F>
int call(pslab_client* c, const char* what, F&& f) {
  if (!c) return -1;
  if (!c->client) {
    if (c->error.empty()) c->error = std::string(what) + ": the client is closed";
    return -1;
  }
  c->error.clear();
  try {
    f(*c->client);
    return 0;
  } catch (const std::exception& e) {
    c->error = e.what();
  } catch (...) {
    c->error = std::string(what) + ": an unknown error";
  }
  return -1;
}

// The training set's size, features or classes (-1 when it cannot be loaded: pslab_client_error).
template <typename F>
long of_train_set(pslab_client* c, F&& f) {
  long v = -1;
  call(c, "train set", [&](pslab::PsClient&) { v = f(c->train()); });
  return v;
}

}  // namespace

extern "C" {

pslab_client* pslab_client_open(const char* config_path, const char* const* overrides, int n_overrides, int rank,
                                const char* servers, const char* backups, const char* auth_key) {
  auto* c = new pslab_client;
  try {
    if (!config_path) throw std::invalid_argument("no config path");
    std::vector<std::string> sets;
    for (int i = 0; i < n_overrides; ++i)
      if (overrides && overrides[i]) sets.emplace_back(overrides[i]);
    c->cfg = std::make_unique<pslab::ExperimentConfig>(pslab::load_config(config_path, sets));
    const pslab::ExperimentConfig& cfg = *c->cfg;
    if (!cfg.uses_servers())
      throw std::invalid_argument("cluster.mode = \"" + cfg.cluster.mode + "\" has no parameter servers to be a worker of");
    if (rank < 0 || rank >= cfg.cluster.workers)
      throw std::invalid_argument("rank " + std::to_string(rank) + " is not in [0, cluster.workers = " +
                                  std::to_string(cfg.cluster.workers) + ")");
    const std::vector<std::string> endpoints = split_commas(servers), copies = split_commas(backups);
    if (int(endpoints.size()) != cfg.cluster.servers)
      throw std::invalid_argument(std::to_string(endpoints.size()) + " server address(es) given, cluster.servers = " +
                                  std::to_string(cfg.cluster.servers));
    c->rank = rank;
    c->sampler = std::make_unique<pslab::ShardSampler>(pslab::train_set_size(cfg), cfg.cluster.workers, rank, cfg.seed);
    c->steps_per_epoch = c->sampler->steps_per_epoch(cfg.train.batch);
    c->total_steps = pslab::total_steps(cfg, c->steps_per_epoch);
    c->transport = pslab::run_transport(cfg, auth_key ? auth_key : "");
    c->client = std::make_unique<pslab::PsClient>(*c->transport, endpoints,
                                                  pslab::client_options(cfg, pslab::wire::Role::worker, rank, copies));
  } catch (const pslab::ConfigError& e) {  // (names the file already)
    c->error = e.what();
    c->client.reset();
  } catch (const std::exception& e) {
    c->error = std::string(config_path ? config_path : "(no config)") + ": " + e.what();
    c->client.reset();
  }
  return c;
}

const char* pslab_client_error(const pslab_client* c) { return c ? c->error.c_str() : "no client"; }

long pslab_client_num_params(const pslab_client* c) {
  return c && c->client ? long(c->client->num_params()) : 0;
}

long pslab_client_total_steps(const pslab_client* c) { return c && c->client ? c->total_steps : 0; }

long pslab_client_steps_per_epoch(const pslab_client* c) { return c && c->client ? c->steps_per_epoch : 0; }

int pslab_client_batch(pslab_client* c, long step, unsigned* idx, int room) {
  int n = -1;
  const int rc = call(c, "batch", [&](pslab::PsClient&) {
    if (step < 0) throw std::invalid_argument("batch: step " + std::to_string(step) + " < 0");
    c->sampler->set_epoch(step / c->steps_per_epoch);  // (the same epoch again costs nothing)
    const auto b = c->sampler->batch(step % c->steps_per_epoch, c->cfg->train.batch);
    n = int(b.size());
    if (!idx) return;  // (the count alone)
    if (long(b.size()) > room)
      throw std::invalid_argument("batch: room for " + std::to_string(room) + " indices, the batch has " + std::to_string(b.size()));
    std::copy(b.begin(), b.end(), idx);
  });
  return rc == 0 ? n : -1;
}

long pslab_client_train_samples(pslab_client* c) { return of_train_set(c, [](const pslab::Dataset& d) { return long(d.n); }); }

int pslab_client_features(pslab_client* c) { return int(of_train_set(c, [](const pslab::Dataset& d) { return long(d.features()); })); }

int pslab_client_classes(pslab_client* c) { return int(of_train_set(c, [](const pslab::Dataset& d) { return long(d.classes); })); }

int pslab_client_train_set(pslab_client* c, float* x, int* labels) {
  return call(c, "train set", [&](pslab::PsClient&) {
    const pslab::Dataset& d = c->train();
    if (x) std::copy(d.x.data(), d.x.data() + std::size_t(d.n) * std::size_t(d.features()), x);
    if (labels && d.classes > 0) std::copy(d.labels.begin(), d.labels.end(), labels);
  });
}

int pslab_client_metrics(pslab_client* c, const char* run_dir, double run_start) {
  return call(c, "metrics", [&](pslab::PsClient&) {
    if (!run_dir || !*run_dir) throw std::invalid_argument("metrics: no run directory");
    c->log.reset();
    c->metrics = std::make_unique<pslab::MetricsWriter>(std::string(run_dir) + "/metrics/worker" + std::to_string(c->rank) +
                                                            ".jsonl", run_start);
    c->progress = std::make_unique<pslab::Progress>("worker " + std::to_string(c->rank), c->rank == 0);
    c->log = std::make_unique<pslab::TrainLog>(*c->metrics, *c->progress, c->rank, c->cfg->train.log_every, c->total_steps);
  });
}

int pslab_client_step(pslab_client* c, long step, double loss, int samples, double compute_s, double comm_s, double wait_s,
                      long version) {
  return call(c, "step", [&](pslab::PsClient&) {
    if (!c->log) throw std::invalid_argument("step: no metrics (pslab_client_metrics first)");
    pslab::StepRecord r;
    r.loss = loss, r.samples = samples, r.compute_s = compute_s, r.comm_s = comm_s, r.wait_s = wait_s, r.version = version;
    const bool epoch_end = (step + 1) % c->steps_per_epoch == 0, last = step + 1 == c->total_steps;
    c->log->add(step, double(step + 1) / double(c->steps_per_epoch), r, last || epoch_end);
    if (last) c->metrics->flush();
  });
}

int pslab_client_connect(pslab_client* c) {
  return call(c, "connect", [](pslab::PsClient& client) { client.connect(); });
}

int pslab_client_pull(pslab_client* c, long clock, float* theta, pslab_pull_info* info) {
  return call(c, "pull", [&](pslab::PsClient& client) {
    if (!theta) throw std::invalid_argument("pull: no θ buffer");
    fill(info, client.pull(clock, theta));
  });
}

int pslab_client_push(pslab_client* c, long clock, int batch, const float* grad, float* theta, pslab_pull_info* info) {
  return call(c, "push", [&](pslab::PsClient& client) {
    if (!grad) throw std::invalid_argument("push: no gradient buffer");
    fill(info, client.push(clock, batch, grad, theta));
  });
}

int pslab_client_bye(pslab_client* c, long clock) {
  return call(c, "bye", [&](pslab::PsClient& client) {
    client.bye(clock);
    if (c->metrics) c->metrics->flush();
  });
}

void pslab_client_close(pslab_client* c) {
  if (!c) return;
  c->log.reset();  // (before what it writes to)
  c->metrics.reset();
  c->client.reset();  // (before the transport it uses)
  c->transport.reset();
  delete c;
}

}  // extern "C"
