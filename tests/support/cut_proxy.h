// A TCP proxy between a test's clients and one TCP listener, which cuts every connection
// through it (a reset on both sides, as a link that fails does) when told to: at once, or once a
// given number of bytes has passed. Clients connect to address() instead of the listener's; the
// proxy is transparent to what travels (CURVE included), so what a cut does to a run is what a
// network fault does. One thread of its own forwards both ways (poll(), 64 KiB at a time).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace pslab::test {

class CutProxy {
 public:
  // `upstream`: tcp://127.0.0.1:PORT.
  explicit CutProxy(const std::string& upstream) : upstream_port_(std::stoi(upstream.substr(upstream.rfind(':') + 1))) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_fd_, 64) != 0 || ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error(std::string("CutProxy: cannot listen on 127.0.0.1: ") + std::strerror(errno));
    address_ = "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    thread_ = std::thread([this] { loop(); });
  }
  ~CutProxy() {
    stop_ = true;
    thread_.join();
    for (Pair& p : pairs_) close_pair(p, false);
    ::close(listen_fd_);
  }
  const std::string& address() const { return address_; }
  // Cuts every connection through it once `bytes` in all have passed through it (counted from
  // its start), one cut per threshold, in increasing order.
  void cut_at(std::vector<long> bytes) {
    std::lock_guard lock(mu_);
    cut_at_.assign(bytes.begin(), bytes.end());
  }
  void cut_now() { cut_requested_ = true; }
  long cuts() const { return cuts_.load(); }
  long bytes() const { return bytes_.load(); }

 private:
  struct Pair {
    int client = -1, server = -1;
  };
  static sockaddr_in loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(std::uint16_t(port));
    return a;
  }
  // With `reset`, a close that sends RST (SO_LINGER 0), as a failed link looks to both ends.
  static void close_pair(Pair& p, bool reset) {
    for (int fd : {p.client, p.server}) {
      if (fd < 0) continue;
      if (reset) {
        const linger l{1, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
      }
      ::close(fd);
    }
    p = {};
  }
  void accept_one() {
    const int c = ::accept(listen_fd_, nullptr, nullptr);
    if (c < 0) return;
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    const sockaddr_in a = loopback(upstream_port_);
    if (s < 0 || ::connect(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      ::close(c);
      if (s >= 0) ::close(s);
      return;
    }
    pairs_.push_back({c, s});
  }
  // Moves what `from` has to `to`; false when either side is closed.
  bool forward(int from, int to) {
    char buf[65536];
    const ssize_t n = ::recv(from, buf, sizeof buf, 0);
    if (n <= 0) return false;
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::send(to, buf + done, std::size_t(n - done), MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      done += w;
    }
    bytes_ += n;
    return true;
  }
  bool cut_due() {
    if (cut_requested_.exchange(false)) return true;
    std::lock_guard lock(mu_);
    if (cut_at_.empty() || bytes_.load() < cut_at_.front()) return false;
    cut_at_.pop_front();
    return true;
  }
  void loop() {
    std::vector<pollfd> fds;
    while (!stop_) {
      if (cut_due()) {
        for (Pair& p : pairs_) close_pair(p, true);
        pairs_.clear();
        ++cuts_;
      }
      fds.assign(1, pollfd{listen_fd_, POLLIN, 0});
      for (const Pair& p : pairs_) {
        fds.push_back({p.client, POLLIN, 0});
        fds.push_back({p.server, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 10) <= 0) continue;
      if (fds[0].revents & POLLIN) accept_one();
      for (std::size_t i = 0; i < pairs_.size() && 2 * i + 2 < fds.size(); ++i) {
        Pair& p = pairs_[i];
        const bool ok = (!(fds[2 * i + 1].revents & (POLLIN | POLLHUP | POLLERR)) || forward(p.client, p.server)) &&
                        (!(fds[2 * i + 2].revents & (POLLIN | POLLHUP | POLLERR)) || forward(p.server, p.client));
        if (!ok) close_pair(p, true);  // one side went: the other sees it too
      }
      std::erase_if(pairs_, [](const Pair& p) { return p.client < 0; });
    }
  }

  int upstream_port_;
  int listen_fd_ = -1;
  std::string address_;
  std::vector<Pair> pairs_;  // the proxy's thread only
  std::mutex mu_;
  std::deque<long> cut_at_;
  std::atomic<bool> cut_requested_{false}, stop_{false};
  std::atomic<long> cuts_{0}, bytes_{0};
  std::thread thread_;
};

}  // namespace pslab::test
