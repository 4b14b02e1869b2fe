// adam (Kingma & Ba): bias-corrected moments of g + wd w; w −= lr m̂ / (√v̂ + ε). State: m, v.
#include "core/optimizer.h"
#include "core/optimizers/programs.h"

namespace pslab::optimizers {
namespace {

class Adam final : public OptimizerRule {
 public:
  int state_buffers() const override { return 2; }
  bool records() const override { return true; }
  // Live: lr, −lr, then the bias corrections bc1 and bc2 (which change every step).
  int live_values(const OptimizerStep& s, float* out) const override {
    OptimizerRule::live_values(s, out);
    out[2] = bias_correction(s.cfg.beta1, s.step);
    out[3] = bias_correction(s.cfg.beta2, s.step);
    return 4;
  }
  void update(const OptimizerStep& s, const float* w, const float* g, float* w_out, std::size_t offset, std::size_t n,
              const std::vector<std::size_t>&) override {
    const OptimizerConfig& c = s.cfg;
    Program p;
    p.arrays = 5;
    p.live = s.live;
    adam_direction(p, s.lr_scalar(), float(c.beta1), float(c.beta2), float(c.eps), float(c.weight_decay),
                   s.live ? Scalar::live(2) : Scalar(bias_correction(c.beta1, s.step)),
                   s.live ? Scalar::live(3) : Scalar(bias_correction(c.beta2, s.step)));
    p.op(OpCode::axpby, 2, 0, 7, 1.0f, -1.0f);  // w_out = w − lr m̂ / (√v̂ + ε)
    float* arrays[] = {const_cast<float*>(w), const_cast<float*>(g), w_out, s.state[0] + offset, s.state[1] + offset};
    s.be.run(p, arrays, n);
  }
};

}  // namespace

std::unique_ptr<OptimizerRule> make_adam(const std::string&) { return std::make_unique<Adam>(); }

}  // namespace pslab::optimizers
