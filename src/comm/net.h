// ZeroMQ plumbing shared by the server, the PS client and the evaluator: multipart receive,
// zero-copy payload frames, and a counter of sends still referencing a buffer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <zmq.hpp>

namespace pslab::net {

// Counts zero-copy sends that still reference a caller's buffer. ZeroMQ's I/O thread calls
// the free callback (release) when it is done with a frame; the owner calls wait_idle()
// before overwriting the buffer.
class InFlight {
 public:
  // A frame referencing n floats at `data` without copying; counted until ZeroMQ frees it.
  zmq::message_t frame(const float* data, std::size_t n);
  // Blocks until no frame references the buffer, or throws after `timeout` naming `what`.
  void wait_idle(std::chrono::milliseconds timeout, const std::string& what);
  int count() const;

 private:
  static void on_free(void* data, void* hint);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int n_ = 0;
};

// Receives every frame of one message (non-blocking: call after a poll said readable).
// Returns false if no message was waiting.
bool recv_all(zmq::socket_t& s, std::vector<zmq::message_t>& frames);

// 64-bit FNV-1a of a string (config fingerprints).
std::uint64_t fnv1a(const std::string& s);

// The endpoint to bind for an endpoint that peers connect to: ZeroMQ binds numeric
// addresses and "*" only, so "tcp://localhost:P" binds 127.0.0.1 and "tcp://<host name>:P"
// binds every interface ("tcp://*:P"). Other transports are returned unchanged.
std::string bind_endpoint(const std::string& endpoint);

// A TCP port on 127.0.0.1 that was free a moment ago (for tests and benchmarks).
int free_tcp_port();

}  // namespace pslab::net
