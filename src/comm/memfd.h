// Shared memory between processes of one host, as pslab uses it: a memfd segment that one
// process makes (anonymous: nothing is ever named in the file system, and it vanishes with the
// last process that maps it, also when processes are killed), and that a peer of the same user
// maps through /proc/PID/fd/FD. Used by the shm transport and the shm collective.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <sys/types.h>

namespace pslab::comm {

// A mapping of a memfd, made here (MemfdSegment::create) or a peer's (map_peer_memfd).
// Threading: the mapping itself is immutable; what lies in it is the users' business.
class MemfdSegment {
 public:
  // A new segment of at least `bytes` (whole pages), zero-filled, named `name` (the name shows
  // in /proc/PID/fd as "/memfd:NAME"), its size sealed (F_SEAL_SHRINK, F_SEAL_GROW). Throws
  // with the reason.
  static std::unique_ptr<MemfdSegment> create(const char* name, std::size_t bytes);
  ~MemfdSegment();
  MemfdSegment(const MemfdSegment&) = delete;
  MemfdSegment& operator=(const MemfdSegment&) = delete;

  void* base() const { return base_; }
  std::size_t size() const { return size_; }
  int fd() const { return fd_; }  // -1 for a peer's segment (its fd is closed once mapped)

 private:
  friend std::unique_ptr<MemfdSegment> map_peer_memfd(pid_t, int, const char*, std::string&);
  MemfdSegment() = default;
  void* base_ = nullptr;
  std::size_t size_ = 0;
  int fd_ = -1;
};

// Maps the segment that process `pid` holds as fd `fd`, if it is a memfd named `name` that this
// user may open, at least one page long and sealed against shrinking (as create() seals it);
// otherwise nullptr and `why` says why.
std::unique_ptr<MemfdSegment> map_peer_memfd(pid_t pid, int fd, const char* name, std::string& why);

}  // namespace pslab::comm

namespace pslab::comm {
// Which processes count as on one host for shared memory: the same kernel boot, PID namespace,
// network namespace and user. (The network namespace counts so that a test that puts "hosts" in
// namespaces of one machine sees them as separate, as the addresses they use are.)
std::string shared_memory_domain();
}  // namespace pslab::comm
