// The "shm" transport: processes on one host. Headers travel as packets over Unix
// sequenced-packet sockets at ipc:///PATH (unix_packets.h: read by the receiving thread, no
// I/O thread in between); a payload travels through shared memory: the sender copies it into a
// slot of its own (a memfd segment, reused) and sends a 48-byte reference in its place; the receiver maps the sender's
// segment once (/proc/PID/fd/FD: only the same user can) and reads the payload where it lies.
// The slot is the sender's again when the receiver's Message is reused or destroyed.
// A payload that lies in the transport's payload_memory() (a region: a segment with a table of
// loans), sent with a release function, is not copied at all: it is lent, and released once
// its receiver is done (the sender checks on every send and receive). A server keeps its θ
// versions there, so that a pull reply costs no copy on its side.
//
// A reference that does not name a live slot of a pslab segment (wrong id, stale generation,
// a length beyond the slot, a process or fd that is not there) is delivered as malformed, like
// any bad frame. Segments are memfds: they vanish with the last process that maps them, also
// when a process is killed; nothing is ever named in the file system.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "comm/transport/transport.h"

namespace pslab::comm {

std::unique_ptr<Transport> make_shm_transport();

// The payload frame of the shm transport: where the payload lies. Exposed for tests that
// forge references.
struct ShmRef {
  std::uint32_t magic;       // kShmRefMagic
  std::uint32_t pid;         // the sender
  std::int32_t fd;           // its segment's fd in the sender
  std::uint32_t loan;        // the entry of the segment's loan table that lends the payload
  std::uint32_t generation;  // the loan's use: a reference to an earlier use is stale
  std::uint32_t reserved;
  std::uint64_t segment_id;  // random, in the segment's header: an fd number can be reused
  std::uint64_t offset;      // of the payload in the segment, bytes
  std::uint64_t length;      // payload bytes
};
inline constexpr std::uint32_t kShmRefMagic = 0x50534d32;  // "PSM2"

// A sender's slots: what the transport's listeners and connections send from, and what a tool
// or test that writes frames itself uses. A slot is reused once its receiver is done with it.
// Threading: one thread at a time.
class ShmSlots {
 public:
  ShmSlots();
  ~ShmSlots();
  ShmSlots(const ShmSlots&) = delete;
  ShmSlots& operator=(const ShmSlots&) = delete;
  // Copies n bytes into a free slot and sets `ref` to name them; false if every slot is still
  // held by its receiver and no more may be made.
  bool put(const void* data, std::size_t n, ShmRef& ref);
  // The slot `ref` names is free again (its message was never sent).
  void abandon(const ShmRef& ref);
  // Whether a receiver still holds a slot (it may not have mapped it yet).
  bool busy() const;
  // How many slots receivers still hold.
  std::size_t held() const;

 private:
  struct Pool;
  std::unique_ptr<Pool> pool_;
};

}  // namespace pslab::comm
