#include "grad_accumulator.h"

namespace pslab {

GradAccumulator::GradAccumulator(Backend& be, int batches, std::size_t P) : be_(be), n_(batches), P_(P) {
  if (n_ > 1) sum_ = DeviceBuffer<float>(be, P);
}

bool GradAccumulator::add(float* grad, double weight, bool last) {
  if (n_ == 1) {
    mean_ = grad;
    weight_ = weight;
    return true;
  }
  if (weight > 0) {
    if (open_ == 0) {
      be_.copy(sum_.data(), grad, P_ * sizeof(float));
      be_.scale(P_, float(weight), sum_.data());
    } else {
      be_.axpy(P_, float(weight), grad, sum_.data());
    }
    open_ += weight;
  }
  if (++count_ < n_ && !last) return false;
  if (open_ > 0) be_.scale(P_, float(1.0 / open_), sum_.data());
  else be_.fill(sum_.data(), P_, 0.0f);
  mean_ = sum_.data();
  weight_ = open_;
  count_ = 0;
  open_ = 0;
  return true;
}

const float* GradAccumulator::host_mean() {
  if (be_.device() == Device::cpu) return mean_;
  if (host_.empty()) host_ = HostBuffer<float>(be_, P_);
  be_.copy_to_host(host_.data(), mean_, P_ * sizeof(float));
  return host_.data();
}

}  // namespace pslab
