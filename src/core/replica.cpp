#include "core/replica.h"

#include <algorithm>
#include <numeric>

namespace pslab {

Replica::Replica(Backend& be, const ModelSpec& spec, const Dataset& train, int max_batch, float* grad_host)
    : be_(be), train_(train), model_(be, spec, max_batch, be.device() == Device::cpu ? grad_host : nullptr),
      max_batch_(max_batch), grad_host_given_(grad_host) {
  const std::size_t f = std::size_t(train.features()), o = std::size_t(spec.outputs);
  x_host_.resize(std::size_t(max_batch) * f);
  y_host_.resize(std::size_t(max_batch));
  t_host_.resize(std::size_t(max_batch) * o);
  if (be.device() != Device::cpu) {
    x_dev_ = DeviceBuffer<float>(be, x_host_.size());
    y_dev_ = DeviceBuffer<std::int32_t>(be, y_host_.size());
    t_dev_ = DeviceBuffer<float>(be, t_host_.size());
  }
  eval_idx_.resize(std::size_t(max_batch));
}

Replica::Batch Replica::stage(const Dataset& d, std::span<const std::uint32_t> idx) {
  gather_batch(d, idx, x_host_.data(), y_host_.data(), t_host_.data());
  if (be_.device() == Device::cpu) return {x_host_.data(), y_host_.data(), t_host_.data()};
  const std::size_t n = idx.size();
  be_.copy_from_host(x_dev_.data(), x_host_.data(), n * std::size_t(d.features()) * sizeof(float));
  if (d.classes > 0) be_.copy_from_host(y_dev_.data(), y_host_.data(), n * sizeof(std::int32_t));
  else be_.copy_from_host(t_dev_.data(), t_host_.data(), n * std::size_t(d.target_dim) * sizeof(float));
  return {x_dev_.data(), y_dev_.data(), t_dev_.data()};
}

double Replica::compute_gradient(std::span<const std::uint32_t> idx, float grad_scale, GradListener* listener) {
  const Batch b = stage(train_, idx);
  return model_.forward_backward(b.x, b.labels, b.targets, int(idx.size()), grad_scale, listener);
}

float* Replica::host_params() {
  if (be_.device() == Device::cpu) return model_.params();
  if (theta_host_.empty()) theta_host_.resize(model_.num_params());
  return theta_host_.data();
}

void Replica::upload_params() {
  if (be_.device() != Device::cpu) be_.copy_from_host(model_.params(), host_params(), model_.num_params() * sizeof(float));
}

const float* Replica::download_params() {
  if (be_.device() == Device::cpu) return model_.params();
  float* host = host_params();
  be_.copy_to_host(host, model_.params(), model_.num_params() * sizeof(float));
  return host;
}

const float* Replica::download_grads() {
  if (be_.device() == Device::cpu) return model_.grads();
  float* host = grad_host_given_;
  if (!host) {
    if (grad_host_.empty()) grad_host_.resize(model_.num_params());
    host = grad_host_.data();
  }
  be_.copy_to_host(host, model_.grads(), model_.num_params() * sizeof(float));
  return host;
}

EvalCounts Replica::evaluate(const Dataset& d) {
  EvalCounts total;
  for (int lo = 0; lo < d.n; lo += max_batch_) {
    const int n = std::min(max_batch_, d.n - lo);
    std::iota(eval_idx_.begin(), eval_idx_.begin() + n, std::uint32_t(lo));
    const Batch b = stage(d, {eval_idx_.data(), std::size_t(n)});
    const EvalCounts c = model_.evaluate(b.x, b.labels, b.targets, n);
    total.loss_sum += c.loss_sum;
    total.correct += c.correct;
    total.samples += c.samples;
  }
  return total;
}

}  // namespace pslab
