#include "byzantine.h"

#include <algorithm>
#include <climits>
#include <limits>

#include "core/rng.h"

namespace pslab {

Byzantine::Byzantine(const ExperimentConfig& cfg, int rank)
    : on_(std::find(cfg.byzantine.workers.begin(), cfg.byzantine.workers.end(), rank) != cfg.byzantine.workers.end()),
      cfg_(cfg.byzantine), seed_(cfg.seed), rank_(rank) {}

const float* Byzantine::corrupt(const float* grad, std::size_t n, long step, int& batch) {
  if (!on_) return grad;
  if (cfg_.kind == "batch") {
    batch = INT_MAX;
    return grad;
  }
  if (bad_.size() != n) bad_.assign(n, 0.0f);
  if (cfg_.kind == "nan") {
    std::fill(bad_.begin(), bad_.end(), std::numeric_limits<float>::quiet_NaN());
  } else {  // noise
    Rng rng = Rng::derive(seed_, {0xB7ull, std::uint64_t(rank_), std::uint64_t(step)});
    for (float& x : bad_) x = float(rng.uniform(-cfg_.scale, cfg_.scale));
  }
  return bad_.data();
}

std::string Byzantine::describe() const {
  if (cfg_.kind == "batch") return "pushes its gradient claiming a batch of 2^31 - 1 (byzantine.kind)";
  if (cfg_.kind == "noise") return "pushes uniform noise in ±" + std::to_string(cfg_.scale) + " instead of its gradient (byzantine.kind)";
  return "pushes NaN instead of its gradient (byzantine.kind)";
}

}  // namespace pslab
