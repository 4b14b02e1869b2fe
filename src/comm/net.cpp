#include "comm/net.h"

#include <stdexcept>

namespace pslab::net {

zmq::message_t InFlight::frame(const float* data, std::size_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++n_;
  }
  // ZeroMQ does not write through the pointer; the const_cast is for its C signature.
  return zmq::message_t(const_cast<float*>(data), n * sizeof(float), &InFlight::on_free, this);
}

void InFlight::on_free(void*, void* hint) {
  auto* self = static_cast<InFlight*>(hint);
  {
    std::lock_guard<std::mutex> lock(self->mu_);
    --self->n_;
  }
  self->cv_.notify_all();
}

void InFlight::wait_idle(std::chrono::milliseconds timeout, const std::string& what) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return n_ == 0; }))
    throw std::runtime_error(std::to_string(n_) + " zero-copy send(s) of " + what + " not done after " +
                             std::to_string(timeout.count()) + " ms");
}

int InFlight::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return n_;
}

bool recv_all(zmq::socket_t& s, std::vector<zmq::message_t>& frames) {
  frames.clear();
  zmq::message_t m;
  if (!s.recv(m, zmq::recv_flags::dontwait)) return false;
  bool more = m.more();
  frames.push_back(std::move(m));
  while (more) {
    zmq::message_t part;
    if (!s.recv(part, zmq::recv_flags::none)) break;  // parts of a message arrive together
    more = part.more();
    frames.push_back(std::move(part));
  }
  return true;
}

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::string bind_endpoint(const std::string& endpoint) {
  if (endpoint.rfind("tcp://", 0) != 0) return endpoint;
  const auto colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon < 6) return endpoint;
  const std::string host = endpoint.substr(6, colon - 6), port = endpoint.substr(colon);
  if (host == "localhost") return "tcp://127.0.0.1" + port;
  const bool numeric = host == "*" || host.find_first_not_of("0123456789.") == std::string::npos ||
                       (host.size() > 2 && host.front() == '[' && host.back() == ']');
  return numeric ? endpoint : "tcp://*" + port;
}

int free_tcp_port() {
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::router);
  s.set(zmq::sockopt::linger, 0);
  s.bind("tcp://127.0.0.1:*");
  const std::string ep = s.get(zmq::sockopt::last_endpoint);
  return std::stoi(ep.substr(ep.rfind(':') + 1));
}

}  // namespace pslab::net
