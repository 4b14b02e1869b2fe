// Helpers for tests that run servers and workers as threads in one process, over one
// transport object shared by every thread (any registered transport: "tcp", "ipc", or one a
// test registers).
#pragma once

#include <functional>

#include <atomic>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "comm/transport/transport.h"
#include "ps/client.h"
#include "roles.h"
#include "run/config.h"
#include "run/setup.h"
#include "server.h"

namespace pslab::test {

// A small synthetic problem (logistic, MLP 16-16-3, batch 8, 50 steps) with the given mode.
// `variant`: a transport name (cluster.overlap = false), or one with "_overlap" appended
// (cluster.overlap = true, and buckets of 1 KiB so that an all-reduce of the 323 floats goes in two).
inline ExperimentConfig small_config(const std::string& mode, int workers, int servers,
                                     const std::string& variant = "tcp") {
  const bool overlap = variant.find("_overlap") != std::string::npos, pieces = variant.ends_with("_pieces");
  const std::string transport = variant.substr(0, variant.find('_'));
  // _pieces: a wider MLP (1283 parameters) whose shards travel in pieces of 1 KiB (256 floats).
  return parse_config("name = \"test\"\n"
                      "[data]\nkind = \"logistic\"\ndim = 16\noutputs = 3\ntrain_samples = 512\ntest_samples = 64\n"
                      "[model]\nkind = \"mlp\"\nhidden = [" + std::string(pieces ? "64" : "16") + "]\n"
                      "[optimizer]\nkind = \"momentum\"\nlr = 0.1\n"
                      "[train]\nbatch = 8\nthreads = 1\nlog_every = 1000\nsteps = 50\n"
                      "[cluster]\nmode = \"" + mode + "\"\nworkers = " + std::to_string(workers) +
                          "\nservers = " + std::to_string(servers) + "\ntransport = \"" + transport +
                          "\"\ntimeout_s = 20\n" + (overlap ? "overlap = true\nbucket_kb = 1\n" : "overlap = false\n") +
                          "piece_kib = " + (pieces ? "1" : "0") + "\n",
                      "test");
}

// Servers of one run, each in its own thread, listening on addresses of the run's transport
// (cluster.transport), which the workers of the run share (run_ps_workers). With "auto" as over
// several hosts: each server listens on a socket and a TCP port, and worker r reaches server k
// through shared memory when r + k is even, over TCP otherwise (endpoints_for).
class Cluster {
 public:
  // wait_for_shutdown: after every worker's Bye, serve until a Shutdown (an evaluator's);
  // key: the servers admit only peers that prove it (their transport authenticates).
  // adjust: changes each server's options before it starts (e.g. checkpoint and resume paths).
  explicit Cluster(const ExperimentConfig& cfg, bool record_pulls = false, bool wait_for_shutdown = false,
                   const comm::RunKey* key = nullptr, const std::function<void(ServerOptions&)>& adjust = {})
      : transport(comm::make_transport(cfg.cluster.transport)) {
    if (key) transport->authenticate(*key);
    const bool mixed = cfg.cluster.transport == "auto";
    for (int k = 0; k < cfg.cluster.servers; ++k) {
      const std::string name = "server" + std::to_string(k);
      ServerOptions o;
      o.endpoint = transport->local_address(name);
      endpoints.push_back(o.endpoint);
      tcp_endpoints.push_back(mixed ? comm::make_transport("tcp")->local_address(name) : o.endpoint);
      if (mixed) o.endpoint += "+" + tcp_endpoints.back();
      o.shard = k;
      o.record_pulls = record_pulls;
      o.wait_for_shutdown = wait_for_shutdown;
      o.stop = &stop;
      if (adjust) adjust(o);
      servers.push_back(std::make_unique<Server>(*transport, cfg, o));
    }
    errors.resize(servers.size());
    for (std::size_t k = 0; k < servers.size(); ++k)
      threads.emplace_back([this, k] {
        try {
          servers[k]->run();
        } catch (...) {
          errors[k] = std::current_exception();
        }
      });
  }
  ~Cluster() {
    stop = true;
    join();
  }
  void join() {
    for (auto& t : threads)
      if (t.joinable()) t.join();
  }
  // θ assembled from the shards (after join()).
  std::vector<float> params() const {
    std::vector<float> theta;
    for (const auto& s : servers) theta.insert(theta.end(), s->state().current(), s->state().current() + s->range().length);
    return theta;
  }
  void rethrow() const {
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

  // What worker `rank` connects to (see the class comment).
  std::vector<std::string> endpoints_for(int rank) const {
    std::vector<std::string> e = endpoints;
    for (std::size_t k = 0; k < e.size(); ++k)
      if ((std::size_t(rank) + k) % 2) e[k] = tcp_endpoints[k];
    return e;
  }

  std::unique_ptr<comm::Transport> transport;  // declared first: destroyed after the servers
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::thread> threads;
  std::vector<std::string> endpoints;      // what a process beside the servers connects to
  std::vector<std::string> tcp_endpoints;  // auto: the servers' TCP ports (else = endpoints)
  std::vector<std::exception_ptr> errors;
};

// Runs fn(rank) on n threads; rethrows the first failure.
template <typename F>
void run_threads(int n, F fn) {
  std::vector<std::thread> ts;
  std::vector<std::exception_ptr> errs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errs[std::size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

// Runs the W workers of a PS-mode `cfg` as threads against `cluster`; metrics under `dir`.
inline void run_ps_workers(const ExperimentConfig& cfg, Cluster& cluster, const std::filesystem::path& dir) {
  run_threads(cfg.cluster.workers, [&](int r) {
    RoleOptions o;
    o.rank = r;
    o.servers = cluster.endpoints_for(r);
    o.out_dir = dir.string();
    o.progress = false;
    o.transport = cluster.transport.get();
    run_ps_worker(cfg, o);
  });
}

// Runs the W ranks of an all-reduce `cfg` as threads (the coordinator on the run's transport,
// Gloo over TCP loopback); returns every rank's final θ.
// adjust: changes each rank's options before it starts (e.g. checkpoint and resume).
inline std::vector<std::vector<float>> run_allreduce_workers(const ExperimentConfig& cfg,
                                                             const std::filesystem::path& dir,
                                                             const std::function<void(RoleOptions&)>& adjust = {}) {
  const auto transport = comm::make_transport(cfg.cluster.transport);
  const std::string coordinator = transport->local_address("coordinator");
  std::vector<std::vector<float>> theta(static_cast<std::size_t>(cfg.cluster.workers));
  run_threads(cfg.cluster.workers, [&](int r) {
    RoleOptions o;
    o.rank = r;
    o.coordinator = coordinator;
    o.out_dir = dir.string();
    o.progress = false;
    o.transport = transport.get();
    if (adjust) adjust(o);
    theta[std::size_t(r)] = run_allreduce_worker(cfg, o);
  });
  return theta;
}

// Starts the evaluator of a PS-mode `cfg` against `cluster` on a thread of its own (metrics
// under `dir`); `done`, if given, is set once it has returned.
inline std::thread start_evaluator(const ExperimentConfig& cfg, Cluster& cluster, const std::filesystem::path& dir,
                                   std::atomic<bool>* done = nullptr) {
  return std::thread([&cfg, &cluster, dir, done] {
    RoleOptions o;
    o.servers = cluster.endpoints;
    o.out_dir = dir.string();
    o.progress = false;
    o.transport = cluster.transport.get();
    run_evaluator(cfg, o);
    if (done) *done = true;
  });
}

inline std::filesystem::path temp_dir(const std::string& name) {
  static std::atomic<int> n{0};
  const auto d = std::filesystem::temp_directory_path() /
                 ("pslab_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
  std::filesystem::create_directories(d);
  return d;
}

// The transports every exactness test runs on.
inline const std::vector<std::string>& exact_transports() {
  static const std::vector<std::string> t = {"tcp", "ipc", "shm"};
  return t;
}

// ... and each also with overlap on (small_config's variants), in pieces
// (cluster.piece_kib), both, and on auto as over several hosts: shared memory with some servers,
// TCP with others (Cluster). Without _pieces, shards travel whole.
inline const std::vector<std::string>& exact_variants() {
  static const std::vector<std::string> t = {"tcp", "ipc", "shm", "tcp_overlap", "ipc_overlap", "shm_overlap", "auto",
                                             "tcp_pieces", "ipc_pieces", "shm_pieces", "auto_pieces",
                                             "tcp_overlap_pieces", "shm_overlap_pieces"};
  return t;
}

// A push as a worker of `cfg` sends it: whole, or with cluster.overlap in pieces as backward
// finishes them (the tail first, `piece` floats at a time).
inline PullResult push(const ExperimentConfig& cfg, PsClient& c, long clock, int batch, const float* grad, float* theta,
                       std::size_t piece = 7) {
  if (!cfg.cluster.overlap.is_on()) return c.push(clock, batch, grad, theta);
  c.begin_push(clock, batch, grad, theta);
  for (std::size_t lo = c.num_params(); lo > 0;) {
    lo = lo > piece ? lo - piece : 0;
    c.push_ready(lo);
  }
  return c.finish_push();
}

// A run of `cfg` (its servers as threads) and the clients of its workers 0 and 1, connected:
// both say Hello at once (the start barrier: each server answers when both have). `hung`:
// worker 1 sends no heartbeats, as a process that hangs (SIGSTOP) sends nothing. P: the
// model's parameter count. A test takes its parts by name: auto& [cluster, P, w0, w1] = run.
struct TwoWorkerRun {
  explicit TwoWorkerRun(const ExperimentConfig& cfg, bool hung = false) : cluster(cfg), P(count_params(model_spec(cfg))) {
    PsClient::Options second = client_options(cfg, wire::Role::worker, 1);
    if (hung) second.heartbeat_s = 0;
    w0 = std::make_unique<PsClient>(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
    w1 = std::make_unique<PsClient>(*cluster.transport, cluster.endpoints, second);
    std::thread t([&] { w1->connect(); });
    w0->connect();
    t.join();
  }
  Cluster cluster;
  const std::size_t P;
  std::unique_ptr<PsClient> w0, w1;
};

}  // namespace pslab::test
