// momentum and nesterov: heavy-ball momentum in PyTorch's convention, v = μ v + (g + wd w),
// w −= lr v; Nesterov's w −= lr ((g + wd w) + μ v) with the new v. State: v.
#include "core/optimizer.h"
#include "core/optimizers/programs.h"

namespace pslab::optimizers {
namespace {

class Momentum final : public OptimizerRule {
 public:
  explicit Momentum(bool nesterov) : nesterov_(nesterov) {}
  int state_buffers() const override { return 1; }
  bool records() const override { return true; }
  void update(const OptimizerStep& s, const float* w, const float* g, float* w_out, std::size_t offset, std::size_t n,
              const std::vector<std::size_t>&) override {
    float* arrays[] = {const_cast<float*>(w), const_cast<float*>(g), w_out, s.state[0] + offset};
    Program p = momentum_program(s.neg_lr(), float(s.cfg.momentum), float(s.cfg.weight_decay), nesterov_);
    p.live = s.live;
    s.be.run(p, arrays, n);
  }

 private:
  bool nesterov_;
};

}  // namespace

std::unique_ptr<OptimizerRule> make_momentum(const std::string&) { return std::make_unique<Momentum>(false); }
std::unique_ptr<OptimizerRule> make_nesterov(const std::string&) { return std::make_unique<Momentum>(true); }

}  // namespace pslab::optimizers
