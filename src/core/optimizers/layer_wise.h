// What lars and lamb share: a trust ratio per layer, taken over the whole range in prepare(),
// and a buffer of the range's size on the backend's device (lars: t g, lamb: r) that the pieces
// of the update then read.
#pragma once

#include <algorithm>
#include <cmath>

#include "core/optimizer.h"

namespace pslab::optimizers {

class LayerWise : public OptimizerRule {
 public:
  const std::vector<double>& trust_ratios() const override { return trust_; }
  bool needs_whole_range() const override { return true; }

 protected:
  // The buffer, n floats, made on first use.
  float* scratch(Backend& be, std::size_t n) {
    if (scratch_.size() != n) scratch_ = DeviceBuffer<float>(be, n);
    return scratch_.data();
  }
  double norm(Backend& be, const float* x, std::size_t n) const { return std::sqrt(be.sum_squares(x, n)); }
  // fn(layer, at, len) for the parts [at, at + len) of [offset, offset + n) in each layer it
  // overlaps (a piece may start, end or cross layers).
  template <typename F>
  static void for_layers(const std::vector<std::size_t>& layer_begin, std::size_t offset, std::size_t n, F fn) {
    std::size_t l = std::size_t(std::upper_bound(layer_begin.begin(), layer_begin.end(), offset) - layer_begin.begin()) - 1;
    for (std::size_t at = offset; at < offset + n; ++l) {
      const std::size_t end = std::min(offset + n, layer_begin[l + 1]);
      fn(l, at, end - at);
      at = end;
    }
  }
  std::vector<double> trust_;  // per layer, from prepare()

 private:
  DeviceBuffer<float> scratch_;
};

}  // namespace pslab::optimizers
