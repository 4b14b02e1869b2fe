#include "comm/memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace pslab::comm {
namespace {
std::string errno_text() { return std::strerror(errno); }
std::size_t page_round(std::size_t n) {
  const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}
}  // namespace

std::unique_ptr<MemfdSegment> MemfdSegment::create(const char* name, std::size_t bytes) {
  std::unique_ptr<MemfdSegment> s(new MemfdSegment);
  s->size_ = page_round(bytes ? bytes : 1);
  s->fd_ = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (s->fd_ < 0) throw std::runtime_error(std::string(name) + ": memfd_create: " + errno_text());
  void* base = MAP_FAILED;
  // Its size sealed: a peer maps it whole, and no process (this one's bugs included) can shrink
  // it under a mapping, where a read past the new end would be SIGBUS.
  if (::ftruncate(s->fd_, off_t(s->size_)) != 0 || ::fcntl(s->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
      (base = ::mmap(nullptr, s->size_, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd_, 0)) == MAP_FAILED)
    throw std::runtime_error(std::string(name) + ": a segment of " + std::to_string(s->size_) + " bytes: " + errno_text());
  s->base_ = base;
  return s;
}

MemfdSegment::~MemfdSegment() {
  if (base_) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

std::unique_ptr<MemfdSegment> map_peer_memfd(pid_t pid, int fd, const char* name, std::string& why) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  char target[128] = {};
  const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
  if (n < 0) return why = path + ": " + errno_text(), nullptr;
  const std::string expect = std::string("/memfd:") + name, got(target, std::size_t(n));
  // "/memfd:NAME (deleted)": the name must be followed by nothing or the space.
  if (got.rfind(expect, 0) != 0 || (got.size() > expect.size() && got[expect.size()] != ' '))
    return why = path + " is not a pslab segment (" + got + ")", nullptr;
  const int local = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (local < 0) return why = path + ": " + errno_text(), nullptr;
  struct stat st {};
  std::unique_ptr<MemfdSegment> s(new MemfdSegment);
  const int seals = ::fcntl(local, F_GET_SEALS);
  if (::fstat(local, &st) != 0 || st.st_size < ::sysconf(_SC_PAGESIZE)) {
    why = path + ": too small for a segment";
  } else if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    why = path + ": its size is not sealed (a segment that can shrink under the mapping)";
  } else {
    s->size_ = std::size_t(st.st_size);
    void* base = ::mmap(nullptr, s->size_, PROT_READ | PROT_WRITE, MAP_SHARED, local, 0);
    if (base == MAP_FAILED) why = path + ": mmap: " + errno_text();
    else s->base_ = base;
  }
  ::close(local);
  return s->base_ ? std::move(s) : nullptr;
}

}  // namespace pslab::comm

namespace pslab::comm {
std::string shared_memory_domain() {
  auto link = [](const char* p) {
    char buf[128] = {};
    const ssize_t n = ::readlink(p, buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, std::size_t(n)) : std::string("?");
  };
  std::string boot = "?";
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) boot = std::string(buf, strcspn(buf, "\n"));
    std::fclose(f);
  }
  return boot + " " + link("/proc/self/ns/pid") + " " + link("/proc/self/ns/net") + " uid " + std::to_string(::getuid());
}
}  // namespace pslab::comm
