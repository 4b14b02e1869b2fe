// sgd: w −= lr (g + wd w). In place with no weight decay it is an axpy (the backend's BLAS, on
// all its threads: the single-process trainer's hot path), except with live scalars (a step
// graph's), which only a program reads.
#include "core/optimizer.h"
#include "core/optimizers/programs.h"

namespace pslab::optimizers {
namespace {

class Sgd final : public OptimizerRule {
 public:
  bool records() const override { return true; }
  void update(const OptimizerStep& s, const float* w, const float* g, float* w_out, std::size_t, std::size_t n,
              const std::vector<std::size_t>&) override {
    const float wd = float(s.cfg.weight_decay);
    if (w == w_out && wd == 0.0f && !s.live) return s.be.axpy(n, -float(s.lr), g, w_out);
    float* arrays[] = {const_cast<float*>(w), const_cast<float*>(g), w_out};
    Program p = sgd_program(s.neg_lr(), wd);
    p.live = s.live;
    s.be.run(p, arrays, n);
  }
};

}  // namespace

std::unique_ptr<OptimizerRule> make_sgd(const std::string&) { return std::make_unique<Sgd>(); }

}  // namespace pslab::optimizers
