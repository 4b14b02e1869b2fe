// adam (Kingma & Ba): bias-corrected moments of g + wd w; w −= lr m̂ / (√v̂ + ε). State: m, v.
#include "core/optimizer.h"
#include "core/optimizers/programs.h"

namespace pslab::optimizers {
namespace {

class Adam final : public OptimizerRule {
 public:
  int state_buffers() const override { return 2; }
  void update(const OptimizerStep& s, const float* w, const float* g, float* w_out, std::size_t offset, std::size_t n,
              const std::vector<std::size_t>&) override {
    const OptimizerConfig& c = s.cfg;
    Program p;
    p.arrays = 5;
    adam_direction(p, float(s.lr), float(c.beta1), float(c.beta2), float(c.eps), float(c.weight_decay),
                   bias_correction(c.beta1, s.step), bias_correction(c.beta2, s.step));
    p.op(OpCode::axpby, 2, 0, 7, 1.0f, -1.0f);  // w_out = w − lr m̂ / (√v̂ + ε)
    float* arrays[] = {const_cast<float*>(w), const_cast<float*>(g), w_out, s.state[0] + offset, s.state[1] + offset};
    s.be.run(p, arrays, n);
  }
};

}  // namespace

std::unique_ptr<OptimizerRule> make_adam(const std::string&) { return std::make_unique<Adam>(); }

}  // namespace pslab::optimizers
