// The shm collective: ranks on one host with CPU buffers reduce through one shared segment
// that rank 0 makes and every rank maps (comm/memfd.h). Nothing goes through the kernel but
// the futex of a barrier.
//
//   segment: Control | in[0] .. in[W-1] | out[0] | out[1]     (each `capacity` floats, 64-byte aligned)
//   all-reduce of n floats, the c-th call:
//     1. data -> in[rank]                         2. barrier
//     3. out[c % 2][chunk rank] = in[0] + in[1] + ... + in[W-1] on this rank's chunk, in rank
//        order: each chunk is summed once, so every rank ends with bitwise the same sums
//     4. barrier                                  5. out[c % 2] -> data
//   A rank that runs ahead into call c+1 writes the other out buffer while a slow one still
//   copies from this one; it cannot get two calls ahead (barrier 4 of c+1 needs everyone).
//   A broadcast: root's data -> in[root], barrier, the others copy it, barrier.
//
// Making (or growing) the segment ends with a barrier, so that rank 0 holds it open until every
// rank has mapped it. Barriers: one shared arrival counter (also the futex word); the k-th barrier of this segment
// is passed when the counter reaches k * W. A waiter spins a few microseconds when every rank
// can have a core, then sleeps on the futex; every wait has the group's timeout and then names
// the ranks that had not arrived; a rank whose process is gone (checked every 100 ms of waiting)
// ends the wait at once, named. A larger buffer than the segment holds makes rank 0 publish a
// new segment through the rendezvous (all ranks make the same calls, so all switch together).
//
// Threading: one thread per rank (like every Collective).
#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "comm/collective.h"
#include "comm/memfd.h"

namespace pslab {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kSegmentName[] = "pslab-collective";
constexpr std::uint64_t kMagic = 0x50534c41425f4152;  // "PSLAB_AR"
constexpr int kMaxRanks = 256;
constexpr std::size_t kAlign = 16;  // floats: 64 bytes

struct Control {
  std::uint64_t magic;
  std::uint64_t capacity;  // floats per buffer
  std::uint32_t world;
  alignas(64) std::atomic<std::uint32_t> arrivals;  // all ranks' barrier arrivals; the futex word
  std::atomic<std::uint32_t> sleepers;               // ranks asleep on it (a wake is needed)
  alignas(64) std::atomic<std::uint32_t> reached[kMaxRanks];  // barriers each rank has arrived at
  std::atomic<std::int32_t> pid[kMaxRanks];                   // each rank's process, once it has mapped the segment
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
constexpr std::size_t kControlBytes = (sizeof(Control) + 63) / 64 * 64;

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t val, const timespec* ts) {
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, val, ts, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

class ShmCollective final : public Collective {
 public:
  explicit ShmCollective(RendezvousClient& rv) : Collective(rv) {
    if (size() > kMaxRanks) throw std::invalid_argument("the shm collective takes at most " + std::to_string(kMaxRanks) + " ranks");
    spin_ = size() <= int(std::thread::hardware_concurrency());
    if (size() > 1) attach(std::size_t(1) << 16);
  }
  std::string describe() const override {
    return "shared memory (" + std::to_string(size()) + " ranks on one host)";
  }

  void allreduce_sum(float* data, std::size_t n, long step) override {
    if (n == 0 || size() == 1) return;
    if (n > capacity_) attach(n);
    const int W = size(), r = rank();
    std::memcpy(in(r), data, n * sizeof(float));
    barrier_or_throw("all-reduce", step);
    const std::size_t chunk = ((n + std::size_t(W) - 1) / std::size_t(W) + kAlign - 1) / kAlign * kAlign;
    const std::size_t lo = std::min(n, chunk * std::size_t(r)), hi = std::min(n, lo + chunk);
    float* __restrict out = out_buf(calls_ % 2);
    if (hi > lo) {
      const float* __restrict a = in(0);
      const float* __restrict b = in(1);
      for (std::size_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
      for (int q = 2; q < W; ++q) {
        const float* __restrict c = in(q);
        for (std::size_t i = lo; i < hi; ++i) out[i] += c[i];
      }
    }
    barrier_or_throw("all-reduce", step);
    std::memcpy(data, out, n * sizeof(float));
    ++calls_;
  }

  bool reduces_half() const override { return true; }
  // As allreduce_sum with 16-bit values in the buffers (half the bytes): each chunk summed in
  // float32 in rank order and rounded once.
  void allreduce_sum_half(float* data, std::size_t n, HalfFormat format, float scale, long step) override {
    if (n == 0) return;
    if (size() == 1) {  // the one rank's values, rounded as they would travel
      for (std::size_t i = 0; i < n; ++i) data[i] = from_half(format, to_half(format, data[i] * scale)) / scale;
      return;
    }
    if ((n + 1) / 2 > capacity_) attach((n + 1) / 2);
    const int W = size(), r = rank();
    auto in16 = [&](int q) { return reinterpret_cast<std::uint16_t*>(in(q)); };
    encode_half_scaled(format, data, n, scale, in16(r));
    barrier_or_throw("all-reduce", step);
    const std::size_t chunk = ((n + std::size_t(W) - 1) / std::size_t(W) + kAlign - 1) / kAlign * kAlign;
    const std::size_t lo = std::min(n, chunk * std::size_t(r)), hi = std::min(n, lo + chunk);
    std::uint16_t* out = reinterpret_cast<std::uint16_t*>(out_buf(calls_ % 2));
    constexpr std::size_t kBlock = 512;
    float sum[kBlock], term[kBlock];
    for (std::size_t b = lo; b < hi; b += kBlock) {
      const std::size_t k = std::min(kBlock, hi - b);
      decode_half(format, in16(0) + b, k, sum);
      for (int q = 1; q < W; ++q) {
        decode_half(format, in16(q) + b, k, term);
        for (std::size_t i = 0; i < k; ++i) sum[i] += term[i];
      }
      encode_half(format, sum, k, out + b);
    }
    barrier_or_throw("all-reduce", step);
    decode_half_scaled(format, out, n, scale, data);
    ++calls_;
  }

  void broadcast(float* data, std::size_t n, int root) override {
    if (n == 0 || size() == 1) return;
    if (n > capacity_) attach(n);
    if (rank() == root) std::memcpy(in(root), data, n * sizeof(float));
    barrier_or_throw("broadcast", -1);
    if (rank() != root) std::memcpy(data, in(root), n * sizeof(float));
    barrier_or_throw("broadcast", -1);
  }

  void barrier() override {
    if (size() > 1) barrier_or_throw("barrier", -1);
  }

 private:
  float* buffer(int i) const {
    return reinterpret_cast<float*>(static_cast<std::byte*>(segment_->base()) + kControlBytes) + std::size_t(i) * capacity_;
  }
  float* in(int q) const { return buffer(q); }
  float* out_buf(long parity) const { return buffer(size() + int(parity)); }
  Control* control() const { return static_cast<Control*>(segment_->base()); }

  // Rank 0 makes a segment whose buffers hold `floats` and publishes it; the others map it.
  void attach(std::size_t floats) {
    const std::size_t cap = (floats + kAlign - 1) / kAlign * kAlign;
    const std::string key = "shm-collective/" + std::to_string(generation_++);
    if (rank() == 0) {
      const auto before = std::move(segment_);  // (a segment grown: the ranks' processes are known)
      segment_ = comm::MemfdSegment::create(kSegmentName, kControlBytes + std::size_t(size() + 2) * cap * sizeof(float));
      Control* c = control();
      c->capacity = cap;
      c->world = std::uint32_t(size());
      c->magic = kMagic;  // the segment is zero-filled: counters start at 0
      // A rank that died before it maps the new segment is then seen gone at its setup barrier
      // (with an empty table it was waited for until the timeout).
      if (before)
        for (int q = 0; q < size(); ++q)
          c->pid[q].store(static_cast<const Control*>(before->base())->pid[q].load(std::memory_order_relaxed),
                          std::memory_order_relaxed);
      const std::string where = std::to_string(::getpid()) + " " + std::to_string(segment_->fd());
      rv_.set(key, std::vector<char>(where.begin(), where.end()));
    } else {
      const std::vector<char> v = rv_.get(key);
      long pid = 0, fd = -1;
      if (std::sscanf(std::string(v.begin(), v.end()).c_str(), "%ld %ld", &pid, &fd) != 2)
        throw std::runtime_error("shm collective: rank 0 published a malformed segment address for " + key);
      std::string why;
      segment_ = comm::map_peer_memfd(pid_t(pid), int(fd), kSegmentName, why);
      if (!segment_)
        throw std::runtime_error("shm collective: rank " + std::to_string(rank()) + " cannot map rank 0's segment (" + why +
                                 "); are all ranks on one host and run by one user? (cluster.transport = \"tcp\" uses Gloo)");
      const Control* c = control();
      if (c->magic != kMagic || c->world != std::uint32_t(size()) || c->capacity != cap ||
          segment_->size() < kControlBytes + std::size_t(size() + 2) * cap * sizeof(float))
        throw std::runtime_error("shm collective: rank 0's segment for " + key + " does not match this group");
    }
    control()->pid[rank()].store(std::int32_t(::getpid()), std::memory_order_relaxed);
    capacity_ = cap;
    barriers_ = 0;
    barrier_or_throw("shared-memory setup", -1);  // rank 0 keeps the segment open until all have mapped it
  }

  // Arrives at the next barrier and waits for every rank, up to the group's timeout.
  void barrier_or_throw(const char* what, long step) {
    Control* c = control();
    const std::uint32_t k = ++barriers_;
    const std::uint32_t target = k * std::uint32_t(size());
    c->reached[rank()].store(k, std::memory_order_relaxed);
    if (c->arrivals.fetch_add(1, std::memory_order_acq_rel) + 1 == target) {
      if (c->sleepers.load(std::memory_order_seq_cst) > 0) futex(&c->arrivals, FUTEX_WAKE, INT32_MAX, nullptr);
      return;
    }
    auto passed = [&] { return std::int32_t(c->arrivals.load(std::memory_order_acquire) - target) >= 0; };
    if (spin_) {
      const auto until = Clock::now() + std::chrono::microseconds(50);
      for (int i = 0; !passed(); ++i) {
        cpu_relax();
        if ((i & 63) == 63 && Clock::now() > until) break;
      }
    }
    const auto deadline = Clock::now() + rv_.timeout();
    auto next_check = Clock::now() + std::chrono::milliseconds(100);
    while (!passed()) {
      const auto now = Clock::now();
      if (now >= deadline) throw std::runtime_error(timeout_message(what, step, missing(k)));
      if (now >= next_check) {
        next_check = now + std::chrono::milliseconds(100);
        if (const std::string gone = exited(k); !gone.empty())
          throw std::runtime_error(std::string(what) + (step >= 0 ? " of step " + std::to_string(step) : std::string()) +
                                   " on rank " + std::to_string(rank()) + " failed: " + gone);
      }
      const auto slice = std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(100));
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
      const timespec ts{time_t(ns / 1000000000), long(ns % 1000000000)};
      c->sleepers.fetch_add(1, std::memory_order_seq_cst);
      const std::uint32_t seen = c->arrivals.load(std::memory_order_seq_cst);
      if (std::int32_t(seen - target) < 0) futex(&c->arrivals, FUTEX_WAIT, seen, &ts);
      c->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  // The ranks that have not reached barrier k and whose process is gone ("" if none): a dead
  // peer ends the wait at once instead of at the timeout.
  std::string exited(std::uint32_t k) const {
    std::string s;
    for (int q = 0; q < size(); ++q) {
      const std::int32_t pid = control()->pid[q].load(std::memory_order_relaxed);
      if (pid <= 0 || std::int32_t(control()->reached[q].load(std::memory_order_relaxed) - k) >= 0) continue;
      if (::kill(pid, 0) != 0 && errno == ESRCH)
        s += (s.empty() ? "" : ", ") + std::string("rank ") + std::to_string(q) + " (process " + std::to_string(pid) + ") exited";
    }
    return s.empty() ? s : s + " before shared-memory barrier " + std::to_string(k);
  }

  // "waited at barrier k of the shared segment for rank 1 (at barrier k-1), ..."
  std::string missing(std::uint32_t k) const {
    std::string s;
    for (int q = 0; q < size(); ++q) {
      const std::uint32_t at = control()->reached[q].load(std::memory_order_relaxed);
      if (std::int32_t(at - k) < 0)
        s += (s.empty() ? "" : ", ") + std::string("rank ") + std::to_string(q) + " (at barrier " + std::to_string(at) + ")";
    }
    return "waited " + std::to_string(rv_.timeout().count() / 1000.0).substr(0, 5) + " s at shared-memory barrier " +
           std::to_string(k) + " for " + (s.empty() ? std::string("no rank (all arrived late)") : s);
  }

  std::unique_ptr<comm::MemfdSegment> segment_;
  std::size_t capacity_ = 0;  // floats per buffer
  std::uint32_t barriers_ = 0;  // barriers this rank has arrived at in this segment
  long calls_ = 0;              // all-reduces (which out buffer)
  int generation_ = 0;          // segments made
  bool spin_ = false;
};

}  // namespace

std::unique_ptr<Collective> make_shm_collective(RendezvousClient& rv) { return std::make_unique<ShmCollective>(rv); }

}  // namespace pslab
