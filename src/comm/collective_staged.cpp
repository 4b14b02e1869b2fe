// A host collective for device buffers: GPU ranks that cannot each have a GPU of their own
// (NCCL refuses two ranks on one GPU) all-reduce through host memory.
//
//   allreduce_sum(data on the device, n):  data -> staging (page-locked host)  -> host
//   collective's allreduce_sum(staging)    -> data
//
// The staging buffer is allocated at the first call and again only for a larger n, never per
// step. On a CPU backend the copies are memcpys (what the CPU tests of this path run).
//
// Threading: one thread, like every Collective.
#include "comm/collective.h"

namespace pslab {
namespace {

class HostStagedCollective final : public Collective {
 public:
  HostStagedCollective(RendezvousClient& rv, Backend& be, std::unique_ptr<Collective> host, std::string why)
      : Collective(rv), be_(be), host_(std::move(host)), why_(std::move(why)) {}
  ~HostStagedCollective() override { be_.deallocate_host(staging_); }

  std::string describe() const override {
    return host_->describe() + " through host memory" + (why_.empty() ? "" : " (" + why_ + ")");
  }

  void allreduce_sum(float* data, std::size_t n, long step) override {
    float* h = staging(n);
    be_.copy_to_host(h, data, n * sizeof(float));
    host_->allreduce_sum(h, n, step);
    be_.copy_from_host(data, h, n * sizeof(float));
  }
  bool reduces_half() const override { return host_->reduces_half(); }
  Collective* host_side() override { return host_.get(); }
  void allreduce_sum_half(float* data, std::size_t n, HalfFormat format, float scale, long step) override {
    float* h = staging(n);
    be_.copy_to_host(h, data, n * sizeof(float));
    host_->allreduce_sum_half(h, n, format, scale, step);
    be_.copy_from_host(data, h, n * sizeof(float));
  }
  void broadcast(float* data, std::size_t n, int root) override {
    float* h = staging(n);
    if (rank() == root) be_.copy_to_host(h, data, n * sizeof(float));
    host_->broadcast(h, n, root);
    if (rank() != root) be_.copy_from_host(data, h, n * sizeof(float));
  }
  void barrier() override { host_->barrier(); }

 private:
  float* staging(std::size_t n) {
    if (n > capacity_) {
      be_.deallocate_host(staging_);
      staging_ = nullptr;
      capacity_ = 0;
      staging_ = static_cast<float*>(be_.allocate_host(n * sizeof(float)));
      capacity_ = n;
    }
    return staging_;
  }

  Backend& be_;
  std::unique_ptr<Collective> host_;
  std::string why_;
  float* staging_ = nullptr;  // capacity_ floats, page-locked on a GPU backend
  std::size_t capacity_ = 0;
};

}  // namespace

std::unique_ptr<Collective> make_host_staged_collective(RendezvousClient& rv, Backend& be,
                                                        std::unique_ptr<Collective> host, const std::string& why) {
  return std::make_unique<HostStagedCollective>(rv, be, std::move(host), why);
}

}  // namespace pslab
