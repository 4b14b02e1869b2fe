#include "comm/transport/zmq/zmq_transport.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include <zmq.hpp>

#include "comm/interrupt.h"

namespace pslab::comm {
namespace {

// The one deadline-poll of the ZeroMQ transports: waits until an item is ready or `deadline`
// passes. A signal (EINTR) ends the wait early like readiness does: callers try again and
// loop until their deadline; a caught interrupt (comm/interrupt.h) throws.
void poll_until(zmq::pollitem_t* items, std::size_t n, Deadline deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  try {
    zmq::poll(items, n, std::chrono::milliseconds(interrupt_slice_ms(std::max<long>(left.count(), 0))));
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw;
  }
  throw_if_interrupted();
}

// The frames of the message being received, kept in the Message and reused.
struct ZmqFrames final : Message::Storage {
  std::vector<zmq::message_t> frames;
};

// Receives every frame of one message without waiting; false if none is queued.
bool recv_frames(zmq::socket_t& s, std::vector<zmq::message_t>& frames) {
  frames.clear();
  zmq::message_t m;
  if (!s.recv(m, zmq::recv_flags::dontwait)) return false;
  bool more = m.more();
  frames.push_back(std::move(m));
  while (more) {
    zmq::message_t part;
    if (!s.recv(part, zmq::recv_flags::none)) break;  // the parts of a message arrive together
    more = part.more();
    frames.push_back(std::move(part));
  }
  return true;
}

std::span<const std::byte> bytes_of(const zmq::message_t& m) {
  return {static_cast<const std::byte*>(m.data()), m.size()};
}

// Sets `m` from frames[first] (header) and frames[first + 1] (payload, if any).
void deliver(Message& m, const std::vector<zmq::message_t>& frames, std::size_t first) {
  std::size_t bytes = 0;
  for (std::size_t i = first; i < frames.size(); ++i) bytes += frames[i].size();
  const std::size_t parts = frames.size() - first;
  if (parts == 0) return m.set_malformed("a message without a header frame", bytes);
  if (parts > 2)
    return m.set_malformed("message of " + std::to_string(parts) + " frames (expected a header and at most one payload)",
                           bytes);
  m.set(bytes_of(frames[first]), parts == 2 ? bytes_of(frames[first + 1]) : std::span<const std::byte>(), parts == 2,
        bytes);
}

// The payload as a frame: referenced (released by ZeroMQ's free callback) or copied.
zmq::message_t payload_frame(const OutPayload& p) {
  if (p.release) return zmq::message_t(const_cast<void*>(p.data), p.size, p.release, p.hint);
  return zmq::message_t(p.data, p.size);
}

// The run's key as CURVE wants it: 32 binary bytes each.
struct CurveKeys {
  std::array<std::uint8_t, 32> public_key, secret_key;
};

CurveKeys curve_keys(const RunKey& k) {
  CurveKeys c;
  if (k.public_key.size() != 40 || k.secret_key.size() != 40 || !zmq_z85_decode(c.public_key.data(), k.public_key.c_str()) ||
      !zmq_z85_decode(c.secret_key.data(), k.secret_key.c_str()))
    throw std::invalid_argument("not a run key (Z85, 40 characters each)");
  return c;
}

std::string_view view(const std::array<std::uint8_t, 32>& a) { return {reinterpret_cast<const char*>(a.data()), a.size()}; }

// The ZeroMQ authentication handler (ZAP, RFC 27) of a context: libzmq asks it about every CURVE
// handshake on the context's listeners; it admits the clients that proved the run's key and
// refuses (and counts) every other. Runs on a thread of its own until destroyed.
class ZapHandler {
 public:
  ZapHandler(zmq::context_t& ctx, const CurveKeys& keys) : sock_(ctx, zmq::socket_type::rep), allowed_(keys.public_key) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.bind("inproc://zeromq.zap.01");  // bound before any listener can ask
    thread_ = std::thread([this] { serve(); });
  }
  ~ZapHandler() {
    stop_ = true;
    thread_.join();
  }
  long refused() const { return refused_.load(); }

 private:
  void serve() {
    std::vector<zmq::message_t> req;
    while (!stop_) {
      zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
      poll_until(&item, 1, Clock::now() + std::chrono::milliseconds(100));
      if (!recv_frames(sock_, req)) continue;
      // version, request id, domain, address, routing id, mechanism, client public key
      const bool ok = req.size() == 7 && req[5].to_string_view() == "CURVE" && req[6].size() == 32 &&
                      std::memcmp(req[6].data(), allowed_.data(), 32) == 0;
      const std::string address = req.size() > 3 ? req[3].to_string() : "?";
      const std::array<std::string, 6> reply{"1.0", req.size() > 1 ? req[1].to_string() : "", ok ? "200" : "400",
                                             ok ? "OK" : "not the run's key", "", ""};
      for (std::size_t i = 0; i < reply.size(); ++i)
        sock_.send(zmq::buffer(reply[i]), i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      if (ok) continue;
      const long n = ++refused_;
      if (n <= 3 || n % 1000 == 0)
        std::fprintf(stderr, "pslab: refused a peer from %s: it does not hold the run's key (%ld refused so far)\n",
                     address.c_str(), n);
    }
  }

  zmq::socket_t sock_;
  std::array<std::uint8_t, 32> allowed_;
  std::atomic<bool> stop_{false};
  std::atomic<long> refused_{0};
  std::thread thread_;
};

class ZmqListener final : public Listener {
 public:
  ZmqListener(zmq::context_t& ctx, std::string address, const std::string& bind, const ListenOptions& o,
              const CurveKeys* keys)
      : sock_(ctx, zmq::socket_type::router), address_(std::move(address)) {
    if (keys) {  // CURVE server: peers must prove the run's key (the ZAP handler decides)
      sock_.set(zmq::sockopt::curve_server, 1);
      sock_.set(zmq::sockopt::curve_secretkey, view(keys->secret_key));
      sock_.set(zmq::sockopt::zap_domain, "pslab");
    }
    sock_.set(zmq::sockopt::ipv6, 1);  // (tcp://[::1]:P, a host's IPv6 address; IPv4 as before)
    sock_.set(zmq::sockopt::router_mandatory, 1);  // a reply that cannot be queued is reported, not lost silently
    if (o.max_message_bytes) sock_.set(zmq::sockopt::maxmsgsize, std::int64_t(o.max_message_bytes));
    sock_.set(zmq::sockopt::sndhwm, o.queue);
    sock_.set(zmq::sockopt::rcvhwm, o.queue);
    sock_.set(zmq::sockopt::linger, int(o.linger.count()));
    try {
      sock_.bind(bind);
    } catch (const zmq::error_t& e) {
      throw std::runtime_error("cannot bind " + address_ + ": " + e.what());
    }
  }
  const std::string& address() const override { return address_; }

  bool recv(Message& m, PeerId& from, Deadline deadline) override {
    auto& frames = m.storage<ZmqFrames>().frames;
    while (!recv_frames(sock_, frames)) {
      if (Clock::now() >= deadline) return false;
      zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
      poll_until(&item, 1, deadline);
    }
    from.assign(static_cast<const char*>(frames[0].data()), frames[0].size());
    deliver(m, frames, 1);
    return true;
  }

  bool send(const PeerId& to, std::span<const std::byte> header, OutPayload payload) override {
    if (payload.empty()) release(payload);  // (no bytes to send: a release function still called, once)
    const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    try {
      zmq::message_t id(to.data(), to.size());
      if (!sock_.send(id, more)) {  // the peer's queue is full
        release(payload);
        return false;
      }
      // The rest of a message is queued with its first frame.
      zmq::message_t head(header.data(), header.size());
      sock_.send(head, payload.empty() ? zmq::send_flags::dontwait : more);
      if (!payload.empty()) {
        zmq::message_t body = payload_frame(payload);
        payload = {};  // the frame owns the release now
        sock_.send(body, zmq::send_flags::dontwait);
      }
      return true;
    } catch (const zmq::error_t&) {  // EHOSTUNREACH: the peer is gone
      release(payload);
      return false;
    }
  }
  void poll_items(std::vector<PollItem>& out) const override { out.push_back({const_cast<void*>(sock_.handle()), -1}); }

 private:
  zmq::socket_t sock_;
  std::string address_;
};

class ZmqConnections final : public Connections {
 public:
  ZmqConnections(zmq::context_t& ctx, const std::vector<std::string>& addresses, const ConnectOptions& o,
                 const CurveKeys* keys)
      : addresses_(addresses) {
    for (const auto& a : addresses) {
      socks_.emplace_back(ctx, zmq::socket_type::dealer);
      if (keys) {  // CURVE client: proves the run's key to a listener that serves with it
        socks_.back().set(zmq::sockopt::curve_serverkey, view(keys->public_key));
        socks_.back().set(zmq::sockopt::curve_publickey, view(keys->public_key));
        socks_.back().set(zmq::sockopt::curve_secretkey, view(keys->secret_key));
      }
      socks_.back().set(zmq::sockopt::ipv6, 1);
      socks_.back().set(zmq::sockopt::linger, int(o.linger.count()));
      if (o.max_message_bytes) socks_.back().set(zmq::sockopt::maxmsgsize, std::int64_t(o.max_message_bytes));
      socks_.back().set(zmq::sockopt::sndhwm, o.queue);
      socks_.back().set(zmq::sockopt::rcvhwm, o.queue);
      socks_.back().connect(a);
    }
    items_.resize(socks_.size());
  }
  std::size_t size() const override { return socks_.size(); }
  const std::string& address(std::size_t k) const override { return addresses_.at(k); }
  void poll_items(std::vector<PollItem>& out) const override {
    for (const auto& s : socks_) out.push_back({const_cast<void*>(s.handle()), -1});
  }

  bool send(std::size_t k, std::span<const std::byte> header, OutPayload payload, Deadline deadline) override {
    if (payload.empty()) release(payload);  // (no bytes to send: a release function still called, once)
    zmq::socket_t& s = socks_.at(k);
    zmq::message_t head(header.data(), header.size());
    const auto flags = payload.empty() ? zmq::send_flags::dontwait : zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    while (!s.send(head, flags)) {  // the queue to listener k is full
      if (Clock::now() >= deadline) {
        release(payload);
        return false;
      }
      zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLOUT, 0};
      poll_until(&item, 1, deadline);
    }
    if (!payload.empty()) {
      zmq::message_t body = payload_frame(payload);
      s.send(body, zmq::send_flags::dontwait);  // queued with its header
    }
    return true;
  }

  bool recv(Message& m, std::size_t& from, Deadline deadline) override {
    auto& frames = m.storage<ZmqFrames>().frames;
    const std::size_t n = socks_.size();
    while (true) {
      for (std::size_t i = 0; i < n; ++i) {  // round robin, so that no listener starves another
        const std::size_t k = (next_ + i) % n;
        if (recv_frames(socks_[k], frames)) {
          next_ = k + 1;
          from = k;
          deliver(m, frames, 0);
          return true;
        }
      }
      if (Clock::now() >= deadline) return false;
      for (std::size_t k = 0; k < n; ++k) items_[k] = {socks_[k].handle(), 0, ZMQ_POLLIN, 0};
      poll_until(items_.data(), n, deadline);
    }
  }

 private:
  std::vector<zmq::socket_t> socks_;
  std::vector<std::string> addresses_;
  std::vector<zmq::pollitem_t> items_;
  std::size_t next_ = 0;
};

int free_tcp_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(s);
  if (!ok) throw std::runtime_error("no free TCP port on 127.0.0.1");
  return ntohs(a.sin_port);
}

// ZeroMQ receives a large message into a buffer it allocates for that message (malloc, on its
// I/O thread). glibc by default gives freed memory back to the kernel once the free top of a
// heap passes twice its adaptive mmap threshold, which the pieces of one push+pull, freed
// together, do: every next message then faults its pages in again and the kernel zeroes them
// (bench_ps 4 MiB over TCP: 168K page faults per invocation against 21K). This process keeps up
// to 128 MiB free per heap instead, and takes blocks below 32 MiB from its heaps, not from
// mmap. Once per process; a user's MALLOC_TRIM_THRESHOLD_ or MALLOC_MMAP_THRESHOLD_ wins.
void keep_freed_message_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("MALLOC_TRIM_THRESHOLD_") || std::getenv("MALLOC_MMAP_THRESHOLD_")) return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
  });
}

class ZmqTransport final : public Transport {
 public:
  explicit ZmqTransport(std::string scheme) : scheme_(std::move(scheme)) { keep_freed_message_memory(); }
  ~ZmqTransport() override {
    if (!private_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(private_dir_, ec);
    }
  }
  std::string name() const override { return scheme_; }
  std::string address_scheme() const override { return scheme_; }

  std::string local_address(const std::string& name) override {
    if (scheme_ == "tcp") return "tcp://127.0.0.1:" + std::to_string(free_tcp_port());
    std::lock_guard<std::mutex> lock(mu_);
    if (private_dir_.empty()) {
      char tmpl[] = "/tmp/pslab-XXXXXX";  // mode 0700: only this user reaches the sockets
      if (!::mkdtemp(tmpl)) throw std::runtime_error(std::string("mkdtemp /tmp/pslab-XXXXXX: ") + std::strerror(errno));
      private_dir_ = tmpl;
    }
    return "ipc://" + private_dir_ + "/" + name;
  }

  std::unique_ptr<Listener> listen(const std::string& address, const ListenOptions& opt) override {
    check(address);
    return std::make_unique<ZmqListener>(context(), address, zmq_bind_address(address), opt, keys());
  }

  std::unique_ptr<Connections> connect(const std::vector<std::string>& addresses, const ConnectOptions& opt) override {
    for (const auto& a : addresses) check(a);
    return std::make_unique<ZmqConnections>(context(), addresses, opt, keys());
  }

  // tcp: CURVE on every socket, and a ZAP handler that admits the run's key alone. ipc: its
  // sockets live in a private directory (mode 0700): only this user reaches them.
  void authenticate(const RunKey& key) override {
    if (scheme_ == "ipc") return;
    std::lock_guard<std::mutex> lock(mu_);
    if (keys_) throw std::logic_error("the transport authenticates already");
    keys_ = curve_keys(key);
    zap_ = std::make_unique<ZapHandler>(context(), *keys_);
  }
  long peers_refused() const override { return zap_ ? zap_->refused() : 0; }

 private:
  void check(const std::string& address) const {
    const std::string prefix = scheme_ + "://";
    const char* form = scheme_ == "tcp" ? "tcp://HOST:PORT" : "ipc:///PATH";
    if (address.rfind(prefix, 0) != 0 || address.size() == prefix.size())
      throw std::invalid_argument("\"" + address + "\" is not an address of the " + scheme_ + " transport (" + form +
                                  "; cluster.transport = \"" + scheme_ + "\")");
    if (scheme_ == "ipc" && address.size() - prefix.size() >= sizeof(sockaddr_un::sun_path))
      throw std::invalid_argument("\"" + address + "\": a Unix socket path has at most " +
                                  std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
  }
  zmq::context_t& context() {
    std::call_once(ctx_once_, [&] { ctx_ = std::make_unique<zmq::context_t>(1); });
    return *ctx_;
  }

  const CurveKeys* keys() {
    std::lock_guard<std::mutex> lock(mu_);
    return keys_ ? &*keys_ : nullptr;
  }

  std::string scheme_;
  std::once_flag ctx_once_;
  std::unique_ptr<zmq::context_t> ctx_;
  std::mutex mu_;
  std::string private_dir_;
  std::optional<CurveKeys> keys_;   // set by authenticate()
  std::unique_ptr<ZapHandler> zap_;  // destroyed (its thread joined) before the context
};

}  // namespace

std::unique_ptr<Transport> make_zmq_transport(const std::string& scheme) {
  if (scheme != "tcp" && scheme != "ipc") throw std::invalid_argument("ZeroMQ transports: tcp or ipc, not " + scheme);
  return std::make_unique<ZmqTransport>(scheme);
}

std::string zmq_bind_address(const std::string& address) {
  if (address.rfind("tcp://", 0) != 0) return address;
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon < 6) return address;
  const std::string host = address.substr(6, colon - 6), port = address.substr(colon);
  if (host == "localhost") return "tcp://127.0.0.1" + port;
  const bool numeric = host == "*" || host.find_first_not_of("0123456789.") == std::string::npos ||
                       (host.size() > 2 && host.front() == '[' && host.back() == ']');
  return numeric ? address : "tcp://*" + port;
}

}  // namespace pslab::comm
