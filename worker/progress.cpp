#include "progress.h"

#include <cstdio>

namespace pslab {

void Progress::update(const Snapshot& s) {
  last_ = s;
  if (!enabled_ || s.elapsed_s - last_s_ < every_s_) return;
  last_s_ = s.elapsed_s;
  const double eta = s.step > 0 ? s.elapsed_s * double(s.total_steps - s.step) / double(s.step) : 0.0;
  std::fprintf(stderr, "[%s] epoch %.2f  step %ld/%ld  loss %.4f  %.0f samples/s  elapsed %.0fs  ETA %.0fs\n",
               who_.c_str(), s.epoch, s.step, s.total_steps, s.loss, s.samples_per_s, s.elapsed_s, eta);
}

void Progress::epoch_done(double epoch, double test_loss, double test_acc) {
  if (!enabled_) return;
  if (test_acc >= 0)
    std::fprintf(stderr, "[%s] epoch %.2f done: test loss %.4f, test accuracy %.2f%%  (%.0f samples/s, %.1fs)\n",
                 who_.c_str(), epoch, test_loss, 100.0 * test_acc, last_.samples_per_s, last_.elapsed_s);
  else
    std::fprintf(stderr, "[%s] epoch %.2f done: test loss %.6g  (%.1fs)\n", who_.c_str(), epoch,
                 test_loss, last_.elapsed_s);
}

}  // namespace pslab
