#include "core/optimizer.h"

#include <algorithm>
#include <cmath>
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
  if (o.kind != "sgd" && o.kind != "momentum" && o.kind != "nesterov" && o.kind != "adam" && o.kind != "lars" &&
      o.kind != "lamb")
    throw std::invalid_argument("optimizer.kind: \"" + o.kind +
                                "\" is not one of \"sgd\", \"momentum\", \"nesterov\", \"adam\", \"lars\", \"lamb\"");
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
}

Optimizer::Optimizer(Backend& be, const OptimizerConfig& cfg, std::size_t n, std::vector<std::size_t> layers)
    : be_(be), cfg_(cfg), n_(n) {
  validate(cfg);
  kind_ = cfg.kind == "momentum" ? Kind::momentum
          : cfg.kind == "nesterov" ? Kind::nesterov
          : cfg.kind == "adam"     ? Kind::adam
          : cfg.kind == "lars"     ? Kind::lars
          : cfg.kind == "lamb"     ? Kind::lamb
                                   : Kind::sgd;
  if (layers.empty()) layers.push_back(n);
  std::size_t total = 0;
  for (std::size_t l : layers) layer_begin_.push_back(total), total += l;
  layer_begin_.push_back(total);
  if (total != n)
    throw std::invalid_argument("Optimizer: layers of " + std::to_string(total) + " parameters for a range of " +
                                std::to_string(n));
  if (layer_wise()) {
    scratch_ = DeviceBuffer<float>(be, n);
    trust_.assign(layers.size(), 1.0);
  }
  if (kind_ == Kind::adam || kind_ == Kind::lamb) {
    m_ = DeviceBuffer<float>(be, n);
    be.fill(m_.data(), n, 0.0f);
  }
  if (kind_ != Kind::sgd) {
    v_ = DeviceBuffer<float>(be, n);
    be.fill(v_.data(), n, 0.0f);
  }
}

void Optimizer::prepare(const float* w, const float* g) {
  if (!layer_wise()) return;
  float* r = scratch_.data();
  if (kind_ == Kind::lamb) {
    // m̂ / (√v̂ + ε), by Adam's own step from a zero weight at lr −1 (m and v move here), + wd w.
    be_.fill(r, n_, 0.0f);
    be_.adam_step(r, m_.data(), v_.data(), g, r, n_,
                  AdamArgs{-1.0f, float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps), 0.0f, steps_});
    if (cfg_.weight_decay > 0) be_.axpy(n_, float(cfg_.weight_decay), w, r);
  }
  for (std::size_t l = 0; l + 1 < layer_begin_.size(); ++l) {
    const std::size_t lo = layer_begin_[l], len = layer_begin_[l + 1] - lo;
    const double wn = std::sqrt(be_.sum_squares(w + lo, len));
    if (kind_ == Kind::lars) {
      const double gn = std::sqrt(be_.sum_squares(g + lo, len));
      trust_[l] = wn > 0 && gn > 0 ? cfg_.trust * wn / (gn + cfg_.weight_decay * wn) : 1.0;
      be_.copy(r + lo, g + lo, len * sizeof(float));
      be_.scale(len, float(trust_[l]), r + lo);
    } else {
      const double rn = std::sqrt(be_.sum_squares(r + lo, len));
      trust_[l] = wn > 0 && rn > 0 ? wn / rn : 1.0;
    }
  }
}

void Optimizer::step_range(const float* w, const float* g, float* w_out, std::size_t offset, std::size_t n,
                           double lr) {
  if (offset + n > n_)
    throw std::logic_error("Optimizer::step_range: [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                           ") exceeds the optimizer's " + std::to_string(n_) + " parameters");
  const float wd = float(cfg_.weight_decay);
  if (layer_wise()) {
    // Piece by layer: [offset, offset + n) may start, end or cross layers.
    const float* r = scratch_.data();
    std::size_t l = std::size_t(std::upper_bound(layer_begin_.begin(), layer_begin_.end(), offset) - layer_begin_.begin()) - 1;
    for (std::size_t at = offset; at < offset + n; ++l) {
      const std::size_t end = std::min(offset + n, layer_begin_[l + 1]), len = end - at, i = at - offset;
      const float t = float(trust_[l]);
      if (kind_ == Kind::lars) {
        be_.momentum_step(w + i, v_.data() + at, r + at, w_out + i, len, MomentumArgs{float(lr), float(cfg_.momentum), wd * t, false});
      } else {
        if (w_out != w) be_.copy(w_out + i, w + i, len * sizeof(float));
        be_.axpy(len, float(-lr) * t, r + at, w_out + i);
      }
      at = end;
    }
    return;
  }
  switch (kind_) {
    case Kind::sgd:
      be_.sgd_step(w, g, w_out, n, SgdArgs{float(lr), wd});
      break;
    case Kind::momentum:
    case Kind::nesterov:
      be_.momentum_step(w, v_.data() + offset, g, w_out, n,
                        MomentumArgs{float(lr), float(cfg_.momentum), wd, kind_ == Kind::nesterov});
      break;
    case Kind::adam:
      be_.adam_step(w, m_.data() + offset, v_.data() + offset, g, w_out, n,
                    AdamArgs{float(lr), float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps), wd, steps_});
      break;
    case Kind::lars:
    case Kind::lamb:
      break;  // above
  }
}

std::vector<std::vector<float>> Optimizer::state() const {
  std::vector<std::vector<float>> out;
  for (const DeviceBuffer<float>* b : {&m_, &v_})
    if (b->data()) {
      out.emplace_back(n_);
      be_.copy_to_host(out.back().data(), b->data(), n_ * sizeof(float));
    }
  return out;
}

void Optimizer::restore(long steps, const std::vector<std::vector<float>>& buffers) {
  std::vector<DeviceBuffer<float>*> mine;
  for (DeviceBuffer<float>* b : {&m_, &v_})
    if (b->data()) mine.push_back(b);
  if (buffers.size() != mine.size())
    throw std::invalid_argument("optimizer state of " + std::to_string(buffers.size()) + " buffers, but " + cfg_.kind +
                                " keeps " + std::to_string(mine.size()));
  for (std::size_t i = 0; i < mine.size(); ++i) {
    if (buffers[i].size() != n_)
      throw std::invalid_argument("optimizer state buffer of " + std::to_string(buffers[i].size()) + " floats, expected " +
                                  std::to_string(n_));
    be_.copy_from_host(mine[i]->data(), buffers[i].data(), n_ * sizeof(float));
  }
  steps_ = steps;
}

}  // namespace pslab
