#include "comm/transport/shm/unix_packets.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <thread>

#include "comm/interrupt.h"

namespace pslab::comm {
namespace {

constexpr std::size_t kPrefix = 8;                  // [u32 header bytes][u32 has payload]
constexpr std::size_t kMaxPacket = std::size_t(1) << 20;  // headers and references are small
constexpr int kSocketBuffer = 1 << 21;

std::string errno_text() { return std::strerror(errno); }

std::string path_of(const std::string& address) {
  if (address.rfind("ipc://", 0) != 0 || address.size() == 6)
    throw std::invalid_argument("\"" + address + "\" is not an ipc:///PATH address");
  const std::string path = address.substr(6);
  if (path.size() >= sizeof(sockaddr_un::sun_path))
    throw std::invalid_argument("\"" + address + "\": a Unix socket path has at most " +
                                std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
  return path;
}

sockaddr_un unix_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

int packet_socket() {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket(AF_UNIX, SOCK_SEQPACKET): " + errno_text());
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kSocketBuffer, sizeof kSocketBuffer);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &kSocketBuffer, sizeof kSocketBuffer);
  return fd;
}

// Sends one packet without waiting: its byte count, -1 with errno otherwise.
ssize_t send_packet(int fd, std::span<const std::byte> header, const OutPayload& payload) {
  const std::uint32_t prefix[2] = {std::uint32_t(header.size()), payload.empty() ? 0u : 1u};
  iovec iov[3] = {{const_cast<std::uint32_t*>(prefix), kPrefix},
                  {const_cast<std::byte*>(header.data()), header.size()},
                  {const_cast<void*>(payload.data), payload.size}};
  msghdr mh{};
  mh.msg_iov = iov;
  mh.msg_iovlen = payload.empty() ? 2 : 3;
  return ::sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
}

// Whether a send failed for the packet (too large for the socket's buffer, memory short) with
// the connection intact: that message is not sent; the link is not taken for gone.
bool packet_refused(int err) { return err == EMSGSIZE || err == ENOBUFS || err == ENOMEM; }

// A received packet, kept until the Message is reused.
struct Packet final : Message::Storage {
  std::vector<std::byte> buf = std::vector<std::byte>(kMaxPacket);
};

// Reads one packet from `fd` into `m`: 1 got one, 0 none waiting, -1 the peer closed.
int read_packet(int fd, Message& m) {
  auto& buf = m.storage<Packet>().buf;
  const ssize_t n = ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT | MSG_TRUNC);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
  if (n == 0) return -1;
  const std::size_t got = std::size_t(n);
  if (got > buf.size()) {
    m.set_malformed("a packet of " + std::to_string(got) + " bytes, over the limit of " + std::to_string(buf.size()), got);
    return 1;
  }
  std::uint32_t prefix[2];
  if (got < kPrefix) {
    m.set_malformed("a packet of " + std::to_string(got) + " bytes, shorter than its prefix", got);
    return 1;
  }
  std::memcpy(prefix, buf.data(), kPrefix);
  if (prefix[0] > got - kPrefix || prefix[1] > 1 || (prefix[1] == 0 && prefix[0] != got - kPrefix)) {
    m.set_malformed("a packet of " + std::to_string(got) + " bytes whose prefix says a header of " +
                        std::to_string(prefix[0]) + (prefix[1] ? " and a payload" : " and nothing else"),
                    got);
    return 1;
  }
  const std::span<const std::byte> all(buf.data(), got);
  m.set(all.subspan(kPrefix, prefix[0]), prefix[1] ? all.subspan(kPrefix + prefix[0]) : std::span<const std::byte>(),
        prefix[1] == 1, got);
  return 1;
}

int millis_until(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return int(std::min<long long>((left + 999) / 1000, 1000 * 1000));
}

class UnixListener final : public Listener {
 public:
  UnixListener(const std::string& address, const ListenOptions&) : address_(address) {
    const std::string path = path_of(address);
    fd_ = packet_socket();
    const sockaddr_un a = unix_address(path);
    ::unlink(path.c_str());  // a socket file left by an earlier process
    if (::bind(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 1024) != 0) {
      const std::string why = errno_text();
      ::close(fd_);
      throw std::runtime_error("cannot bind " + address + ": " + why);
    }
    ep_ = ::epoll_create1(EPOLL_CLOEXEC);
    watch(fd_, kListening);
  }
  ~UnixListener() override {
    for (auto& [id, fd] : peers_) ::close(fd);
    ::close(ep_);
    ::close(fd_);
    ::unlink(path_of(address_).c_str());
  }
  const std::string& address() const override { return address_; }

  bool recv(Message& m, PeerId& from, Deadline deadline) override {
    for (;;) {
      if (accepting_from_ != Clock::time_point{} && Clock::now() >= accepting_from_) {
        accepting_from_ = {};
        watch(fd_, kListening);
      }
      epoll_event ev[16];
      const int n = ::epoll_wait(ep_, ev, 16, accepting_from_ == Clock::time_point{}
                                                  ? millis_until(deadline)
                                                  : std::min(millis_until(deadline), millis_until(accepting_from_)));
      for (int i = 0; i < n; ++i) {
        if (ev[i].data.u64 == kListening) {
          accept_all();
          continue;
        }
        const std::uint64_t id = ev[i].data.u64;
        const auto it = peers_.find(id);
        if (it == peers_.end()) continue;
        const int r = read_packet(it->second, m);
        if (r == 1) {
          char name[24];  // "u<id>" (built so: GCC 12 warns wrongly, -Wrestrict, on "u" + to_string)
          std::snprintf(name, sizeof name, "u%llu", static_cast<unsigned long long>(id));
          from.assign(name);
          return true;
        }
        if (r < 0) drop(id);
      }
      // Every pass: a socket that stays readable (a connection that cannot be accepted, out of
      // file descriptors) made epoll return at once for ever, and the deadline was never seen.
      if (Clock::now() >= deadline) return false;
    }
  }

  bool send(const PeerId& to, std::span<const std::byte> header, OutPayload payload) override {
    std::uint64_t id = 0;
    if (to.size() < 2 || to[0] != 'u' || std::sscanf(to.c_str() + 1, "%lu", &id) != 1 || !peers_.count(id)) {
      release(payload);
      return false;  // not a peer, or gone
    }
    const ssize_t n = send_packet(peers_[id], header, payload);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && !packet_refused(errno)) drop(id);
    release(payload);
    return n >= 0;  // EAGAIN: its queue is full, dropped
  }
  void poll_items(std::vector<PollItem>& out) const override { out.push_back({nullptr, ep_}); }

 private:
  static constexpr std::uint64_t kListening = ~std::uint64_t(0);
  void watch(int fd, std::uint64_t id) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    ::epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
  }
  void accept_all() {
    for (;;) {
      const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) pause_accepting();
        return;
      }
      ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kSocketBuffer, sizeof kSocketBuffer);
      const std::uint64_t id = ++last_id_;
      peers_[id] = fd;
      watch(fd, id);
    }
  }
  // Out of file descriptors (or memory): the waiting connection keeps the socket readable, so it
  // is not watched for 100 ms (it would wake every wait at once), and that is said once.
  void pause_accepting() {
    ::epoll_ctl(ep_, EPOLL_CTL_DEL, fd_, nullptr);
    accepting_from_ = Clock::now() + std::chrono::milliseconds(100);
    if (!said_paused_)
      std::fprintf(stderr, "%s: cannot accept a connection (%s): it waits until a file descriptor is free (ulimit -n)\n",
                   address_.c_str(), errno_text().c_str());
    said_paused_ = true;
  }
  void drop(std::uint64_t id) {
    const auto it = peers_.find(id);
    if (it == peers_.end()) return;
    ::epoll_ctl(ep_, EPOLL_CTL_DEL, it->second, nullptr);
    ::close(it->second);
    peers_.erase(it);
  }

  std::string address_;
  int fd_ = -1, ep_ = -1;
  std::map<std::uint64_t, int> peers_;  // peer id -> its connection
  std::uint64_t last_id_ = 0;
  Clock::time_point accepting_from_{};  // while not accepting (pause_accepting): when to again
  bool said_paused_ = false;
};

class UnixConnections final : public Connections {
 public:
  UnixConnections(const std::vector<std::string>& addresses, const ConnectOptions&) : addresses_(addresses) {
    for (const auto& a : addresses) paths_.push_back(path_of(a));
    fds_.assign(addresses.size(), -1);
    for (std::size_t k = 0; k < fds_.size(); ++k) try_connect(k);
  }
  ~UnixConnections() override {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }
  std::size_t size() const override { return fds_.size(); }
  const std::string& address(std::size_t k) const override { return addresses_.at(k); }
  // A listener not connected to yet sends nothing.
  void poll_items(std::vector<PollItem>& out) const override {
    for (int fd : fds_)
      if (fd >= 0) out.push_back({nullptr, fd});
  }

  bool send(std::size_t k, std::span<const std::byte> header, OutPayload payload, Deadline deadline) override {
    for (;;) {
      if (fds_.at(k) >= 0 || try_connect(k)) {
        const ssize_t n = send_packet(fds_[k], header, payload);
        if (n >= 0) {
          release(payload);
          return true;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {  // its queue is full: wait for room
          pollfd p{fds_[k], POLLOUT, 0};
          if (Clock::now() < deadline) ::poll(&p, 1, std::min(millis_until(deadline), 10));
          throw_if_interrupted();
        } else if (packet_refused(errno)) {  // (too large for the socket: trying again will not help)
          release(payload);
          return false;
        } else {
          disconnect(k);  // the listener went away: connect again
        }
      } else if (Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // not there yet (or gone: one started in its place listens here)
        throw_if_interrupted();
      }
      if (Clock::now() >= deadline) {
        release(payload);
        return false;
      }
    }
  }

  bool recv(Message& m, std::size_t& from, Deadline deadline) override {
    const std::size_t n = fds_.size();
    for (;;) {
      for (std::size_t i = 0; i < n; ++i) {  // round robin, so that no listener starves another
        const std::size_t k = (next_ + i) % n;
        if (fds_[k] < 0) continue;
        const int r = read_packet(fds_[k], m);
        if (r == 1) {
          next_ = k + 1;
          from = k;
          return true;
        }
        if (r < 0) disconnect(k);
      }
      if (Clock::now() >= deadline) return false;
      polls_.clear();
      for (std::size_t k = 0; k < n; ++k)
        if (fds_[k] >= 0) polls_.push_back({fds_[k], POLLIN, 0});
      if (polls_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(std::min(2, millis_until(deadline))));
      else ::poll(polls_.data(), polls_.size(), int(interrupt_slice_ms(millis_until(deadline))));
      throw_if_interrupted();
    }
  }

 private:
  bool try_connect(std::size_t k) {
    const int fd = packet_socket();
    const sockaddr_un a = unix_address(paths_[k]);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return false;
    }
    fds_[k] = fd;
    return true;
  }
  void disconnect(std::size_t k) {
    if (fds_[k] >= 0) ::close(fds_[k]);
    fds_[k] = -1;
  }

  std::vector<std::string> addresses_, paths_;
  std::vector<int> fds_;  // -1: not connected (yet, or any more)
  std::vector<pollfd> polls_;
  std::size_t next_ = 0;
};

}  // namespace

std::unique_ptr<Listener> listen_unix_packets(const std::string& address, const ListenOptions& opt) {
  return std::make_unique<UnixListener>(address, opt);
}

std::unique_ptr<Connections> connect_unix_packets(const std::vector<std::string>& addresses, const ConnectOptions& opt) {
  return std::make_unique<UnixConnections>(addresses, opt);
}

}  // namespace pslab::comm
