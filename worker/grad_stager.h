// ∇θ from GPU memory to the host buffer pushes leave from, as backward finishes it (overlap on
// a GPU worker). Backward reports each tail ∇θ[lo, P) it has queued the last kernel for
// (GradListener); the stager queues that tail's download on the backend's copy lane
// (Backend::download_async: the copy waits on the device for those kernels, the host does not),
// and tells `next` (the client's push_ready) that ∇θ[lo, P) is final in host memory once the
// copy has landed. So the copy engine moves the last layers' gradients while the GPU computes
// the first layers', and a shard's push leaves as soon as its bytes are on the host.
//
// Copies move at least min_floats (a shorter tail waits for more), except the step's last
// (lo = 0). Landed copies are passed on at every ready() (without waiting) and all of them at
// lo = 0 (waiting for each in turn), in order: `next` hears lo in decreasing order, ending at 0.
//
// Threading: the training thread (start() before backward, ready() during it).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "backend.h"
#include "core/model.h"

namespace pslab {

class GradStager final : public GradListener {
 public:
  // dev: ∇θ on the device (P floats); host: where it lands (P floats, Backend::allocate_host).
  GradStager(Backend& be, const float* dev, float* host, std::size_t P, std::size_t min_floats, GradListener& next);
  // Backward of a new step is about to begin: no part of ∇θ is final yet.
  void start();
  // ∇θ[lo, P) is queued: download what of it is not yet queued, pass on what landed.
  void ready(std::size_t lo) override;
  // Copies queued this step (a step moves ∇θ in this many pieces).
  std::size_t copies() const { return copies_.size(); }

 private:
  void pass_landed(bool wait);

  Backend& be_;
  const float* dev_;
  float* host_;
  const std::size_t P_, min_floats_;
  GradListener& next_;
  std::size_t queued_lo_;                                   // ∇θ[queued_lo_, P) is queued this step
  std::vector<std::pair<std::size_t, Backend::Ticket>> copies_;  // this step's copies (lo, ticket), in order
  std::size_t passed_ = 0;                                   // copies_[0, passed_) landed and were passed on
};

}  // namespace pslab
