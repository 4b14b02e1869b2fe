// Parameter-server transfer benchmark: 1 server process x 1 worker on one host (TCP loopback,
// Unix sockets with --transport ipc, shared memory with --transport shm), one tensor, one
// request at a time. Writes JSON.
//
//   bench_ps [--runs 5] [--json FILE] [--sizes-kib 4,256,4096,16384] [--transport tcp|ipc|shm]
//            [--server-threads N (0: as the launcher would)] [--piece-kib K] [--pieces] [--auth] [--heartbeat-cost] [--guard-cost]
//            [--floor [--floor-pieces 8]] [--netns CLIENT,SERVER --server-ip IP] [--device cuda]
//
// With --netns the server runs in network namespace SERVER and the worker in CLIENT (tcp only),
// the server listening at IP: two hosts joined by a link, as tests/multihost/bench_two_hosts.sh
// makes them (the TCP path through a veth pair, not loopback).
//
// Metrics, per tensor size (median over runs; each run = many iterations after a warm-up):
//   push_pull   one Push with then_pull answered by the new parameters (what a worker does
//               every step): round-trip time, and GB/s = (bytes pushed + bytes pulled) / time
//   push_then_pull  a Push answered by an ack, then a Pull: two round trips
//               (pslab runs with cluster.piece_kib = --piece-kib, the config's default unless given)
//   pslab_whole with --pieces: push_pull again with whole shards (cluster.piece_kib = 0), and
//               pieces_gain = its time / push_pull's
//   raw_zmq     a bare ZeroMQ DEALER/ROUTER echo of the same bytes over the same kind of
//               socket (tcp; ipc for ipc and shm), zero-copy both ways, no pslab code
//   raw_zmq_tcp the same over TCP loopback (ipc and shm: what they are measured against)
//   floor       with --floor: raw_zmq plus the memory passes pslab cannot skip (the worker's
//               checksum and copy into θ, the server's checked SGD and version checksum), and
//               floor_pipelined the same in --floor-pieces messages each way, the server applying
//               each as it arrives (RawEcho says more); floor_over_pslab = floor's time / pslab's;
//               beside: pslab, floor_pipelined and raw_zmq again, connected at once and timed run
//               by run in turn, floor_over_pslab and raw_over_pslab per run and their medians
//               (what a drifting machine cannot bias: the figures the TCP targets are read from)
//   apply       the server's update alone (SGD on the shard, in process, checksums of the
//               gradient and the new version included): GB/s of gradient applied, against
//               memcpy of the same bytes
//   pslab_auth  with --auth: push_pull again with the peers authenticated (the run's key:
//               CURVE over tcp, every message encrypted), and auth_cost = its time / push_pull's
//   pslab_no_heartbeat  with --heartbeat-cost: push_pull with the worker's heartbeats off
//               (cluster.heartbeat_s's thread and sliced waits; on in pslab, as runs do), timed
//               run by run in turn with a second pslab that has them on, both connected at once;
//               heartbeat_cost = that one's time / this one's, the median of the runs' ratios
//   pslab_no_guard  with --guard-cost: the same with the servers' push guard off
//               (cluster.push_guard; on in runs), and guard_cost
//   pslab_cuda  with --device cuda: push+pull as a GPU worker makes it, ∇θ starting and θ ending
//               in GPU memory (GpuSide), and over_copies = its time / one device-to-host plus one
//               host-to-device copy of the tensor (d2h_h2d_us)
// The server applies SGD (asp) to every push, and both sides checksum every payload.
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <random>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include <zmq.hpp>

#include "comm/run_key.h"
#include "run/config.h"
#include "ps/shard_state.h"
#include "ps/client.h"
#include "server.h"
#include "run/setup.h"
#include "grad_stager.h"
#include "backend.h"

using namespace pslab;
using Clock = std::chrono::steady_clock;

namespace {

// A config whose model has exactly `floats` parameters: linear (dim -> 4), 4 * (dim + 1).
ExperimentConfig config_for(std::size_t floats) {
  ExperimentConfig c = parse_config("name = \"bench\"\n", "bench");
  c.data.kind = "logistic";
  c.data.outputs = 4;
  c.data.dim = int(floats / 4 - 1);
  c.model.kind = "linear";
  c.model.init = "zeros";
  c.cluster.mode = "asp";
  c.cluster.workers = 1;
  c.cluster.servers = 1;
  c.optimizer.lr = 1e-9;
  return c;
}


// Where the benchmark's two processes run: this host over loopback, or two network namespaces.
struct Place {
  std::string client_ns, server_ns, server_ip;
  bool remote() const { return !server_ns.empty(); }
};

// This process (and the threads it starts from now on) into network namespace `ns` ("": stays).
void enter_netns(const std::string& ns) {
  if (ns.empty()) return;
  const std::string path = "/var/run/netns/" + ns;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0)
    throw std::runtime_error("cannot enter network namespace " + ns + " (" + path + "): " + std::strerror(errno));
  ::close(fd);
}

// Where a server of the benchmark listens: a free local address, or a port at the server's IP
// in its namespace (which runs nothing else).
std::string server_endpoint(comm::Transport& t, const std::string& name, const Place& place) {
  if (!place.remote()) return t.local_address(name);
  return "tcp://" + place.server_ip + ":" + std::to_string(20000 + std::random_device{}() % 40000);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

long warmup_for(long iters) { return std::max(10L, iters / 10); }

std::vector<double> in_us(std::vector<double> seconds) {
  for (double& s : seconds) s *= 1e6;
  return seconds;
}

template <typename F>
std::vector<double> time_runs(int runs, long iters, F fn, bool warm_up = true) {
  for (long i = 0; warm_up && i < warmup_for(iters); ++i) fn();
  std::vector<double> per_iter;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = Clock::now();
    for (long i = 0; i < iters; ++i) fn();
    per_iter.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / double(iters));
  }
  return per_iter;
}

long iterations_for(std::size_t bytes) { return std::clamp<long>(long((256u << 20) / bytes), 20, 3000); }

// Each side timed run by run in turn (a, b, ..., a, b, ...), `iters` requests a run after a
// warm-up of each: a drift of the machine's speed moves the figures of a round alike. Returns
// µs per request, [side][run].
std::vector<std::vector<double>> in_turn(int runs, long iters, const std::vector<std::function<void()>>& sides) {
  for (long i = 0; i < warmup_for(iters); ++i)
    for (const auto& once : sides) once();
  std::vector<std::vector<double>> us(sides.size());
  for (int r = 0; r < runs; ++r)
    for (std::size_t k = 0; k < sides.size(); ++k) us[k].push_back(time_runs(1, iters, sides[k], false)[0] * 1e6);
  return us;
}

// a[r] / b[r] for every run r.
std::vector<double> ratios(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> q;
  for (std::size_t r = 0; r < a.size(); ++r) q.push_back(a[r] / b[r]);
  return q;
}

// A GPU worker's side of push+pull (--device cuda): ∇θ starts in GPU memory and θ must end
// there. Each request goes as a GPU worker's step does with overlap: ∇θ reported final tail by
// tail (as backward reports it, kGradPieceFloats at a time) and downloaded on the copy engine
// (GradStager) into the transport's registered memory, shards pushed as they land, θ's reply
// pieces uploaded as they arrive, then the device waits for them.
struct GpuSide {
  std::unique_ptr<Backend> be = make_cuda_backend(0);
  std::size_t P;
  float* grad_host;  // the transport's memory, registered
  bool registered;
  DeviceBuffer<float> grad_dev, theta_dev;
  HostBuffer<float> theta_host;
  struct Push final : GradListener {
    PsClient& client;
    explicit Push(PsClient& c) : client(c) {}
    void ready(std::size_t lo) override { client.push_ready(lo); }
  } push;
  GradStager stager;
  GpuSide(PsClient& client, std::size_t n, float* host)
      : P(n), grad_host(host), registered(be->register_host(host, n * sizeof(float))), grad_dev(*be, n), theta_dev(*be, n),
        theta_host(*be, n), push(client), stager(*be, grad_dev.data(), host, n, std::size_t(1) << 18, push) {
    be->copy_from_host(grad_dev.data(), host, n * sizeof(float));
    client.on_params([this](std::size_t lo, std::size_t k) {
      be->upload_async(theta_dev.data() + lo, theta_host.data() + lo, k * sizeof(float));
    });
  }
  ~GpuSide() {
    be->synchronize();
    if (registered) be->unregister_host(grad_host);
  }
  void push_pull(PsClient& client, long clock) {
    client.begin_push(clock, 1, grad_host, theta_host.data());
    stager.start();
    for (std::size_t lo = P; lo > 0;) {
      lo = lo > kGradPieceFloats ? lo - kGradPieceFloats : 0;
      stager.ready(lo);
    }
    client.finish_push();
    be->upload_fence();
    be->synchronize();
  }
  // The reference: one copy of ∇θ to the host and one of θ back.
  void copies() {
    be->copy_to_host(grad_host, grad_dev.data(), P * sizeof(float));
    be->copy_from_host(theta_dev.data(), theta_host.data(), P * sizeof(float));
  }
};

// push+pull as a GPU worker makes it (GpuSide), against the copies alone. clock: the client's
// next, advanced.
nlohmann::ordered_json bench_gpu_side(PsClient& client, std::size_t P, float* grad, int runs, long iters, long& clock) {
  GpuSide gpu(client, P, grad);
  const auto fused = time_runs(runs, iters, [&] { gpu.push_pull(client, clock++); });
  const auto copies = time_runs(runs, iters, [&] { gpu.copies(); });
  client.on_params({});
  return {{"push_pull_us", median(fused) * 1e6},
          {"d2h_h2d_us", median(copies) * 1e6},
          {"over_copies", median(fused) / median(copies)},
          {"registered", gpu.registered},
          {"copies_per_push", gpu.stager.copies()},
          {"device", gpu.be->describe()},
          {"push_pull_us_runs", in_us(fused)}};
}

// Waits up to `seconds` for a benchmark's server process to end, then kills it: none outlives
// the benchmark, also when it fails half-way.
void reap(pid_t pid, double seconds) {
  for (int i = 0; i < int(seconds * 100) && ::waitpid(pid, nullptr, WNOHANG) == 0; ++i) ::usleep(10000);
  if (::waitpid(pid, nullptr, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
}

// What a pslab measurement runs with (bench_pslab's variants).
struct PslabSetup {
  int server_threads = 1, piece_kib = -1;
  const comm::RunKey* key = nullptr;  // peers authenticated with it
  bool heartbeats = true, guard = true;
  std::string codec = "f32";
};

// pslab's two ends: a server process (forked) and this process's worker, connected; once() is
// one push+pull as a worker makes it every step. Ends with a Bye and the server reaped (killed
// if it does not end).
class PslabPair {
 public:
  PslabPair(const Place& place, std::size_t floats, const std::string& transport_name, const PslabSetup& s)
      : cfg_(config_for(floats)), transport_(comm::make_transport(transport_name)) {  // its context starts after the fork
    cfg_.cluster.push_guard = s.guard;
    if (s.piece_kib >= 0) cfg_.cluster.piece_kib = s.piece_kib;
    cfg_.cluster.transport = transport_name;
    cfg_.cluster.codec = s.codec;  // pushes encoded (the bytes below still count f32's, for the ratio)
    cfg_.cluster.server_threads = s.server_threads;
    const std::string ep = server_endpoint(*transport_, "bench-server", place);
    server_ = ::fork();
    if (server_ == 0) serve(place, ep, transport_name, s.key);
    P_ = count_params(model_spec(cfg_));
    if (s.key) transport_->authenticate(*s.key);
    PsClient::Options co = client_options(cfg_, wire::Role::worker, 0);
    if (!s.heartbeats) co.heartbeat_s = 0;
    client_ = std::make_unique<PsClient>(*transport_, std::vector<std::string>{ep}, co);
    client_->connect();
    // The gradient where a PS worker keeps it: in the transport's payload memory (shm: pushed
    // by reference, no copy).
    grad_memory_ = transport_->payload_memory(P_ * sizeof(float));
    grad_ = static_cast<float*>(grad_memory_->data());
    std::fill(grad_, grad_ + P_, 1e-3f);
    theta_.resize(P_);
    client_->pull(0, theta_.data());
  }
  ~PslabPair() {
    try {
      if (client_) client_->bye(clock_);
    } catch (const std::exception&) {
    }
    client_.reset();
    reap(server_, 2.0);  // (it ends at the Bye)
  }
  void once() { client_->push(clock_++, 1, grad_, theta_.data()); }
  void push_then_pull() {
    client_->push(clock_++, 1, grad_, nullptr);
    client_->pull(clock_, theta_.data());
  }
  PsClient& client() { return *client_; }
  const std::vector<float>& theta() const { return theta_; }
  long& clock() { return clock_; }
  float* grad() { return grad_; }
  std::size_t params() const { return P_; }

 private:
  [[noreturn]] void serve(const Place& place, const std::string& ep, const std::string& transport_name, const comm::RunKey* key) {
    try {
      {  // destructors close the socket, letting the last Ack leave before _exit
        enter_netns(place.server_ns);
        set_cpu_backend_threads(1);  // as pslab_server does
        const auto server_transport = comm::make_transport(transport_name);
        if (key) server_transport->authenticate(*key);
        ServerOptions o;
        o.endpoint = ep;
        Server server(*server_transport, cfg_, o);
        server.run();
      }
      _exit(0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench server: %s\n", e.what());
      _exit(1);
    }
  }

  ExperimentConfig cfg_;
  std::unique_ptr<comm::Transport> transport_;
  pid_t server_ = -1;
  std::size_t P_ = 0;
  std::unique_ptr<PsClient> client_;
  std::unique_ptr<comm::PayloadMemory> grad_memory_;
  float* grad_ = nullptr;
  std::vector<float> theta_;
  long clock_ = 0;
};

nlohmann::ordered_json bench_pslab(const Place& place, std::size_t floats, int runs, const std::string& transport_name,
                                   const PslabSetup& setup, bool cuda = false) {
  PslabPair pair(place, floats, transport_name, setup);
  const std::size_t P = pair.params();
  const long iters = iterations_for(P * 4);
  if (cuda) return bench_gpu_side(pair.client(), P, pair.grad(), runs, iters, pair.clock());
  const auto fused = time_runs(runs, iters, [&] { pair.once(); });
  const auto split = time_runs(runs, std::max(10L, iters / 2), [&] { pair.push_then_pull(); });
  const std::vector<float> before = pair.theta();  // (the work was done: one more push moves θ that comes back)
  pair.once();
  if (pair.theta() == before) throw std::runtime_error("bench_ps: the server's θ came back unchanged by a push");
  const double bytes = 2.0 * double(P) * 4;  // pushed + pulled
  return {{"push_pull_us", median(fused) * 1e6},
          {"push_pull_GBps", bytes / median(fused) / 1e9},
          {"push_then_pull_us", median(split) * 1e6},
          {"push_then_pull_GBps", bytes / median(split) / 1e9},
          {"push_pull_us_runs", in_us(fused)}};
}

// A bare ZeroMQ echo over the same kind of socket: DEALER sends n bytes zero-copy, ROUTER
// (another process) sends the same bytes back zero-copy.
//
// With `passes`, the echo also makes the memory passes pslab's protocol cannot do without, and
// nothing else (no headers, no validation, no rules): the worker checksums its gradient before
// sending and copies the reply into its θ with a checksum; the server checks the gradient,
// applies SGD and checksums the new version (ShardState's fused pass), and replies with that
// version zero-copy. It is the floor a push+pull can reach on this machine. With `pieces` > 1
// the tensor travels as that many messages each way, the server applying each piece as it
// arrives and replying with it at once: the pipeline a chunked protocol could build, to see
// whether its work would hide behind the transfer here. The server answers `total` requests,
// then ends; once() is one request.
class RawEcho {
 public:
  RawEcho(const Place& place, std::size_t bytes, const std::string& transport_name, bool passes, int pieces, long total)
      : passes_(passes), pieces_(pieces), floats_(bytes / sizeof(float)), per_(floats_ / std::size_t(pieces)),
        address_of_(comm::make_transport(transport_name)) {
    const std::string ep = server_endpoint(*address_of_, "bench-raw", place);
    server_ = ::fork();
    if (server_ == 0) serve(place, ep, total);
    socket_.set(zmq::sockopt::rcvtimeo, 30000);
    socket_.connect(ep);
    grad_.assign(floats_, 1e-3f);
    theta_.resize(floats_);
  }
  ~RawEcho() {
    socket_.close();
    reap(server_, 5.0);  // (it ends after its last reply)
  }
  void once() {
    for (int p = 0; p < pieces_; ++p) {
      const float* g = grad_.data() + std::size_t(p) * per_;
      if (passes_) sink_ = sink_ + wire::checksum(g, per_);
      socket_.send(zmq::message_t(const_cast<float*>(g), per_ * 4, nullptr, nullptr), zmq::send_flags::none);
    }
    for (int p = 0; p < pieces_; ++p) {
      zmq::message_t in;
      if (!socket_.recv(in))
        throw std::runtime_error("raw echo: no reply in 30 s from its server process (pid " + std::to_string(server_) + ")");
      if (passes_)
        sink_ = sink_ + wire::copy_with_checksum(theta_.data() + std::size_t(p) * per_, static_cast<const float*>(in.data()), per_);
    }
  }

 private:
  [[noreturn]] void serve(const Place& place, const std::string& ep, long total) {
    enter_netns(place.server_ns);  // before its ZeroMQ context: the I/O thread starts there
    {
      // The replies' memory first: it outlives the socket, which closes once every reply left.
      std::vector<char> reply(floats_ * sizeof(float), 1);
      auto cpu = make_cpu_backend(1);
      std::vector<std::unique_ptr<ShardState>> states;  // one per piece
      if (passes_) {
        for (int p = 0; p < pieces_; ++p) {
          ShardState::Options o;
          o.range = {std::size_t(p) * per_, per_};
          o.optimizer.lr = 1e-9;
          states.push_back(std::make_unique<ShardState>(*cpu, o, std::vector<float>(per_, 0.0f)));
        }
      }
      zmq::context_t ctx(1);
      zmq::socket_t s(ctx, zmq::socket_type::router);
      s.bind(ep);
      for (long i = 0; i < total; ++i) {
        for (int p = 0; p < pieces_; ++p) {
          zmq::message_t id, body;
          (void)s.recv(id);
          (void)s.recv(body);
          s.send(id, zmq::send_flags::sndmore);
          if (passes_) {
            ShardState& st = *states[std::size_t(p)];
            const std::span<const std::byte> g(static_cast<const std::byte*>(body.data()), body.size());
            st.push(0, i, st.version(), 1, g, wire::checksum_bytes(g.data(), g.size()));  // verified again inside
            ParamVersions::Buffer* b = st.params().acquire_current();
            s.send(zmq::message_t(b->data, per_ * sizeof(float),
                                  [](void*, void* hint) { ParamVersions::release(static_cast<ParamVersions::Buffer*>(hint)); }, b),
                   zmq::send_flags::none);
          } else {
            s.send(zmq::message_t(reply.data() + std::size_t(p) * per_ * 4, per_ * 4, nullptr, nullptr), zmq::send_flags::none);
          }
        }
      }
    }  // the socket closes with every reply sent
    _exit(0);
  }

  bool passes_;
  int pieces_;
  std::size_t floats_, per_;
  std::unique_ptr<comm::Transport> address_of_;  // (an ipc address's private directory lives as long as it)
  pid_t server_ = -1;
  zmq::context_t ctx_{1};
  zmq::socket_t socket_{ctx_, zmq::socket_type::dealer};
  std::vector<float> grad_, theta_;
  volatile std::uint64_t sink_ = 0;
};

// What a setting costs: pslab with it (`with`) and without (`without`), both connected at once,
// timed run by run in turn; cost = with's time / without's, per run and its median.
nlohmann::ordered_json bench_cost(const Place& place, std::size_t floats, int runs, const std::string& transport_name,
                                  const PslabSetup& with, const PslabSetup& without) {
  PslabPair a(place, floats, transport_name, with), b(place, floats, transport_name, without);
  const auto us = in_turn(runs, iterations_for(floats * 4), {[&] { a.once(); }, [&] { b.once(); }});
  const auto cost = ratios(us[0], us[1]);
  return {{"with_us", median(us[0])}, {"without_us", median(us[1])}, {"cost", median(cost)}, {"cost_runs", cost},
          {"with_us_runs", us[0]}, {"without_us_runs", us[1]}};
}

// Requests a timed measurement of `runs` runs of `iters` makes, its warm-up included.
long requests_for(int runs, long iters) { return warmup_for(iters) + long(runs) * iters; }

nlohmann::ordered_json bench_raw(const Place& place, std::size_t bytes, int runs, const std::string& transport_name,
                                 bool passes = false, int pieces = 1) {
  const long iters = iterations_for(bytes / 2);
  RawEcho echo(place, bytes, transport_name, passes, pieces, requests_for(runs, iters));
  const auto rt = time_runs(runs, iters, [&] { echo.once(); });
  return {{"round_trip_us", median(rt) * 1e6}, {"GBps", 2.0 * double(bytes) / median(rt) / 1e9}};
}

// pslab's push+pull, the pipelined floor and the raw echo run by run in turn (in_turn), all
// three connected throughout.
nlohmann::ordered_json bench_beside(const Place& place, std::size_t floats, int runs, const std::string& transport_name,
                                    const PslabSetup& setup, int pieces) {
  const long iters = iterations_for(floats * 4);
  RawEcho floor(place, floats * 4, transport_name, true, pieces, requests_for(runs, iters));
  RawEcho raw(place, floats * 4, transport_name, false, 1, requests_for(runs, iters));
  PslabPair pair(place, floats, transport_name, setup);  // (forked after the echoes' contexts: its child never uses them)
  const auto us = in_turn(runs, iters, {[&] { pair.once(); }, [&] { floor.once(); }, [&] { raw.once(); }});
  const auto floor_ratio = ratios(us[1], us[0]), raw_ratio = ratios(us[2], us[0]);
  return {{"pslab_us", median(us[0])}, {"floor_pipelined_us", median(us[1])}, {"raw_us", median(us[2])},
          {"pieces", pieces}, {"floor_over_pslab", median(floor_ratio)}, {"raw_over_pslab", median(raw_ratio)},
          {"floor_over_pslab_runs", floor_ratio}, {"raw_over_pslab_runs", raw_ratio},
          {"pslab_us_runs", us[0]}, {"floor_pipelined_us_runs", us[1]}, {"raw_us_runs", us[2]}};
}

nlohmann::ordered_json bench_apply(std::size_t floats, int runs) {
  auto cpu = make_cpu_backend(1);
  ShardState::Options o;
  o.mode = "asp";
  o.range = {0, floats};
  o.optimizer.lr = 1e-9;
  ShardState s(*cpu, o, std::vector<float>(floats, 0.0f));
  std::vector<float> g(floats, 1e-3f), a(floats, 1.0f), b(floats);
  long clock = 0;
  const long iters = iterations_for(floats * 4);
  const std::uint64_t gsum = wire::checksum(g.data(), floats);
  const std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(g.data()), floats * sizeof(float));
  const auto apply = time_runs(runs, iters, [&] { s.push(0, clock, clock, 1, payload, gsum), ++clock; });
  const auto copy = time_runs(runs, iters, [&] { std::memcpy(b.data(), a.data(), floats * 4), std::swap(a, b); });
  return {{"apply_GBps", double(floats) * 4 / median(apply) / 1e9},
          {"memcpy_GBps", double(floats) * 4 / median(copy) / 1e9}};
}

// What to measure (the command line).
struct Options {
  int runs = 5;
  std::string json_path;
  std::vector<int> sizes_kib = {4, 256, 4096, 16384};
  std::string transport = "tcp";
  int server_threads = 0;  // 0: as the launcher sets it for this host (server_threads_as_launched)
  bool auth = false, heartbeat_cost = false, guard_cost = false, floor = false, pieces = false;
  std::vector<std::string> codecs;
  int floor_pieces = 8;
  int piece_kib = -1;  // -1: the config's default
  std::string device = "cpu";  // cuda: also push+pull with ∇θ starting and θ ending in GPU memory
  std::vector<std::string> netns;  // --netns CLIENT,SERVER
  Place place;
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--runs", o.runs, "timed runs per measurement (median reported)")->capture_default_str();
  app.add_option("--json", o.json_path, "write results here");
  app.add_option("--sizes-kib", o.sizes_kib, "tensor sizes in KiB")->delimiter(',')->capture_default_str();
  app.add_option("--server-threads", o.server_threads,
                 "threads the server splits an update over (cluster.server_threads; 0: as the launcher sets it for a server "
                 "beside one worker on this host: its cores / 2, with --device cuda the cores the GPU worker leaves)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--transport", o.transport, "tcp (loopback), ipc (Unix sockets) or shm (shared memory)")->capture_default_str();
  app.add_option("--piece-kib", o.piece_kib, "cluster.piece_kib for pslab (default: the config's)");
  app.add_flag("--pieces", o.pieces, "also measure push+pull with whole shards (cluster.piece_kib = 0), same invocation");
  app.add_option("--netns", o.netns, "CLIENT,SERVER: run the worker in network namespace CLIENT and the server in "
                                     "SERVER (tcp; with --server-ip)")->delimiter(',')->expected(2);
  app.add_option("--server-ip", o.place.server_ip, "with --netns: the server's address in its namespace");
  app.add_flag("--auth", o.auth, "also measure push+pull with the peers authenticated (CURVE on tcp), same invocation");
  app.add_flag("--heartbeat-cost", o.heartbeat_cost, "also measure push+pull with the worker's heartbeats off, same invocation");
  app.add_flag("--guard-cost", o.guard_cost, "also measure push+pull with the servers' push guard off (cluster.push_guard), same invocation");
  app.add_option("--codecs", o.codecs, "also measure push+pull with pushes in these codecs (e.g. f16,bf16), same invocation; "
                                       "gain = f32's time / the codec's")->delimiter(',');
  app.add_flag("--floor", o.floor, "also measure the floor: the raw echo plus the memory passes pslab cannot skip (checksums, "
                                   "SGD, the copy into θ), whole and in --floor-pieces pieces (pipelined), same invocation");
  app.add_option("--floor-pieces", o.floor_pieces, "pieces of the pipelined floor")->capture_default_str();
  app.add_option("--device", o.device, "cuda: also push+pull as a GPU worker does (∇θ from GPU memory, θ back to it), "
                                       "against one device-to-host plus one host-to-device copy of the tensor")
      ->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
}

PslabSetup setup_of(const Options& o) {
  PslabSetup s;
  s.server_threads = o.server_threads;
  s.piece_kib = o.piece_kib;
  return s;
}

// The floor beside pslab's push+pull (--floor).
void add_floor(nlohmann::ordered_json& r, int kib, std::size_t floats, const Options& o) {
  const double us = r["pslab"]["push_pull_us"].get<double>();
  r["floor"] = bench_raw(o.place, floats * 4, o.runs, o.transport, true, 1);
  r["floor_pipelined"] = bench_raw(o.place, floats * 4, o.runs, o.transport, true, o.floor_pieces);
  r["floor_pipelined"]["pieces"] = o.floor_pieces;
  const double f1 = r["floor"]["round_trip_us"].get<double>(), fp = r["floor_pipelined"]["round_trip_us"].get<double>();
  r["floor_over_pslab"] = f1 / us;
  std::fprintf(stderr, "%6d KiB: floor (raw echo + checksums, SGD, copy) %8.1f us = %.2fx raw's speed; in %d pieces "
               "%8.1f us = %.2fx raw's; pslab at %.2fx the floor's speed\n", kib, f1,
               r["raw_zmq"]["round_trip_us"].get<double>() / f1, o.floor_pieces, fp,
               r["raw_zmq"]["round_trip_us"].get<double>() / fp, f1 / us);
  if (o.device == "cuda") return;
  const auto& b = r["beside"] = bench_beside(o.place, floats, o.runs, o.transport, setup_of(o), o.floor_pieces);
  const auto per = b["floor_over_pslab_runs"].get<std::vector<double>>(), raw = b["raw_over_pslab_runs"].get<std::vector<double>>();
  std::fprintf(stderr, "%6d KiB: run by run, in turn: pslab %8.1f us, pipelined floor %8.1f us, raw echo %8.1f us (medians of %d); "
               "pslab at %.2fx the floor's speed (per run %.2f-%.2f), %.2fx raw's (%.2f-%.2f)\n", kib, b["pslab_us"].get<double>(),
               b["floor_pipelined_us"].get<double>(), b["raw_us"].get<double>(), o.runs, b["floor_over_pslab"].get<double>(),
               *std::min_element(per.begin(), per.end()), *std::max_element(per.begin(), per.end()), b["raw_over_pslab"].get<double>(),
               *std::min_element(raw.begin(), raw.end()), *std::max_element(raw.begin(), raw.end()));
}

// pslab's push+pull beside the variants asked for (authenticated, without heartbeats, codecs).
void add_variants(nlohmann::ordered_json& r, int kib, std::size_t floats, const Options& o, const comm::RunKey& key) {
  const double us = r["pslab"]["push_pull_us"].get<double>();
  if (o.auth) {
    PslabSetup s = setup_of(o);
    s.key = &key;
    r["pslab_auth"] = bench_pslab(o.place, floats, o.runs, o.transport, s);
    r["auth_cost"] = r["pslab_auth"]["push_pull_us"].get<double>() / us;
    std::fprintf(stderr, "%6d KiB: authenticated push+pull %8.1f us: %.2fx the time without\n", kib,
                 r["pslab_auth"]["push_pull_us"].get<double>(), r["auth_cost"].get<double>());
  }
  auto cost_of = [&](const char* name, const char* what, auto turn_off) {
    PslabSetup without = setup_of(o);
    turn_off(without);
    const auto c = bench_cost(o.place, floats, o.runs, o.transport, setup_of(o), without);
    r[std::string("pslab_no_") + name] = {{"push_pull_us", c["without_us"]}, {"push_pull_us_runs", c["without_us_runs"]}};
    r[std::string(name) + "_cost"] = c["cost"];
    r[std::string(name) + "_cost_runs"] = c["cost_runs"];
    const auto per = c["cost_runs"].get<std::vector<double>>();
    std::fprintf(stderr, "%6d KiB: push+pull with and without %s, run by run in turn: %8.1f / %8.1f us (medians of %d): "
                 "it costs %.3fx (per run %.3f-%.3f)\n", kib, what, c["with_us"].get<double>(), c["without_us"].get<double>(),
                 o.runs, c["cost"].get<double>(), *std::min_element(per.begin(), per.end()), *std::max_element(per.begin(), per.end()));
  };
  if (o.heartbeat_cost) cost_of("heartbeat", "the worker's heartbeats", [](PslabSetup& s) { s.heartbeats = false; });
  if (o.guard_cost) cost_of("guard", "the push guard", [](PslabSetup& s) { s.guard = false; });
  for (const std::string& codec : o.codecs) {
    PslabSetup s = setup_of(o);
    s.codec = codec;
    auto c = bench_pslab(o.place, floats, o.runs, o.transport, s);
    c["gain_over_f32"] = us / c["push_pull_us"].get<double>();
    std::fprintf(stderr, "%6d KiB: push+pull with %s pushes %8.1f us: %.2fx f32's speed\n", kib, codec.c_str(),
                 c["push_pull_us"].get<double>(), c["gain_over_f32"].get<double>());
    r["pslab_" + codec] = c;
  }
}

nlohmann::ordered_json measure(int kib, const Options& o, const comm::RunKey& key) {
  const std::size_t floats = std::size_t(kib) * 1024 / 4;
  nlohmann::ordered_json r{{"size_kib", kib}, {"floats", floats}};
  r["pslab"] = bench_pslab(o.place, floats, o.runs, o.transport, setup_of(o));
  r["piece_kib"] = o.piece_kib >= 0 ? o.piece_kib : config_for(floats).cluster.piece_kib;
  if (o.pieces) {
    PslabSetup whole = setup_of(o);
    whole.piece_kib = 0;
    r["pslab_whole"] = bench_pslab(o.place, floats, o.runs, o.transport, whole);
    r["pieces_gain"] = r["pslab_whole"]["push_pull_us"].get<double>() / r["pslab"]["push_pull_us"].get<double>();
    std::fprintf(stderr, "%6d KiB: push+pull with whole shards %8.1f us: pieces of %d KiB are %.2fx faster\n", kib,
                 r["pslab_whole"]["push_pull_us"].get<double>(), r["piece_kib"].get<int>(), r["pieces_gain"].get<double>());
  }
  if (o.device == "cuda") {
    r["pslab_cuda"] = bench_pslab(o.place, floats, o.runs, o.transport, setup_of(o), true);
    const auto& g = r["pslab_cuda"];
    std::fprintf(stderr, "%6d KiB: push+pull from and to GPU memory %8.1f us = %.2fx one D2H + one H2D copy (%8.1f us; "
                 "%s memory%s)\n", kib, g["push_pull_us"].get<double>(), g["over_copies"].get<double>(),
                 g["d2h_h2d_us"].get<double>(), o.transport.c_str(), g["registered"].get<bool>() ? " registered" : " NOT registered");
  }
  r["raw_zmq"] = bench_raw(o.place, floats * 4, o.runs, o.transport);
  r["raw_zmq_tcp"] = o.transport == "tcp" ? r["raw_zmq"] : bench_raw(o.place, floats * 4, o.runs, "tcp");
  r["server_apply"] = bench_apply(floats, o.runs);
  if (o.floor) add_floor(r, kib, floats, o);
  add_variants(r, kib, floats, o, key);
  const double us = r["pslab"]["push_pull_us"].get<double>(), tcp_us = r["raw_zmq_tcp"]["round_trip_us"].get<double>();
  r["raw_zmq_tcp_over_pslab"] = tcp_us / us;  // > 1: pslab's round trip is faster than a bare TCP echo
  std::fprintf(stderr, "%6d KiB: push+pull %8.1f us  %5.2f GB/s | push, pull %8.1f us | raw zmq %8.1f us %5.2f GB/s | "
               "raw zmq tcp / pslab %.2fx | apply %5.2f GB/s, memcpy %5.2f GB/s\n",
               kib, us, r["pslab"]["push_pull_GBps"].get<double>(), r["pslab"]["push_then_pull_us"].get<double>(),
               r["raw_zmq"]["round_trip_us"].get<double>(), r["raw_zmq"]["GBps"].get<double>(), tcp_us / us,
               r["server_apply"]["apply_GBps"].get<double>(), r["server_apply"]["memcpy_GBps"].get<double>());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  pslab::use_best_cpu_runtime(argv);  // (may re-execute this program: first)
  CLI::App app{"pslab parameter-server transfer benchmark (1 server x 1 worker on this host)"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  for (int kib : o.sizes_kib)
    if (o.floor && (o.floor_pieces < 1 || (std::size_t(kib) * 256) % std::size_t(o.floor_pieces) != 0)) {
      std::fprintf(stderr, "bench_ps: --floor-pieces %d does not divide the %d KiB tensor's %zu floats\n", o.floor_pieces, kib,
                   std::size_t(kib) * 256);
      return 2;
    }
  if (o.server_threads == 0) {  // (run/setup.h: the launcher's cluster.server_threads = 0, one server and one worker here)
    ExperimentConfig c;
    c.train.device = o.device;
    o.server_threads = server_threads(c, 2, 1);
  }
  std::fprintf(stderr, "bench_ps: the server splits an update over %d thread(s) (--server-threads)\n", o.server_threads);
  if (o.netns.size() == 2) o.place.client_ns = o.netns[0], o.place.server_ns = o.netns[1];
  if (o.place.remote() && (o.transport != "tcp" || o.place.server_ip.empty())) {
    std::fprintf(stderr, "bench_ps: --netns needs --transport tcp and --server-ip\n");
    return 2;
  }
  try {
    enter_netns(o.place.client_ns);  // before any ZeroMQ context
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ps: %s\n", e.what());
    return 2;
  }
  if (std::string why; o.device == "cuda" && cuda_device_count(&why) == 0) {
    std::fprintf(stderr, "bench_ps: --device cuda: %s\n", why.c_str());
    return 2;
  }
  const comm::RunKey key = comm::make_run_key();
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  try {
    for (int kib : o.sizes_kib) results.push_back(measure(kib, o, key));
  } catch (const std::exception& e) {  // (its server processes reaped on the way out)
    std::fprintf(stderr, "bench_ps: %s\n", e.what());
    return 1;
  }
  nlohmann::ordered_json out{{"benchmark", "ps_push_pull"}, {"transport", o.transport}, {"server_threads", o.server_threads},
                             {"piece_kib", o.piece_kib >= 0 ? o.piece_kib : config_for(1024).cluster.piece_kib},
                             {"client_netns", o.place.client_ns}, {"server_netns", o.place.server_ns},
                             {"device", o.device}, {"auth", o.auth}, {"heartbeat_cost", o.heartbeat_cost}, {"guard_cost", o.guard_cost}, {"floor", o.floor}, {"codecs", o.codecs},
                             {"runs", o.runs},
                             {"metric", "median over runs of the mean time per request; GB/s counts bytes pushed + bytes pulled"},
                             {"results", results}};
  std::printf("%s\n", out.dump(2).c_str());
  if (!o.json_path.empty()) std::ofstream(o.json_path) << out.dump(2) << "\n";
}
