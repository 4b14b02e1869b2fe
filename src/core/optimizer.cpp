#include "core/optimizer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <stdexcept>

namespace pslab {

double learning_rate(const ScheduleConfig& s, double lr, int global_batch, double epoch) {
  if (s.scale_lr) lr *= double(global_batch) / double(s.base_batch);
  if (epoch < s.warmup_epochs) {
    const double f = s.warmup_start_factor + (1.0 - s.warmup_start_factor) * epoch / s.warmup_epochs;
    return lr * f;
  }
  if (s.kind == "step") {
    for (double m : s.milestones)
      if (epoch >= m) lr *= s.gamma;
    return lr;
  }
  if (s.kind == "cosine") {
    const double span = s.total_epochs - s.warmup_epochs;
    const double t = span > 0 ? std::min(1.0, (epoch - s.warmup_epochs) / span) : 1.0;
    return lr * (s.min_lr_factor + (1.0 - s.min_lr_factor) * 0.5 * (1.0 + std::cos(std::numbers::pi * t)));
  }
  return lr;
}

void validate(const OptimizerConfig& o) {
  try {
    optimizer_registry().check(o.kind);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("optimizer.kind: ") + e.what());
  }
  if (!(o.trust > 0)) throw std::invalid_argument("optimizer.trust: must be > 0");
  if (!(o.lr > 0)) throw std::invalid_argument("optimizer.lr: must be > 0");
  if (!(o.momentum >= 0 && o.momentum < 1)) throw std::invalid_argument("optimizer.momentum: must be in [0, 1)");
  if (!(o.weight_decay >= 0)) throw std::invalid_argument("optimizer.weight_decay: must be >= 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) throw std::invalid_argument("optimizer.beta1: must be in [0, 1)");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) throw std::invalid_argument("optimizer.beta2: must be in [0, 1)");
  if (!(o.eps > 0)) throw std::invalid_argument("optimizer.eps: must be > 0");
}

void validate(const ScheduleConfig& s) {
  if (s.kind != "constant" && s.kind != "step" && s.kind != "cosine")
    throw std::invalid_argument("schedule.kind: \"" + s.kind +
                                "\" is not one of \"constant\", \"step\", \"cosine\"");
  if (!(s.warmup_epochs >= 0)) throw std::invalid_argument("schedule.warmup_epochs: must be >= 0");
  if (!(s.warmup_start_factor >= 0 && s.warmup_start_factor <= 1))
    throw std::invalid_argument("schedule.warmup_start_factor: must be in [0, 1]");
  if (!(s.gamma > 0)) throw std::invalid_argument("schedule.gamma: must be > 0");
  if (!(s.min_lr_factor >= 0 && s.min_lr_factor <= 1))
    throw std::invalid_argument("schedule.min_lr_factor: must be in [0, 1]");
  if (s.base_batch < 1) throw std::invalid_argument("schedule.base_batch: must be >= 1");
  for (double m : s.milestones)
    if (!(m > 0 && std::isfinite(m))) {  // (one at or below 0 applied gamma from the first step)
      char b[120];
      std::snprintf(b, sizeof b, "schedule.milestones: each must be an epoch > 0, got %g", m);
      throw std::invalid_argument(b);
    }
}

namespace {
std::atomic<std::uint64_t> optimizers_made{0};
}  // namespace

Optimizer::Optimizer(Backend& be, const OptimizerConfig& cfg, std::size_t n, std::vector<std::size_t> layers)
    : be_(be), cfg_(cfg), n_(n), identity_(++optimizers_made) {
  validate(cfg);
  rule_ = optimizer_registry().make(cfg.kind);
  if (layers.empty()) layers.push_back(n);
  std::size_t total = 0;
  for (std::size_t l : layers) layer_begin_.push_back(total), total += l;
  layer_begin_.push_back(total);
  if (total != n)
    throw std::invalid_argument("Optimizer: layers of " + std::to_string(total) + " parameters for a range of " +
                                std::to_string(n));
  for (int i = 0; i < rule_->state_buffers(); ++i) {
    state_.emplace_back(be, n);
    be.fill(state_.back().data(), n, 0.0f);
    state_ptrs_.push_back(state_.back().data());
  }
}

void Optimizer::prepare(const float* w, const float* g) { rule_->prepare(context(0.0), w, g, layer_begin_); }

void Optimizer::step_range(const float* w, const float* g, float* w_out, std::size_t offset, std::size_t n, double lr) {
  if (live_scalars())
    throw std::logic_error("Optimizer::step_range: an optimizer with live scalars steps by begin_live_step() and update()");
  apply_range(w, g, w_out, offset, n, lr);
}

void Optimizer::apply_range(const float* w, const float* g, float* w_out, std::size_t offset, std::size_t n, double lr) {
  if (offset + n > n_)
    throw std::logic_error("Optimizer::step_range: [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                           ") exceeds the optimizer's " + std::to_string(n_) + " parameters");
  if (n > 0) rule_->update(context(lr), w, g, w_out, offset, n, layer_begin_);
}

void Optimizer::use_live_scalars() {
  if (!rule_->records())
    throw std::logic_error("Optimizer::use_live_scalars: optimizer.kind = \"" + cfg_.kind +
                           "\" cannot be recorded in a step graph (its layer-wise norms come back to the host)");
  if (live_scalars()) return;
  live_ = DeviceBuffer<float>(be_, math::Program::kMaxLive);
  be_.fill(live_.data(), live_.size(), 0.0f);
}

void Optimizer::begin_live_step(double lr) {
  if (!live_scalars()) throw std::logic_error("Optimizer::begin_live_step: use_live_scalars() first");
  begin_step();
  live_lr_ = lr;
  float values[math::Program::kMaxLive] = {};
  const int n = rule_->live_values(context(lr), values);
  if (live_written_once_ && std::equal(values, values + n, live_written_)) return;  // (a constant rate: nothing to write)
  be_.write_scalars(live_.data(), values, n);
  std::copy(values, values + n, live_written_);
  live_written_once_ = true;
}

void Optimizer::update(const float* w, const float* g, float* w_out) {
  if (!live_scalars()) throw std::logic_error("Optimizer::update: use_live_scalars() and begin_live_step() first");
  apply_range(w, g, w_out, 0, n_, live_lr_);  // (the programs read it from the live scalars)
}

std::vector<std::vector<float>> Optimizer::state() const {
  std::vector<std::vector<float>> out;
  for (const auto& b : state_) {
    out.emplace_back(n_);
    be_.copy_to_host(out.back().data(), b.data(), n_ * sizeof(float));
  }
  return out;
}

void Optimizer::restore(long steps, const std::vector<std::vector<float>>& buffers) {
  if (buffers.size() != state_.size())
    throw std::invalid_argument("optimizer state of " + std::to_string(buffers.size()) + " buffers, but " + cfg_.kind +
                                " keeps " + std::to_string(state_.size()));
  for (std::size_t i = 0; i < state_.size(); ++i) {
    if (buffers[i].size() != n_)
      throw std::invalid_argument("optimizer state buffer of " + std::to_string(buffers[i].size()) + " floats, expected " +
                                  std::to_string(n_));
    be_.copy_from_host(state_[i].data(), buffers[i].data(), n_ * sizeof(float));
  }
  steps_ = steps;
}

}  // namespace pslab
