#include "comm/transport/shm/shm_transport.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <thread>

#include "comm/memfd.h"
#include "comm/transport/zmq/zmq_transport.h"

namespace pslab::comm {
namespace {

// The head of every segment; the payload starts kPayloadOffset bytes in (cache-line aligned).
struct SlotHeader {
  std::uint64_t segment_id;         // random; what a reference must name
  std::uint64_t capacity;           // payload bytes the segment holds
  std::atomic<std::uint32_t> busy;  // 1 from send until the receiver is done with the payload
  std::uint32_t generation;         // the slot's current use
};
constexpr std::size_t kPayloadOffset = 64;
static_assert(sizeof(SlotHeader) <= kPayloadOffset);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
constexpr char kSegmentName[] = "pslab-shm";  // memfd name; /proc/PID/fd/FD reads "/memfd:pslab-shm (deleted)"

void release(OutPayload& p) {
  if (p.release) p.release(const_cast<void*>(p.data), p.hint);
  p = {};
}

// One slot of a sender: a memfd segment of its own, mapped. Threading: the owner's thread; the
// receiver (another process) only clears `busy`.
class Segment {
 public:
  explicit Segment(std::size_t capacity)
      : mem_(MemfdSegment::create(kSegmentName, kPayloadOffset + capacity)), pid_(std::uint32_t(::getpid())) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    head()->segment_id = rng();
    head()->capacity = mem_->size() - kPayloadOffset;
    head()->busy.store(0, std::memory_order_relaxed);
    head()->generation = 0;
  }

  SlotHeader* head() const { return static_cast<SlotHeader*>(mem_->base()); }
  std::size_t capacity() const { return mem_->size() - kPayloadOffset; }
  bool free() const { return head()->busy.load(std::memory_order_acquire) == 0; }

  // Copies the payload in and returns the reference that names it; the slot is busy until the
  // receiver is done (or abandon()).
  ShmRef fill(const void* data, std::size_t n) {
    head()->busy.store(1, std::memory_order_relaxed);
    if (n) std::memcpy(static_cast<std::byte*>(mem_->base()) + kPayloadOffset, data, n);
    ++head()->generation;
    return ShmRef{kShmRefMagic, pid_, mem_->fd(), head()->generation, head()->segment_id, n, 0};
  }
  void abandon() { head()->busy.store(0, std::memory_order_release); }
  int fd() const { return mem_->fd(); }

 private:
  std::unique_ptr<MemfdSegment> mem_;
  std::uint32_t pid_;  // the process that made it (and holds its fd)
};

}  // namespace

// A slot is reused once its receiver is done; a new one is made while fewer than kMaxSlots
// exist.
struct ShmSlots::Pool {
  static constexpr std::size_t kMaxSlots = 256;

  // A free slot that holds n bytes, or nullptr if every slot is busy and no more may be made.
  Segment* take(std::size_t n) {
    Segment* best = nullptr;
    std::size_t small_free = slots_.size();
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      Segment& s = *slots_[i];
      if (!s.free()) continue;
      if (s.capacity() < n) {
        small_free = i;
        continue;
      }
      if (!best || s.capacity() < best->capacity()) best = &s;
    }
    if (best) return best;
    if (slots_.size() < kMaxSlots) return slots_.emplace_back(std::make_unique<Segment>(n)).get();
    if (small_free < slots_.size()) return (slots_[small_free] = std::make_unique<Segment>(n)).get();  // grows one
    return nullptr;
  }

  std::vector<std::unique_ptr<Segment>> slots_;
};

ShmSlots::ShmSlots() : pool_(std::make_unique<Pool>()) {}
ShmSlots::~ShmSlots() = default;

bool ShmSlots::put(const void* data, std::size_t n, ShmRef& ref) {
  Segment* slot = pool_->take(n);
  if (!slot) return false;
  ref = slot->fill(data, n);
  return true;
}

void ShmSlots::abandon(const ShmRef& ref) {
  for (auto& s : pool_->slots_)
    if (s->fd() == ref.fd) s->abandon();
}

namespace {

// A sender's segment as a receiver maps it.
struct Mapping {
  std::unique_ptr<MemfdSegment> mem;
  void* base() const { return mem->base(); }
  std::size_t size() const { return mem->size(); }
  SlotHeader* head() const { return static_cast<SlotHeader*>(mem->base()); }
};

// A received message's storage: the inner (ZeroMQ) message and the slot its payload lies in,
// handed back when the next receive into the same Message starts or the Message goes.
struct ShmHeld final : Message::Storage {
  Message inner;
  std::shared_ptr<Mapping> mapping;
  void give_back() {
    if (mapping) mapping->head()->busy.store(0, std::memory_order_release);
    mapping.reset();
  }
  ~ShmHeld() override { give_back(); }
};

// A receiver's mappings of its senders' segments, by (pid, fd). Threading: the owner's thread.
class Mappings {
 public:
  explicit Mappings(std::size_t max_bytes) : max_bytes_(max_bytes) {}

  // Receives into `m` with recv_inner(inner message): first hands back the slot of the payload
  // `m` held, then sets `m` from the inner message and the payload its reference names.
  template <typename RecvInner>
  bool receive(Message& m, RecvInner recv_inner) {
    ShmHeld& held = m.storage<ShmHeld>();
    held.give_back();
    if (!recv_inner(held.inner)) return false;
    deliver(m, held);
    return true;
  }

 private:
  void deliver(Message& m, ShmHeld& held) {
    const Message& in = held.inner;
    if (!in.malformed().empty()) return m.set_malformed(in.malformed(), in.wire_bytes());
    if (!in.has_payload()) return m.set(in.header(), {}, false, in.wire_bytes());
    ShmRef ref;
    if (in.payload().size() != sizeof ref)
      return m.set_malformed("a payload frame of " + std::to_string(in.payload().size()) +
                                 " bytes, not a shared-memory reference (" + std::to_string(sizeof ref) + " bytes)",
                             in.wire_bytes());
    std::memcpy(&ref, in.payload().data(), sizeof ref);
    std::string why;
    auto mapping = resolve(ref, why);
    if (!mapping) return m.set_malformed("shared-memory reference: " + why, in.wire_bytes());
    held.mapping = std::move(mapping);
    const auto* payload = static_cast<const std::byte*>(held.mapping->base()) + kPayloadOffset;
    m.set(in.header(), {payload, std::size_t(ref.length)}, true, in.header().size() + std::size_t(ref.length));
  }

  // The mapping of the live slot `ref` names, or nullptr with why not.
  std::shared_ptr<Mapping> resolve(const ShmRef& ref, std::string& why) {
    if (ref.magic != kShmRefMagic) return why = "bad magic", nullptr;
    if (max_bytes_ && ref.length > max_bytes_)
      return why = "a payload of " + std::to_string(ref.length) + " bytes, over the limit of " + std::to_string(max_bytes_),
             nullptr;
    const auto key = std::make_pair(ref.pid, ref.fd);
    auto it = maps_.find(key);
    if (it == maps_.end() || it->second->head()->segment_id != ref.segment_id) {  // new, or the fd was reused
      auto fresh = open(ref, why);
      if (!fresh) return nullptr;
      it = maps_.insert_or_assign(key, std::move(fresh)).first;
    }
    const SlotHeader* h = it->second->head();
    if (h->segment_id != ref.segment_id) return why = "no segment " + std::to_string(ref.segment_id) + " at that fd", nullptr;
    if (ref.length > h->capacity || kPayloadOffset + h->capacity > it->second->size())
      return why = "a payload of " + std::to_string(ref.length) + " bytes in a slot of " + std::to_string(h->capacity), nullptr;
    if (h->generation != ref.generation || h->busy.load(std::memory_order_acquire) != 1)
      return why = "stale: generation " + std::to_string(ref.generation) + " of a slot now at " +
                   std::to_string(h->generation) + (h->busy.load() ? "" : " (not in use)"),
             nullptr;
    return it->second;
  }

  // Maps the sender's segment: only a pslab memfd of a process this user may read.
  static std::shared_ptr<Mapping> open(const ShmRef& ref, std::string& why) {
    auto mem = map_peer_memfd(pid_t(ref.pid), ref.fd, kSegmentName, why);
    if (!mem) return nullptr;
    auto m = std::make_shared<Mapping>();
    m->mem = std::move(mem);
    return m;
  }

  std::size_t max_bytes_;
  std::map<std::pair<std::uint32_t, std::int32_t>, std::shared_ptr<Mapping>> maps_;
};

class ShmListener final : public Listener {
 public:
  ShmListener(std::unique_ptr<Listener> inner, const ListenOptions& o)
      : inner_(std::move(inner)), mappings_(o.max_message_bytes) {}
  const std::string& address() const override { return inner_->address(); }

  bool recv(Message& m, PeerId& from, Deadline deadline) override {
    return mappings_.receive(m, [&](Message& inner) { return inner_->recv(inner, from, deadline); });
  }

  bool send(const PeerId& to, std::span<const std::byte> header, OutPayload payload) override {
    if (payload.empty()) return inner_->send(to, header, {});
    ShmRef ref;
    const bool put = slots_.put(payload.data, payload.size, ref);
    release(payload);
    if (!put) return false;  // every slot still held by its receiver: dropped, like a full queue
    if (inner_->send(to, header, OutPayload{&ref, sizeof ref})) return true;
    slots_.abandon(ref);
    return false;
  }

 private:
  std::unique_ptr<Listener> inner_;
  Mappings mappings_;
  ShmSlots slots_;
};

class ShmConnections final : public Connections {
 public:
  explicit ShmConnections(std::unique_ptr<Connections> inner) : inner_(std::move(inner)), mappings_(0) {}
  std::size_t size() const override { return inner_->size(); }
  const std::string& address(std::size_t k) const override { return inner_->address(k); }

  bool send(std::size_t k, std::span<const std::byte> header, OutPayload payload, Deadline deadline) override {
    if (payload.empty()) return inner_->send(k, header, {}, deadline);
    ShmRef ref;
    while (!slots_.put(payload.data, payload.size, ref)) {  // every slot still held by its receiver
      if (Clock::now() >= deadline) {
        release(payload);
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    release(payload);
    if (inner_->send(k, header, OutPayload{&ref, sizeof ref}, deadline)) return true;
    slots_.abandon(ref);
    return false;
  }

  bool recv(Message& m, std::size_t& from, Deadline deadline) override {
    return mappings_.receive(m, [&](Message& inner) { return inner_->recv(inner, from, deadline); });
  }

 private:
  std::unique_ptr<Connections> inner_;
  Mappings mappings_;
  ShmSlots slots_;
};

class ShmTransport final : public Transport {
 public:
  ShmTransport() : ipc_(make_zmq_transport("ipc")) {}
  std::string name() const override { return "shm"; }
  std::string address_scheme() const override { return "ipc"; }
  std::string local_address(const std::string& name) override { return ipc_->local_address(name); }

  std::unique_ptr<Listener> listen(const std::string& address, const ListenOptions& opt) override {
    check(address);
    return std::make_unique<ShmListener>(ipc_->listen(address, opt), opt);
  }
  std::unique_ptr<Connections> connect(const std::vector<std::string>& addresses, const ConnectOptions& opt) override {
    for (const auto& a : addresses) check(a);
    return std::make_unique<ShmConnections>(ipc_->connect(addresses, opt));
  }

 private:
  static void check(const std::string& address) {
    if (address.rfind("ipc://", 0) != 0 || address.size() == 6)
      throw std::invalid_argument("\"" + address + "\" is not an address of the shm transport (ipc:///PATH: its headers "
                                  "go over Unix sockets, its payloads through shared memory; cluster.transport = \"shm\")");
  }
  std::unique_ptr<Transport> ipc_;  // headers
};

}  // namespace

std::unique_ptr<Transport> make_shm_transport() { return std::make_unique<ShmTransport>(); }

}  // namespace pslab::comm
