// The all-reduce of the virtual cluster's ranks (the host collective of the "sim" transport):
// every rank of the group hands its buffer in; when the last has, the sum is taken in rank order
// (so a run is deterministic), and every rank gets it once the modelled time has passed —
// virtual.allreduce_ms, or a ring over the links (Costs::ring_s) — counted from the last rank's
// arrival, as the ranks of a real all-reduce wait for the slowest. A rank missing for
// cluster.timeout_s fails the call, naming the ranks that did not arrive (asked of the
// coordinator, as every collective does).
#include <algorithm>
#include <cstring>

#include "comm/collective.h"
#include "comm/half.h"
#include "sim/sim_transport.h"

namespace pslab::sim {

namespace {

// The state the ranks of one group share: the call being gathered, or being handed out.
struct Group {
  explicit Group(int world) : parts(std::size_t(world)) {}
  std::vector<const float*> parts;  // per rank: its buffer for this call
  int arrived = 0, taken = 0;
  bool handing_out = false;          // every rank arrived: the result is there from ready_at
  std::vector<float> result;
  Scheduler::time_point ready_at{};
  std::vector<Scheduler::Thread*> waiting;
};

class SimCollective final : public Collective {
 public:
  SimCollective(RendezvousClient& rv, SimTransport& net) : Collective(rv), net_(net), s_(net.scheduler()) {
    auto& groups = net.shared<std::map<std::string, std::unique_ptr<Group>>>("sim collective groups");
    auto& g = groups[rv.endpoint()];
    if (!g) g = std::make_unique<Group>(rv.world());
    group_ = g.get();
  }
  std::string describe() const override { return "the virtual cluster's all-reduce (sim)"; }
  bool reduces_half() const override { return true; }

  void allreduce_sum(float* data, std::size_t n, long step) override {
    exchange("allreduce", step, data, n, n * sizeof(float), [&](std::vector<float>& out) {
      out.assign(n, 0.0f);
      for (const float* p : group_->parts)
        for (std::size_t i = 0; i < n; ++i) out[i] += p[i];
    });
  }
  // Each rank's values times `scale` rounded to `format`, summed in float32, the sum rounded
  // again and divided by `scale`: what a 16-bit wire carries (the ring's partial sums are
  // rounded on the way; here the whole sum once).
  void allreduce_sum_half(float* data, std::size_t n, HalfFormat format, float scale, long step) override {
    exchange("allreduce (16-bit)", step, data, n, n * 2, [&](std::vector<float>& out) {
      out.assign(n, 0.0f);
      for (const float* p : group_->parts)
        for (std::size_t i = 0; i < n; ++i) out[i] += from_half(format, to_half(format, p[i] * scale));
      for (float& x : out) x = from_half(format, to_half(format, x)) / scale;
    });
  }
  void broadcast(float* data, std::size_t n, int root) override {
    exchange("broadcast", -1, data, n, n * sizeof(float), [&](std::vector<float>& out) {
      out.assign(group_->parts[std::size_t(root)], group_->parts[std::size_t(root)] + n);
    });
  }
  void barrier() override {
    exchange("barrier", -1, nullptr, 0, 0, [](std::vector<float>& out) { out.clear(); });
  }

 private:
  // Hands `data` in, waits for every rank, and takes the result `combine` made of the parts.
  template <typename Combine>
  void exchange(const char* what, long step, float* data, std::size_t n, std::size_t wire_bytes, Combine combine) {
    Group& g = *group_;
    const auto deadline = s_.now() + rv_.timeout();
    wait_while([&] { return g.handing_out; }, deadline, what, step);  // the last call is still handed out
    g.parts[std::size_t(rank())] = data;
    if (++g.arrived == size()) {
      combine(g.result);
      const double cost = net_.costs().allreduce_s > 0 ? net_.costs().allreduce_s : net_.costs().ring_s(wire_bytes, size());
      g.ready_at = s_.now() + std::chrono::duration_cast<Scheduler::duration>(std::chrono::duration<double>(cost));
      g.handing_out = true;
      wake_all();
    }
    wait_while([&] { return !g.handing_out || s_.now() < g.ready_at; }, deadline, what, step);
    if (data && !g.result.empty()) std::memcpy(data, g.result.data(), n * sizeof(float));
    if (++g.taken == size()) {
      g.arrived = g.taken = 0;
      g.handing_out = false;
      wake_all();
    }
  }
  template <typename Pred>
  void wait_while(Pred pred, Scheduler::time_point deadline, const char* what, long step) {
    while (pred()) {
      if (s_.now() >= deadline) throw std::runtime_error(timeout_message(what, step, "timed out"));
      group_->waiting.push_back(s_.current());
      s_.wait_until(group_->handing_out && s_.now() < group_->ready_at ? std::min(group_->ready_at, deadline) : deadline);
    }
  }
  void wake_all() {
    for (Scheduler::Thread* t : group_->waiting) s_.wake(t);
    group_->waiting.clear();
  }

  SimTransport& net_;
  Scheduler& s_;
  Group* group_ = nullptr;
};

struct SimHostCollective final : HostCollective {
  std::unique_ptr<Collective> make(RendezvousClient& rv, const std::string&) const override {
    auto* net = dynamic_cast<SimTransport*>(&rv.transport());
    if (!net) throw std::logic_error("the sim collective needs the virtual cluster's transport");
    return std::make_unique<SimCollective>(rv, *net);
  }
};

}  // namespace

void register_sim_collective() {
  static const Registrar<HostCollective> registered(
      host_collective_registry(), {"sim", "sim", "the virtual cluster's all-reduce, in simulated time", false,
                                   [](const std::string&) { return std::make_unique<SimHostCollective>(); }});
}

}  // namespace pslab::sim
