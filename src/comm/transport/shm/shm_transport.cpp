#include "comm/transport/shm/shm_transport.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <algorithm>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "comm/interrupt.h"
#include "comm/memfd.h"
#include "comm/transport/shm/unix_packets.h"
#include "comm/transport/zmq/zmq_transport.h"

namespace pslab::comm {
namespace {

// The head of every segment: its id and a table of loans. A loan is one payload lent to one
// receiver, [offset, offset + length) of the segment: busy from send until the receiver is
// done. A slot (a payload copied in) has one loan; a region (Transport::payload_memory, e.g. a
// server's θ versions) has kRegionLoans, so that one version can be lent to many workers.
struct Loan {
  std::atomic<std::uint32_t> busy;  // 1 from send until the receiver is done
  std::uint32_t generation;         // the loan's current use
};
constexpr std::uint32_t kRegionLoans = 64;
struct SegmentHeader {
  std::uint64_t segment_id;  // random; what a reference must name
  std::uint64_t size;        // bytes of the segment, header included
  std::uint32_t loans;       // entries of `loan` in use
  std::uint32_t unused;
  Loan loan[kRegionLoans];
};
constexpr std::size_t kDataOffset = (sizeof(SegmentHeader) + 63) / 64 * 64;  // payloads start here
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
constexpr char kSegmentName[] = "pslab-shm";  // memfd name; /proc/PID/fd/FD reads "/memfd:pslab-shm (deleted)"

// A memfd segment of a sender, mapped: a slot or a region. Threading: loans are taken with an
// atomic exchange (a region may be sent from by several listeners or connections); the
// receiver (another process) only clears `busy`.
class Segment {
 public:
  Segment(std::size_t capacity, std::uint32_t loans)
      : mem_(MemfdSegment::create(kSegmentName, kDataOffset + capacity)), pid_(std::uint32_t(::getpid())) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    head()->segment_id = rng();
    head()->size = mem_->size();
    head()->loans = loans;
  }

  SegmentHeader* head() const { return static_cast<SegmentHeader*>(mem_->base()); }
  std::byte* data() const { return static_cast<std::byte*>(mem_->base()) + kDataOffset; }
  std::size_t capacity() const { return mem_->size() - kDataOffset; }
  bool contains(const void* p, std::size_t n) const {
    const auto* b = static_cast<const std::byte*>(p);
    return b >= data() && n <= capacity() && std::size_t(b - data()) <= capacity() - n;
  }
  bool free(std::uint32_t k) const { return head()->loan[k].busy.load(std::memory_order_acquire) == 0; }

  // Lends [p, p + n) (inside the segment) through a free loan: false if every loan is out.
  bool lend(const void* p, std::size_t n, ShmRef& ref) {
    for (std::uint32_t k = 0; k < head()->loans; ++k) {
      Loan& l = head()->loan[k];
      if (l.busy.load(std::memory_order_relaxed) != 0 || l.busy.exchange(1, std::memory_order_acquire) != 0) continue;
      ++l.generation;
      ref = ShmRef{kShmRefMagic, pid_, mem_->fd(), k, l.generation, 0, head()->segment_id,
                   std::uint64_t(static_cast<const std::byte*>(p) - static_cast<std::byte*>(mem_->base())), n};
      return true;
    }
    return false;
  }
  // Copies the payload into a slot (loan 0) and lends it.
  ShmRef fill(const void* data, std::size_t n) {
    if (n) std::memcpy(this->data(), data, n);
    ShmRef ref{};
    if (!lend(this->data(), n, ref)) throw std::logic_error("shm transport: filled a slot that is in use");
    return ref;
  }
  void abandon(std::uint32_t k) { head()->loan[k].busy.store(0, std::memory_order_release); }
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
      if (!s.free(0)) continue;
      if (s.capacity() < n) {
        small_free = i;
        continue;
      }
      if (!best || s.capacity() < best->capacity()) best = &s;
    }
    if (best) return best;
    if (slots_.size() < kMaxSlots) return slots_.emplace_back(std::make_unique<Segment>(n, 1)).get();
    if (small_free < slots_.size()) return (slots_[small_free] = std::make_unique<Segment>(n, 1)).get();  // grows one
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
    if (s->fd() == ref.fd) s->abandon(ref.loan);
}

bool ShmSlots::busy() const { return held() > 0; }

std::size_t ShmSlots::held() const {
  std::size_t n = 0;
  for (const auto& s : pool_->slots_) n += !s->free(0);
  return n;
}

namespace {

// The regions of one shm transport (Transport::payload_memory), shared with its listeners and
// connections, which lend payloads that lie in one instead of copying them.
// Threading: any thread (a mutex).
class Regions {
 public:
  void add(Segment* s) {
    std::lock_guard<std::mutex> lock(mu_);
    segments_.push_back(s);
  }
  void remove(Segment* s) {
    std::lock_guard<std::mutex> lock(mu_);
    segments_.erase(std::remove(segments_.begin(), segments_.end(), s), segments_.end());
  }
  // The region [p, p + n) lies in, or nullptr.
  Segment* find(const void* p, std::size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Segment* s : segments_)
      if (s->contains(p, n)) return s;
    return nullptr;
  }

 private:
  std::mutex mu_;
  std::vector<Segment*> segments_;
};

class ShmRegion final : public PayloadMemory {
 public:
  ShmRegion(std::shared_ptr<Regions> regions, std::size_t bytes)
      : regions_(std::move(regions)), segment_(bytes, kRegionLoans) {
    regions_->add(&segment_);
  }
  ~ShmRegion() override { regions_->remove(&segment_); }
  void* data() const override { return segment_.data(); }
  std::size_t size() const override { return segment_.capacity(); }

 private:
  std::shared_ptr<Regions> regions_;
  Segment segment_;
};

// What one listener or connections sends through shared memory: payloads copied into its
// slots, and payloads lent from regions, whose release functions it calls once their receivers
// are done (checked on every send and receive). Threading: the owner's thread.
class Sender {
 public:
  explicit Sender(std::shared_ptr<Regions> regions) : regions_(std::move(regions)) {}
  ~Sender() {
    for (auto& l : lent_) release(l.payload);  // the receivers keep their mappings
  }

  // The reference to send for `payload`, which is released (now, or once its receiver is done);
  // false if no slot is free now (the payload is kept: try again, or release it).
  bool reference(OutPayload& payload, ShmRef& ref) {
    poll();
    if (payload.release) {
      if (Segment* region = regions_->find(payload.data, payload.size); region && region->lend(payload.data, payload.size, ref)) {
        lent_.push_back({region, ref.loan, payload});
        payload = {};
        return true;
      }
    }
    if (!slots_.put(payload.data, payload.size, ref)) return false;
    release(payload);
    return true;
  }
  // `ref` (from reference()) was not sent: its loan is free again.
  void unsent(const ShmRef& ref) {
    for (auto it = lent_.begin(); it != lent_.end(); ++it)
      if (it->region->fd() == ref.fd && it->loan == ref.loan) {
        it->region->abandon(it->loan);
        release(it->payload);
        lent_.erase(it);
        return;
      }
    slots_.abandon(ref);
  }
  // Waits until every receiver is done with what this sender sent, or until `deadline`. A
  // receiver opens a segment through /proc/<this pid>/fd when it first sees it, so a sender
  // that exits at once after sending can leave its last message unreadable.
  void wait_until_taken(Deadline deadline) {
    for (poll(); (!lent_.empty() || slots_.busy()) && Clock::now() < deadline; poll())
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // Payloads sent that their receivers still hold (copied or lent).
  std::size_t held() {
    poll();
    return slots_.held() + lent_.size();
  }
  // Releases the lent payloads whose receivers are done.
  void poll() {
    for (std::size_t i = 0; i < lent_.size();) {
      if (lent_[i].region->free(lent_[i].loan)) {
        release(lent_[i].payload);
        lent_[i] = lent_.back();
        lent_.pop_back();
      } else {
        ++i;
      }
    }
  }

 private:
  struct Lent {
    Segment* region;
    std::uint32_t loan;
    OutPayload payload;
  };
  std::shared_ptr<Regions> regions_;
  ShmSlots slots_;
  std::vector<Lent> lent_;
};

}  // namespace

namespace {

// A sender's segment as a receiver maps it.
struct Mapping {
  std::unique_ptr<MemfdSegment> mem;
  void* base() const { return mem->base(); }
  std::size_t size() const { return mem->size(); }
  SegmentHeader* head() const { return static_cast<SegmentHeader*>(mem->base()); }
};

// A received message's storage: the inner (ZeroMQ) message and the loan its payload lies in,
// handed back when the next receive into the same Message starts or the Message goes.
struct ShmHeld final : Message::Storage {
  Message inner;
  std::shared_ptr<Mapping> mapping;
  std::uint32_t loan = 0;
  void give_back() {
    if (mapping) mapping->head()->loan[loan].busy.store(0, std::memory_order_release);
    mapping.reset();
  }
  void payload_done() override { give_back(); }
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
    held.mapping = std::move(mapping);  // (given back with the next receive, refused or not)
    held.loan = ref.loan;
    if (max_bytes_ && ref.length > max_bytes_)
      return m.set_malformed("shared-memory reference: a payload of " + std::to_string(ref.length) +
                                 " bytes, over the limit of " + std::to_string(max_bytes_),
                             in.wire_bytes());
    const auto* payload = static_cast<const std::byte*>(held.mapping->base()) + ref.offset;
    m.set(in.header(), {payload, std::size_t(ref.length)}, true, in.header().size() + std::size_t(ref.length));
  }

  // The mapping of the live slot `ref` names, or nullptr with why not.
  std::shared_ptr<Mapping> resolve(const ShmRef& ref, std::string& why) {
    if (ref.magic != kShmRefMagic) return why = "bad magic", nullptr;
    const auto key = std::make_pair(ref.pid, ref.fd);
    auto it = maps_.find(key);
    if (it == maps_.end() || it->second->head()->segment_id != ref.segment_id) {  // new, or the fd was reused
      auto fresh = open(ref, why);
      if (!fresh) return nullptr;
      it = maps_.insert_or_assign(key, std::move(fresh)).first;
    }
    SegmentHeader* h = it->second->head();
    const std::size_t size = it->second->size();
    if (h->segment_id != ref.segment_id) return why = "no segment " + std::to_string(ref.segment_id) + " at that fd", nullptr;
    if (ref.offset < kDataOffset || ref.offset > size || ref.length > size - ref.offset)
      return why = "a payload of " + std::to_string(ref.length) + " bytes at offset " + std::to_string(ref.offset) +
                   " of a segment of " + std::to_string(size),
             nullptr;
    if (ref.loan >= std::min(h->loans, kRegionLoans)) return why = "no loan " + std::to_string(ref.loan) + " in that segment", nullptr;
    const Loan& l = h->loan[ref.loan];
    if (l.generation != ref.generation || l.busy.load(std::memory_order_acquire) != 1)
      return why = "stale: generation " + std::to_string(ref.generation) + " of a loan now at " +
                   std::to_string(l.generation) + (l.busy.load() ? "" : " (not in use)"),
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
  ShmListener(std::unique_ptr<Listener> inner, const ListenOptions& o, std::shared_ptr<Regions> regions)
      : inner_(std::move(inner)), mappings_(o.max_message_bytes), sender_(std::move(regions)), linger_(o.linger) {}
  // As its connections do (ListenOptions::linger: a server's final replies): closing waits, at
  // most `linger`, until the peers are done with the payloads sent them (they were given back,
  // their slots gone, before a peer had mapped them: the last reply arrived malformed).
  ~ShmListener() override { sender_.wait_until_taken(Clock::now() + linger_); }
  const std::string& address() const override { return inner_->address(); }

  bool recv(Message& m, PeerId& from, Deadline deadline) override {
    sender_.poll();
    return mappings_.receive(m, [&](Message& inner) { return inner_->recv(inner, from, deadline); });
  }

  bool send(const PeerId& to, std::span<const std::byte> header, OutPayload payload) override {
    if (payload.empty()) {  // (a release function on no bytes is still called: the caller counts on it)
      release(payload);
      return inner_->send(to, header, {});
    }
    ShmRef ref;
    if (!sender_.reference(payload, ref)) {  // every slot still held by its receiver: dropped, like a full queue
      release(payload);
      return false;
    }
    if (inner_->send(to, header, OutPayload{&ref, sizeof ref})) return true;
    sender_.unsent(ref);
    return false;
  }
  void poll_items(std::vector<PollItem>& out) const override { inner_->poll_items(out); }

 private:
  std::unique_ptr<Listener> inner_;
  Mappings mappings_;
  Sender sender_;
  std::chrono::milliseconds linger_;
};

class ShmConnections final : public Connections {
 public:
  ShmConnections(std::unique_ptr<Connections> inner, std::shared_ptr<Regions> regions, const ConnectOptions& o)
      : inner_(std::move(inner)), mappings_(o.max_message_bytes), sender_(std::move(regions)), linger_(o.linger),
        queue_(std::size_t(std::max(1, o.queue))) {}
  // Like ZeroMQ's linger for queued messages: closing waits (at most `linger`) until the
  // listeners are done with the payloads sent them.
  ~ShmConnections() override { sender_.wait_until_taken(Clock::now() + linger_); }
  std::size_t size() const override { return inner_->size(); }
  const std::string& address(std::size_t k) const override { return inner_->address(k); }

  bool send(std::size_t k, std::span<const std::byte> header, OutPayload payload, Deadline deadline) override {
    if (payload.empty()) {
      release(payload);
      return inner_->send(k, header, {}, deadline);
    }
    ShmRef ref;
    // ConnectOptions::queue payloads held by their receivers at most (a snapshot sender's 2: a
    // slow evaluator skips snapshots), and while every slot is held
    while (sender_.held() >= queue_ || !sender_.reference(payload, ref)) {
      if (Clock::now() >= deadline) {
        release(payload);
        return false;
      }
      throw_if_interrupted();  // (a Python worker's Ctrl-C: heard while it waits, not at the deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (inner_->send(k, header, OutPayload{&ref, sizeof ref}, deadline)) return true;
    sender_.unsent(ref);
    return false;
  }

  bool recv(Message& m, std::size_t& from, Deadline deadline) override {
    sender_.poll();
    const bool got = mappings_.receive(m, [&](Message& inner) { return inner_->recv(inner, from, deadline); });
    sender_.poll();  // an answer usually means its receiver gave the payload back before answering
    return got;
  }
  void progress() override { sender_.poll(); }
  void poll_items(std::vector<PollItem>& out) const override { inner_->poll_items(out); }

 private:
  std::unique_ptr<Connections> inner_;
  Mappings mappings_;
  Sender sender_;
  std::chrono::milliseconds linger_;
  std::size_t queue_;
};

class ShmTransport final : public Transport {
 public:
  ShmTransport() : ipc_(make_zmq_transport("ipc")), regions_(std::make_shared<Regions>()) {}
  std::string name() const override { return "shm"; }
  std::string address_scheme() const override { return "ipc"; }
  std::string local_address(const std::string& name) override { return ipc_->local_address(name); }

  std::unique_ptr<Listener> listen(const std::string& address, const ListenOptions& opt) override {
    check(address);
    return std::make_unique<ShmListener>(listen_unix_packets(address, opt), opt, regions_);
  }
  std::unique_ptr<Connections> connect(const std::vector<std::string>& addresses, const ConnectOptions& opt) override {
    for (const auto& a : addresses) check(a);
    return std::make_unique<ShmConnections>(connect_unix_packets(addresses, opt), regions_, opt);
  }
  // Unix sockets in a private directory, segments mapped through /proc/PID/fd: only this user.
  void authenticate(const RunKey&) override {}
  std::unique_ptr<PayloadMemory> payload_memory(std::size_t bytes) override {
    return std::make_unique<ShmRegion>(regions_, bytes);
  }

 private:
  static void check(const std::string& address) {
    if (address.rfind("ipc://", 0) != 0 || address.size() == 6)
      throw std::invalid_argument("\"" + address + "\" is not an address of the shm transport (ipc:///PATH: its headers "
                                  "go over Unix sockets, its payloads through shared memory; cluster.transport = \"shm\")");
  }
  std::unique_ptr<Transport> ipc_;  // local_address(): the ipc transport's private directory
  std::shared_ptr<Regions> regions_;  // payload_memory(), which listeners and connections lend from
};

}  // namespace

std::unique_ptr<Transport> make_shm_transport() { return std::make_unique<ShmTransport>(); }

}  // namespace pslab::comm
