#include "collective.h"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <stdexcept>

namespace pslab {

std::string Collective::timeout_message(const std::string& what, long step, const std::string& cause) {
  return what + (step >= 0 ? " of step " + std::to_string(step) : std::string()) + " on rank " +
         std::to_string(rank()) + " failed (timeout " + std::to_string(rv_.timeout().count() / 1000) + " s): " + cause +
         "; " + rv_.laggards(step);
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
    return "gloo (tcp, " + std::to_string(size()) + " ranks, " + (size() == 2 ? "direct exchange" : "ring") + ")";
  }
  void allreduce_sum(float* data, std::size_t n, long step) override {
    if (n == 0 || size() == 1) return;
    if (size() == 2) return exchange_sum(data, n, step);
    gloo::AllreduceOptions opts(context_);
    opts.setInput(data, n);
    opts.setOutput(data, n);
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
    opts.setTag(tag_++);
    opts.setTimeout(rv_.timeout());
    try {
      gloo::allreduce(opts);
    } catch (const std::exception& e) {
      throw std::runtime_error(timeout_message("all-reduce", step, e.what()));
    }
  }
  // Two ranks: each sends its whole buffer to the other and adds what it receives. One round
  // instead of the ring's two (reduce-scatter, all-gather), the same bytes; a + b == b + a,
  // so both ranks hold bitwise the same sum.
  void exchange_sum(float* data, std::size_t n, long step) {
    if (peer_buf_.size() < n) peer_buf_.assign(n, 0.0f);
    auto out = context_->createUnboundBuffer(data, n * sizeof(float));
    auto in = context_->createUnboundBuffer(peer_buf_.data(), n * sizeof(float));
    const int peer = 1 - rank();
    const std::uint64_t slot = gloo::Slot::build(0x50, tag_++);
    in->recv(peer, slot);
    out->send(peer, slot);
    try {
      if (!in->waitRecv(rv_.timeout())) throw std::runtime_error("receive aborted");
      if (!out->waitSend(rv_.timeout())) throw std::runtime_error("send aborted");
    } catch (const std::exception& e) {
      throw std::runtime_error(timeout_message("all-reduce", step, e.what()));
    }
    const float* other = peer_buf_.data();
    for (std::size_t i = 0; i < n; ++i) data[i] += other[i];
  }

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
  std::vector<float> peer_buf_;  // the other rank's buffer (exchange_sum)
};

}  // namespace

std::unique_ptr<Collective> make_gloo_collective(RendezvousClient& rv, const std::string& host) {
  return std::make_unique<GlooCollective>(rv, host);
}

#ifndef PSLAB_HAVE_NCCL
bool nccl_built() { return false; }
std::unique_ptr<Collective> make_nccl_collective(RendezvousClient&, int) {
  throw std::runtime_error("the NCCL collective is not in this build of pslab (CUDA toolkit or NCCL not found at configure time)");
}
#endif

std::unique_ptr<Collective> make_collective(Device device, RendezvousClient& rv, const std::string& host) {
  return device == Device::cuda ? make_nccl_collective(rv, 0) : make_gloo_collective(rv, host);
}

}  // namespace pslab
