#include "comm/collective.h"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "comm/memfd.h"
#include "cuda_plugin.h"

namespace pslab {

std::string Collective::timeout_message(const std::string& what, long step, const std::string& cause) {
  return what + (step >= 0 ? " of step " + std::to_string(step) : std::string()) + " on rank " +
         std::to_string(rank()) + " failed (timeout " + std::to_string(rv_.timeout().count() / 1000) + " s): " + cause +
         "; " + rv_.laggards(step);
}

void Collective::allreduce_sum_half(float*, std::size_t, HalfFormat format, float, long) {
  throw std::runtime_error(std::string("an all-reduce in ") + (format == HalfFormat::f16 ? "f16" : "bf16") + " is not implemented for " +
                           describe() + "; cluster.codec = \"f32\" all-reduces float32");
}

namespace {

class GlooCollective final : public Collective {
 public:
  GlooCollective(RendezvousClient& rv, const std::string& host) : Collective(rv) {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    device_ = gloo::transport::tcp::CreateDevice(attr);
    context_ = std::make_shared<gloo::rendezvous::Context>(rv.rank(), rv.world());
    context_->setTimeout(rv.timeout());
    gloo::rendezvous::PrefixStore store("gloo", rv);
    try {
      context_->connectFullMesh(store, device_);
    } catch (const std::exception& e) {
      throw std::runtime_error(timeout_message("Gloo connect", -1, e.what()));
    }
  }
  std::string describe() const override {
    return "gloo (tcp, " + std::to_string(size()) + " ranks; " +
           (power_of_two() ? size() == 2 ? "recursive doubling" : "recursive doubling up to 2 MiB, then ring" : "ring") + ")";
  }
  void allreduce_sum(float* data, std::size_t n, long step) override {
    if (n == 0 || size() == 1) return;
    if (use_doubling(n)) return doubling_sum(data, n, step);
    ring_allreduce(data, n, static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>), step);
  }
  // gloo::allreduce (a ring) of n elements of T in place, combined by `reduce`.
  template <typename T>
  void ring_allreduce(T* data, std::size_t n, gloo::AllreduceOptions::Func reduce, long step) {
    gloo::AllreduceOptions opts(context_);
    opts.setInput(data, n);
    opts.setOutput(data, n);
    opts.setReduceFunction(std::move(reduce));
    opts.setTag(tag_++);
    opts.setTimeout(rv_.timeout());
    try {
      gloo::allreduce(opts);
    } catch (const std::exception& e) {
      throw std::runtime_error(timeout_message("all-reduce", step, e.what()));
    }
  }
  bool reduces_half() const override { return true; }
  // 16-bit values through Gloo's ring, each hop adding in float32 and rounding to `format`.
  void allreduce_sum_half(float* data, std::size_t n, HalfFormat format, float scale, long step) override {
    if (n == 0) return;
    if (half_buf_.size() < n) half_buf_.resize(n);
    encode_half_scaled(format, data, n, scale, half_buf_.data());
    if (size() > 1)
      ring_allreduce(half_buf_.data(), n,
                     [format](void* c, const void* a, const void* b, std::size_t k) { add_half(format, a, b, k, c); }, step);
    decode_half_scaled(format, half_buf_.data(), n, scale, data);
  }
  // A power-of-two group: recursive doubling. In round r each rank swaps its whole buffer
  // with the rank whose number differs in bit r and adds what it receives: log2(W) rounds
  // instead of the ring's 2 (W - 1). Partners compute a + b and b + a, which are exactly
  // equal, so after every round partners (and in the end all ranks) hold bitwise the same
  // sums. It sends log2(W) buffers per rank against the ring's 2 (W - 1) / W: the same for
  // 2 ranks; for larger groups fewer rounds win while buffers are small (4 ranks on 2 cores:
  // 235K floats 5.9 -> 3.3-4.2 ms, 512K about even, 1M floats the ring is faster).
  void doubling_sum(float* data, std::size_t n, long step) {
    const Registration& reg = registration(data, n);
    const gloo::Slot slot = gloo::Slot::build(kDoublingSlot, tag_++);
    std::uint8_t round = 0;
    for (int bit = 1; bit < size(); bit <<= 1, ++round) {
      const int peer = rank() ^ bit;
      reg.in->recv(peer, slot + round);
      reg.out->send(peer, slot + round);
      try {
        if (!reg.in->waitRecv(rv_.timeout())) throw std::runtime_error("receive from rank " + std::to_string(peer) + " aborted");
        if (!reg.out->waitSend(rv_.timeout())) throw std::runtime_error("send to rank " + std::to_string(peer) + " aborted");
      } catch (const std::exception& e) {
        throw std::runtime_error(timeout_message("all-reduce", step, e.what()));
      }
      const float* other = peer_buf_.data();
      for (std::size_t i = 0; i < n; ++i) data[i] += other[i];
    }
  }
  // The buffers' registrations are kept while the buffers stay the same: the gradient every
  // step, or each of its buckets (a handful; the cache starts over if it ever grows past 64).
  struct Registration {
    const float* data;
    std::size_t bytes;
    std::unique_ptr<gloo::transport::UnboundBuffer> out, in;  // data; the partner's part of peer_buf_
  };
  const Registration& registration(float* data, std::size_t n) {
    const std::size_t bytes = n * sizeof(float);
    if (peer_buf_.size() < n) {
      peer_buf_.assign(n, 0.0f);
      for (Registration& r : regs_) r.in.reset();
    }
    auto it = std::find_if(regs_.begin(), regs_.end(), [&](const Registration& r) { return r.data == data && r.bytes == bytes; });
    if (it == regs_.end()) {
      if (regs_.size() >= 64) regs_.clear();
      regs_.push_back(Registration{data, bytes, context_->createUnboundBuffer(data, bytes), nullptr});
      it = regs_.end() - 1;
    }
    if (!it->in) it->in = context_->createUnboundBuffer(peer_buf_.data(), bytes);
    return *it;
  }
  bool power_of_two() const { return (size() & (size() - 1)) == 0; }
  bool use_doubling(std::size_t n) const { return power_of_two() && (size() == 2 || n <= kDoublingMaxFloats); }

  void broadcast(float* data, std::size_t n, int root) override {
    if (n == 0 || size() == 1) return;
    gloo::BroadcastOptions opts(context_);
    if (rank() == root) opts.setInput(data, n);
    opts.setOutput(data, n);
    opts.setRoot(root);
    opts.setTag(tag_++);
    opts.setTimeout(rv_.timeout());
    try {
      gloo::broadcast(opts);
    } catch (const std::exception& e) {
      throw std::runtime_error(timeout_message("broadcast", -1, e.what()));
    }
  }
  void barrier() override {
    if (size() == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag_++);
    opts.setTimeout(rv_.timeout());
    try {
      gloo::barrier(opts);
    } catch (const std::exception& e) {
      throw std::runtime_error(timeout_message("barrier", -1, e.what()));
    }
  }

 private:
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::uint32_t tag_ = 0;
  std::vector<float> peer_buf_;  // the partner's buffer (doubling_sum)
  std::vector<std::uint16_t> half_buf_;  // allreduce_sum_half's 16-bit values
  std::vector<Registration> regs_;  // doubling_sum's
  static constexpr std::uint8_t kDoublingSlot = 0x50;
  static constexpr std::size_t kDoublingMaxFloats = std::size_t(1) << 19;  // 2 MiB, groups > 2
};

}  // namespace

std::unique_ptr<Collective> make_gloo_collective(RendezvousClient& rv, const std::string& host) {
  return std::make_unique<GlooCollective>(rv, host);
}

bool nccl_built() {
#ifdef PSLAB_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Collective> make_nccl_collective(RendezvousClient& rv, int device) {
  if (!nccl_built())
    throw std::runtime_error("the NCCL collective is not in this build of pslab (CUDA toolkit or NCCL not found at configure time)");
  std::string why;  // (it is in a CUDA plugin of its own: src/comm/collective_nccl.cpp)
  using MakeNccl = Collective* (*)(RendezvousClient* rv, int device);
  const auto make = reinterpret_cast<MakeNccl>(cuda_plugin_symbol("libpslab_nccl.so", "pslab_nccl_collective", &why));
  if (!make) throw std::runtime_error("the NCCL collective cannot be used: " + why);
  return std::unique_ptr<Collective>(make(&rv, device));
}

namespace {
// The ranks whose shared-memory domain (host) differs from rank 0's, as "rank 2 (on ...)";
// empty when all share it. Every rank publishes its own and reads all.
std::string ranks_on_other_hosts(RendezvousClient& rv) {
  const std::string mine = comm::shared_memory_domain();
  rv.set("host/" + std::to_string(rv.rank()), std::vector<char>(mine.begin(), mine.end()));
  std::string first, others;
  for (int q = 0; q < rv.world(); ++q) {
    const std::vector<char> v = rv.get("host/" + std::to_string(q));
    const std::string d(v.begin(), v.end());
    if (q == 0) first = d;
    else if (d != first) others += (others.empty() ? "" : ", ") + std::string("rank ") + std::to_string(q) + " (" + d + ")";
  }
  return others.empty() ? others : others + " not on rank 0's host (" + first + ")";
}
}  // namespace

namespace {
// shm when every rank is on one host; else Gloo ("auto") or an error ("shm").
std::unique_ptr<Collective> make_shm_or(RendezvousClient& rv, const std::string& host, bool gloo_across_hosts) {
  const std::string elsewhere = rv.world() > 1 ? ranks_on_other_hosts(rv) : std::string();
  if (elsewhere.empty()) return make_shm_collective(rv);
  if (gloo_across_hosts) return make_gloo_collective(rv, host);
  throw std::runtime_error("cluster.transport = \"shm\" needs every all-reduce rank on one host: " + elsewhere);
}

std::unique_ptr<Collective> make_host_collective(RendezvousClient& rv, const std::string& host, const std::string& transport) {
  for (const auto& e : host_collective_registry().entries())
    if (e.name == transport) return e.make(transport)->make(rv, host);
  return make_gloo_collective(rv, host);  // a transport with no entry: Gloo over TCP
}

struct Gloo final : HostCollective {
  std::unique_ptr<Collective> make(RendezvousClient& rv, const std::string& host) const override {
    return make_gloo_collective(rv, host);
  }
};
struct ShmOrGloo final : HostCollective {
  explicit ShmOrGloo(bool gloo) : gloo_across_hosts(gloo) {}
  std::unique_ptr<Collective> make(RendezvousClient& rv, const std::string& host) const override {
    return make_shm_or(rv, host, gloo_across_hosts);
  }
  bool gloo_across_hosts;
};
}  // namespace

Registry<HostCollective>& host_collective_registry() {
  static Registry<HostCollective> r("host collective", {
      {"tcp", "tcp", "Gloo over TCP", false, [](const std::string&) { return std::make_unique<Gloo>(); }},
      {"ipc", "ipc", "Gloo over TCP", false, [](const std::string&) { return std::make_unique<Gloo>(); }},
      {"shm", "shm", "shared memory (every rank on one host)", false,
       [](const std::string&) { return std::make_unique<ShmOrGloo>(false); }},
      {"auto", "auto", "shared memory when every rank is on one host, else Gloo", false,
       [](const std::string&) { return std::make_unique<ShmOrGloo>(true); }},
  });
  return r;
}

std::string ranks_sharing_a_gpu(const std::vector<std::string>& gpu_of_rank) {
  std::map<std::string, std::vector<int>> ranks;  // "host|bus id" -> its ranks, ascending
  for (std::size_t r = 0; r < gpu_of_rank.size(); ++r) ranks[gpu_of_rank[r]].push_back(int(r));
  std::string out;
  for (const auto& [where, rs] : ranks) {
    if (rs.size() < 2) continue;
    std::string list;
    for (const int r : rs) list += (list.empty() ? "" : ", ") + std::to_string(r);
    const std::size_t bar = where.find('|');
    out += (out.empty() ? "" : "; ") + std::string("ranks ") + list + " on GPU " + where.substr(bar + 1) + " of " +
           where.substr(0, bar);
  }
  return out;
}

std::unique_ptr<Collective> make_collective(Backend& be, RendezvousClient& rv, const std::string& host,
                                            const std::string& transport, const std::string& collective) {
  if (be.device() != Device::cuda) {
    if (collective == "nccl")
      throw std::invalid_argument("cluster.collective = \"nccl\" needs train.device = \"cuda\"");
    return make_host_collective(rv, host, transport);
  }
  if (collective == "nccl") return make_nccl_collective(rv, be.gpu());
  if (collective == "gloo")
    return make_host_staged_collective(rv, be, make_host_collective(rv, host, transport), "cluster.collective = \"gloo\"");
  if (collective != "auto")
    throw std::invalid_argument("cluster.collective: expected \"auto\", \"nccl\" or \"gloo\", got \"" + collective + "\"");
  // Every rank says where it computes and reads where the others do, so all decide alike.
  const std::string mine = comm::shared_memory_domain() + "|" + be.gpu_bus_id();
  rv.set("gpu/" + std::to_string(rv.rank()), std::vector<char>(mine.begin(), mine.end()));
  std::vector<std::string> gpu_of_rank;
  for (int q = 0; q < rv.world(); ++q) {
    const std::vector<char> v = rv.get("gpu/" + std::to_string(q));
    gpu_of_rank.emplace_back(v.begin(), v.end());
  }
  const std::string shared = ranks_sharing_a_gpu(gpu_of_rank);
  if (shared.empty() && nccl_built()) return make_nccl_collective(rv, be.gpu());
  return make_host_staged_collective(rv, be, make_host_collective(rv, host, transport),
                                     shared.empty() ? "this build has no NCCL" : shared);
}

}  // namespace pslab
