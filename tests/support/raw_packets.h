// A raw peer of the shm transport's header channel (comm/transport/shm/unix_packets.h), for
// tests that send what a well-behaved process never would: packets of the prefix format
// [u32 header bytes][u32 1 if a payload follows][header][payload], built here by hand.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace pslab::test {

class RawPackets {
 public:
  // `address`: ipc:///PATH of a shm listener.
  explicit RawPackets(const std::string& address) {
    fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const std::string path = address.substr(6);
    std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
      throw std::runtime_error("RawPackets: cannot connect to " + address);
  }
  ~RawPackets() { ::close(fd_); }
  // One packet of `frames` (a header and at most one payload is well-formed; a third frame
  // makes the prefix claim one, which is malformed).
  void send(const std::vector<std::string>& frames) {
    std::string packet(8, '\0');
    const std::uint32_t prefix[2] = {std::uint32_t(frames.empty() ? 0 : frames[0].size()),
                                     std::uint32_t(frames.size() > 1 ? frames.size() - 1 : 0)};
    std::memcpy(packet.data(), prefix, 8);
    for (const auto& f : frames) packet += f;
    send_bytes(packet);
  }
  void send_bytes(const std::string& packet) { ::send(fd_, packet.data(), packet.size(), MSG_NOSIGNAL); }
  // The header of the next packet, or "" after `ms` without one.
  std::string recv_header(int ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return "";
    std::vector<char> buf(1 << 20);
    const ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
    if (n < 8) return "";
    std::uint32_t prefix[2];
    std::memcpy(prefix, buf.data(), 8);
    return std::string(buf.data() + 8, std::min<std::size_t>(prefix[0], std::size_t(n) - 8));
  }

 private:
  int fd_ = -1;
};

}  // namespace pslab::test
