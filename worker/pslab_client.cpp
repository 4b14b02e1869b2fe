// libpslab_client.so: the C API of pslab_client.h over PsClient (src/ps/client.h). Every C++
// exception becomes -1 and its message (pslab_client_error); nothing is thrown across the C
// boundary.
#include "pslab_client.h"

#include <algorithm>
#include <type_traits>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/interrupt.h"
#include "backend.h"
#include "core/data.h"
#include "core/model.h"
#include "core/optimizer.h"
#include "core/sampler.h"
#include "eval_schedule.h"
#include "grad_accumulator.h"
#include "ps/client.h"
#include "roles/local_worker.h"
#include "run/config.h"
#include "run/metrics.h"
#include "run/setup.h"
#include "straggler.h"
#include "taken_queue.h"
#include "train_log.h"

namespace {

// The run's rule on a worker of the user's (pslab_client_begin / _train_step / _end): the loops
// of roles/ps_worker.cpp (gradient) and roles/local_worker.cpp (delta, elastic) around a gradient
// computed elsewhere, on host buffers of P floats. Buffers allocated once, at begin.
struct Rule {
  pslab::WorkerProtocol proto;
  std::unique_ptr<pslab::Backend> cpu;            // for the accumulator and the local optimizer
  std::unique_ptr<pslab::GradAccumulator> acc;    // gradient: train.accumulate batches per push
  std::unique_ptr<pslab::Optimizer> optimizer;    // delta, elastic: the worker's own
  std::unique_ptr<pslab::Straggler> straggler;
  pslab::ScheduleConfig schedule;
  int lr_batch = 0;
  long every = 1;                 // delta, elastic: steps per exchange
  std::vector<float> pulled, change;  // delta: θ as last pulled; the change pushed (elastic: the centre, then e)
  int samples_since_push = 0;
  long pushes = 0;                // the next push's clock
  pslab::PullResult last;         // the servers' last answer
};

}  // namespace

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
  std::string config_json;
  std::unique_ptr<Rule> rule;  // pslab_client_begin
  // The evaluator (rank PSLAB_CLIENT_EVALUATOR): a taker thread takes each θ when due (ticks)
  // into the queue; next_theta hands them out in order; `current` is the one handed out last.
  struct Taken {
    pslab::PullResult r;
    double taken_s = 0.0;  // (s since the run's start)
  };
  std::unique_ptr<pslab::ServerTicks> ticks;
  std::unique_ptr<pslab::TakenQueue<Taken>> queue;
  std::jthread taker;
  Taken current;
  bool has_current = false;

  void stop_taker() {
    if (!taker.joinable()) return;
    taker.request_stop();
    taker.join();
  }

  bool opened = false;  // the config was read: calls may be made (servers or not)

  bool evaluator() const { return rank == PSLAB_CLIENT_EVALUATOR; }

  const pslab::Dataset& train() { return split().train; }
  const pslab::Dataset& test() { return split().test; }
  const pslab::DataSplit& split() {
    if (!data) data = std::make_unique<pslab::DataSplit>(pslab::load_data(*cfg));
    return *data;
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

// Runs f, turning what it throws into -1 and c->error: f(client) for a call that talks to the
// servers, f() for one that does not (a client opened without servers has the data alone).
template <typename F>
int call(pslab_client* c, const char* what, F&& f) {
  if (!c) return -1;
  if (!c->opened) {
    if (c->error.empty()) c->error = std::string(what) + ": the client is closed";
    return -1;
  }
  c->error.clear();
  pslab::comm::forget_interrupt();  // (a Ctrl-C before this call was Python's to raise: it ends no wait of this one)
  try {
    if constexpr (std::is_invocable_v<F, pslab::PsClient&>) {
      if (!c->client)
        throw std::invalid_argument(std::string(what) + ": this client was opened without servers (for the data alone)");
      f(*c->client);
    } else {
      f();
    }
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
  call(c, "train set", [&]() { v = f(c->train()); });
  return v;
}

}  // namespace

extern "C" {

void pslab_client_catch_interrupts(void) { pslab::comm::catch_interrupts(); }

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
    if (rank != PSLAB_CLIENT_EVALUATOR && (rank < 0 || rank >= cfg.cluster.workers))
      throw std::invalid_argument("rank " + std::to_string(rank) + " is not in [0, cluster.workers = " +
                                  std::to_string(cfg.cluster.workers) + ") nor the evaluator's (" +
                                  std::to_string(PSLAB_CLIENT_EVALUATOR) + ")");
    const std::vector<std::string> endpoints = split_commas(servers), copies = split_commas(backups);
    const bool data_alone = endpoints.empty();
    if (!data_alone && int(endpoints.size()) != cfg.cluster.servers)
      throw std::invalid_argument(std::to_string(endpoints.size()) + " server address(es) given, cluster.servers = " +
                                  std::to_string(cfg.cluster.servers));
    c->rank = rank;
    c->config_json = pslab::to_json(cfg);
    const bool evaluator = rank == PSLAB_CLIENT_EVALUATOR;
    c->sampler = std::make_unique<pslab::ShardSampler>(pslab::train_set_size(cfg), cfg.cluster.workers, evaluator ? 0 : rank,
                                                       cfg.seed);
    c->steps_per_epoch = c->sampler->steps_per_epoch(cfg.train.batch);
    c->total_steps = evaluator ? 0 : pslab::total_steps(cfg, c->steps_per_epoch);
    c->opened = true;
    if (data_alone) return c;
    c->transport = pslab::run_transport(cfg, auth_key ? auth_key : "");
    c->client = std::make_unique<pslab::PsClient>(
        *c->transport, endpoints,
        evaluator ? pslab::client_options(cfg, pslab::wire::Role::evaluator, pslab::wire::kEvaluator, copies)
                  : pslab::client_options(cfg, pslab::wire::Role::worker, rank, copies));
  } catch (const pslab::ConfigError& e) {  // (names the file already)
    c->error = e.what();
    c->client.reset();
    c->opened = false;
  } catch (const std::exception& e) {
    c->error = std::string(config_path ? config_path : "(no config)") + ": " + e.what();
    c->client.reset();
    c->opened = false;
  }
  return c;
}

const char* pslab_client_error(const pslab_client* c) { return c ? c->error.c_str() : "no client"; }

long pslab_client_num_params(const pslab_client* c) {
  return c && c->client ? long(c->client->num_params()) : 0;
}

long pslab_client_total_steps(const pslab_client* c) { return c && c->opened ? c->total_steps : 0; }

long pslab_client_steps_per_epoch(const pslab_client* c) { return c && c->opened ? c->steps_per_epoch : 0; }

int pslab_client_batch(pslab_client* c, long step, unsigned* idx, int room) {
  int n = -1;
  const int rc = call(c, "batch", [&]() {
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

namespace {
int copy_set(pslab_client* c, bool test, float* x, int* labels) {
  return call(c, test ? "test set" : "train set", [&]() {
    const pslab::Dataset& d = test ? c->test() : c->train();
    if (x) std::copy(d.x.data(), d.x.data() + std::size_t(d.n) * std::size_t(d.features()), x);
    if (labels && d.classes > 0) std::copy(d.labels.begin(), d.labels.end(), labels);
  });
}
}  // namespace

int pslab_client_train_set(pslab_client* c, float* x, int* labels) { return copy_set(c, false, x, labels); }

long pslab_client_test_samples(pslab_client* c) {
  long v = -1;
  call(c, "test set", [&]() { v = long(c->test().n); });
  return v;
}

int pslab_client_test_set(pslab_client* c, float* x, int* labels) { return copy_set(c, true, x, labels); }

int pslab_client_target_dim(pslab_client* c) { return int(of_train_set(c, [](const pslab::Dataset& d) { return long(d.target_dim); })); }

int pslab_client_targets(pslab_client* c, int test, float* targets) {
  return call(c, "targets", [&]() {
    const pslab::Dataset& d = test ? c->test() : c->train();
    if (targets) std::copy(d.targets.begin(), d.targets.end(), targets);
  });
}

int pslab_client_metrics(pslab_client* c, const char* run_dir, double run_start) {
  return call(c, "metrics", [&]() {
    if (!run_dir || !*run_dir) throw std::invalid_argument("metrics: no run directory");
    c->log.reset();
    const std::string name = c->evaluator() ? "evaluator" : "worker" + std::to_string(c->rank);
    c->metrics = std::make_unique<pslab::MetricsWriter>(std::string(run_dir) + "/metrics/" + name + ".jsonl", run_start);
    if (c->evaluator()) return;
    c->progress = std::make_unique<pslab::Progress>("worker " + std::to_string(c->rank), c->rank == 0);
    c->log = std::make_unique<pslab::TrainLog>(*c->metrics, *c->progress, c->rank, c->cfg->train.log_every, c->total_steps);
  });
}

int pslab_client_step(pslab_client* c, long step, double loss, int samples, double compute_s, double comm_s, double wait_s,
                      long version) {
  return call(c, "step", [&]() {
    if (!c->log) throw std::invalid_argument("step: no metrics (pslab_client_metrics first)");
    pslab::StepRecord r;
    r.loss = loss, r.samples = samples, r.compute_s = compute_s, r.comm_s = comm_s, r.wait_s = wait_s, r.version = version;
    const bool epoch_end = (step + 1) % c->steps_per_epoch == 0, last = step + 1 == c->total_steps;
    c->log->add(step, double(step + 1) / double(c->steps_per_epoch), r, last || epoch_end);
    if (last) c->metrics->flush();
  });
}

const char* pslab_client_config(const pslab_client* c) { return c ? c->config_json.c_str() : ""; }

int pslab_client_begin(pslab_client* c, float* theta, pslab_step_info* info) {
  return call(c, "begin", [&](pslab::PsClient& client) {
    if (c->evaluator()) throw std::invalid_argument("begin: the evaluator trains nothing (pslab_client_next_theta)");
    if (!theta) throw std::invalid_argument("begin: no θ buffer");
    if (c->rule) throw std::invalid_argument("begin: called twice");
    const pslab::ExperimentConfig& cfg = *c->cfg;
    const std::size_t P = client.num_params();
    auto r = std::make_unique<Rule>();
    const pslab::Mode& mode = cfg.mode();
    r->proto = mode.worker_protocol();
    r->cpu = pslab::make_cpu_backend(1);
    r->straggler = std::make_unique<pslab::Straggler>(cfg.straggler, cfg.seed, c->rank, c->transport->clock());
    client.connect();  // the start barrier
    r->last = client.pull(0, theta);
    if (r->proto.kind == pslab::WorkerProtocol::Kind::gradient) {
      r->acc = std::make_unique<pslab::GradAccumulator>(*r->cpu, cfg.train.accumulate, P);
    } else {
      r->every = r->proto.kind == pslab::WorkerProtocol::Kind::elastic ? cfg.cluster.sync_every : r->proto.local_steps;
      r->optimizer = std::make_unique<pslab::Optimizer>(*r->cpu, cfg.optimizer, P,
                                                        pslab::layer_sizes(pslab::model_spec(cfg), 0, P));
      r->schedule = pslab::schedule_for_run(cfg, c->steps_per_epoch);
      r->lr_batch = mode.update_batch(cfg.train.batch, cfg.cluster.workers);
      r->pulled.assign(theta, theta + P);
      r->change.resize(P);
    }
    if (info) *info = pslab_step_info{{}, 1, 0.0, 0.0, 0.0, -1.0};
    if (info) fill(&info->pull, r->last);
    c->rule = std::move(r);
  });
}

int pslab_client_train_step(pslab_client* c, long step, double loss, int samples, double compute_s, const float* grad,
                            float* theta, pslab_step_info* info) {
  return call(c, "step", [&](pslab::PsClient& client) {
    if (!c->rule) throw std::invalid_argument("step: pslab_client_begin first");
    if (!grad || !theta) throw std::invalid_argument("step: no gradient or no θ buffer");
    if (step < 0 || step >= c->total_steps)
      throw std::invalid_argument("step " + std::to_string(step) + " is not in [0, " + std::to_string(c->total_steps) +
                                  ") (this worker's steps)");
    if (samples < 0) throw std::invalid_argument("step: samples < 0");
    Rule& r = *c->rule;
    const pslab::ExperimentConfig& cfg = *c->cfg;
    const std::size_t P = client.num_params();
    const bool last = step == c->total_steps - 1;
    pslab::RunClock& clock = c->transport->clock();
    pslab::StepRecord rec;
    rec.loss = loss, rec.samples = samples, rec.compute_s = compute_s, rec.version = r.last.min_version;
    r.straggler->start_step(step);
    rec.delay_s = r.straggler->sleep_after(compute_s);
    bool exchanged = false;
    auto t1 = clock.now();  // (local rules: from the exchange on)
    if (r.proto.kind == pslab::WorkerProtocol::Kind::gradient) {
      // (the accumulator reads grad; with one batch per push it pushes grad itself)
      if (r.acc->add(const_cast<float*>(grad), double(samples), last)) {
        const pslab::PullResult answer = client.push(r.pushes++, int(r.acc->weight()), r.acc->host_mean(), last ? nullptr : theta);
        exchanged = true;
        if (!last) r.last = answer, rec.wait_s = answer.held_us * 1e-6;
      }
    } else {
      rec.lr = pslab::learning_rate(r.schedule, cfg.optimizer.lr, r.lr_batch, double(step) / double(c->steps_per_epoch));
      if (samples > 0) r.optimizer->step(theta, grad, rec.lr);  // an empty batch moves nothing
      r.samples_since_push += samples;
      if (last || (step + 1) % r.every == 0) {
        t1 = clock.now();
        if (r.proto.kind == pslab::WorkerProtocol::Kind::elastic) {
          r.last = client.pull(r.pushes, r.change.data());  // the centre
          pslab::elastic_exchange(theta, r.change.data(), P, float(r.proto.alpha), r.samples_since_push);
          client.push(r.pushes, r.samples_since_push, r.change.data(), nullptr);
          rec.wait_s = r.last.held_us * 1e-6;
        } else {
          for (std::size_t i = 0; i < P; ++i) r.change[i] = theta[i] - r.pulled[i];
          const pslab::PullResult answer = client.push(r.pushes, r.samples_since_push, r.change.data(), last ? nullptr : theta);
          if (!last) r.last = answer, rec.wait_s = answer.held_us * 1e-6, std::copy(theta, theta + P, r.pulled.begin());
        }
        ++r.pushes;
        r.samples_since_push = 0;
        exchanged = true;
      }
    }
    if (exchanged) rec.comm_s = pslab::seconds_between(t1, clock.now());
    if (c->log) {
      const long spe = c->steps_per_epoch;
      c->log->add(step, double(step + 1) / double(spe), rec, last || (step + 1) % spe == 0);
      if (last) c->metrics->flush();
    }
    if (info) {
      *info = pslab_step_info{{}, exchanged ? 1 : 0, rec.comm_s, rec.wait_s, rec.delay_s, rec.lr};
      fill(&info->pull, r.last);
    }
  });
}

int pslab_client_end(pslab_client* c) {
  return call(c, "end", [&](pslab::PsClient& client) {
    if (!c->rule) throw std::invalid_argument("end: pslab_client_begin first");
    client.bye(c->rule->pushes);
    if (c->metrics) c->metrics->flush();
  });
}

namespace {
// The evaluator's taker: each θ when due (ServerTicks) into c's queue, at the priority of the
// thread that made it (the evaluating thread may lower its own afterwards), until the last.
void start_taker(pslab_client* c, pslab::PsClient& client) {
  const pslab::ExperimentConfig& cfg = *c->cfg;
  c->ticks = std::make_unique<pslab::ServerTicks>(c->transport->clock(), client, cfg.eval.interval_s, cfg.eval.every_epochs,
                                                  double(pslab::train_set_size(cfg)));
  c->queue = std::make_unique<pslab::TakenQueue<pslab_client::Taken>>(client.num_params(),
                                                                      pslab::taken_queue_capacity(client.num_params()));
  c->taker = std::jthread([c](std::stop_token stop) {
    try {
      for (bool final = false; !final;) {
        auto item = c->queue->take_buffer(stop);
        if (!item) throw std::runtime_error("the evaluator stopped while its queue was full");
        item->info.r = c->ticks->next(item->theta.data(), stop);
        item->info.taken_s = c->metrics ? c->metrics->now() : 0.0;
        final = item->info.r.training_done;
        c->queue->put(std::move(item));
      }
    } catch (...) {
      c->queue->fail(std::current_exception());
    }
  });
}
}  // namespace

int pslab_client_next_theta(pslab_client* c, float* theta, pslab_pull_info* info) {
  return call(c, "next θ", [&](pslab::PsClient& client) {
    if (!c->evaluator()) throw std::invalid_argument("next θ: only the evaluator (rank -1) takes θ when due");
    if (!theta) throw std::invalid_argument("next θ: no θ buffer");
    if (!c->queue) start_taker(c, client);
    auto item = c->queue->next();  // (rethrows what stopped the taker, once the θs before are handed out)
    std::copy(item->theta.begin(), item->theta.end(), theta);
    c->current = item->info;
    c->has_current = true;
    c->queue->give_back(std::move(item));
    fill(info, c->current.r);
  });
}

int pslab_client_eval(pslab_client* c, double test_loss, double test_acc) {
  return call(c, "eval", [&]() {
    if (!c->has_current) throw std::invalid_argument("eval: no θ taken (pslab_client_next_theta first)");
    if (!c->metrics) throw std::invalid_argument("eval: no metrics (pslab_client_metrics first)");
    const pslab::PullResult& r = c->current.r;
    pslab::EvalLine line;
    line.step = r.min_clock, line.epoch = double(r.samples_applied) / double(pslab::train_set_size(*c->cfg));
    line.test_loss = test_loss, line.test_acc = test_acc, line.taken_s = c->current.taken_s;
    line.min_version = r.min_version, line.max_version = r.max_version, line.final = r.training_done;
    pslab::write_eval(*c->metrics, line, true);
    c->has_current = false;
  });
}

int pslab_client_shutdown(pslab_client* c) {
  return call(c, "shutdown", [c](pslab::PsClient& client) {
    c->stop_taker();  // (done after the last θ; else it stops waiting now)
    client.shutdown();
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
  c->stop_taker();  // (before the client it uses)
  c->log.reset();  // (before what it writes to)
  c->metrics.reset();
  c->client.reset();  // (before the transport it uses)
  c->transport.reset();
  delete c;
}

}  // extern "C"
