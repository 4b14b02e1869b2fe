// The C++ worker's push+pull against a run's running servers: what pslab_worker does each step
// (PsClient::push with θ for the next step in the reply), timed per round trip. The peer of the
// Python client's figure (tests/bench/bench_client.py starts the servers and runs both).
//
//   bench_client CONFIG SERVERS ITERATIONS WARMUP
//
// As worker 0 of CONFIG (cluster.workers = 1) to SERVERS (comma-separated); prints one JSON line:
// {"round_trip_us": [ITERATIONS values]}. Says Bye at the end.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model.h"
#include "ps/client.h"
#include "run/config.h"
#include "run/setup.h"

int main(int argc, char** argv) try {
  if (argc != 5) {
    std::fprintf(stderr, "usage: bench_client CONFIG SERVERS ITERATIONS WARMUP\n");
    return 2;
  }
  const pslab::ExperimentConfig cfg = pslab::load_config(argv[1]);
  std::vector<std::string> servers;
  std::stringstream in(argv[2]);
  for (std::string s; std::getline(in, s, ',');) servers.push_back(s);
  const long iterations = std::stol(argv[3]), warmup = std::stol(argv[4]);
  auto transport = pslab::run_transport(cfg, "");
  const std::size_t P = pslab::count_params(pslab::model_spec(cfg));
  // ∇θ in the transport's payload memory, as pslab_worker keeps it (shm lends it, no copy; made
  // before the client, which may still hold it lent when it goes); a tiny gradient: θ stays put.
  const auto grad_memory = transport->payload_memory(P * sizeof(float));
  pslab::PsClient client(*transport, servers, pslab::client_options(cfg, pslab::wire::Role::worker, 0, {}));
  float* grad = static_cast<float*>(grad_memory->data());
  std::fill(grad, grad + P, 1e-7f);
  std::vector<float> theta(P);
  client.connect();
  client.pull(0, theta.data());
  long clock = 0;
  for (long i = 0; i < warmup; ++i) client.push(clock++, 32, grad, theta.data());
  nlohmann::json times = nlohmann::json::array();
  for (long i = 0; i < iterations; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    client.push(clock++, 32, grad, theta.data());
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  client.bye(clock);
  std::printf("%s\n", nlohmann::json{{"round_trip_us", times}}.dump().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_client: %s\n", e.what());
  return 1;
}
