// When the evaluator evaluates, with eval.every_epochs > 0: each time training has applied that
// many more epochs of samples (so that a curve has the same number of points however fast the
// run is), besides once at the start and once at the end. Otherwise every eval.interval_s.
#pragma once

#include <cmath>

namespace pslab {

class EpochTicks {
 public:
  explicit EpochTicks(double every_epochs) : every_(every_epochs) {}
  bool on() const { return every_ > 0; }
  // Whether `epoch` (samples applied / training-set size) has reached the next tick; if so, the
  // tick after it is the next multiple of every_epochs past `epoch`.
  bool due(double epoch) {
    if (!on() || epoch + 1e-9 < next_) return false;
    next_ = (std::floor(epoch / every_ + 1e-9) + 1) * every_;
    return true;
  }

 private:
  double every_;
  double next_ = 0.0;
};

}  // namespace pslab
