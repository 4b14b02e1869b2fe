#include "core/layers.h"

namespace pslab {

void init_uniform(float* w, std::size_t n, double limit, Rng& rng) {
  for (std::size_t i = 0; i < n; ++i) w[i] = float(rng.uniform(-limit, limit));
}

}  // namespace pslab
