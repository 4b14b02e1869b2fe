// lamb (You et al. 2019): r = m̂ / (√v̂ + ε) + wd w from Adam's bias-corrected moments of g (the
// weight decay decoupled), per layer t = ||w|| / ||r|| (1 where a norm is 0); w −= lr t r.
// State: m, v.
#include "core/optimizers/layer_wise.h"
#include "core/optimizers/programs.h"

namespace pslab::optimizers {
namespace {

class Lamb final : public LayerWise {
 public:
  int state_buffers() const override { return 2; }
  void prepare(const OptimizerStep& s, const float* w, const float* g, const std::vector<std::size_t>& layer_begin) override {
    const OptimizerConfig& c = s.cfg;
    const std::size_t n = layer_begin.back();
    float* r = scratch(s.be, n);
    Program p;
    p.arrays = 5;
    adam_direction(p, 1.0f, float(c.beta1), float(c.beta2), float(c.eps), 0.0f, bias_correction(c.beta1, s.step),
                   bias_correction(c.beta2, s.step));
    p.op(OpCode::scale, 2, 7, 0, 1.0f);  // r = m̂ / (√v̂ + ε)
    float* arrays[] = {const_cast<float*>(w), const_cast<float*>(g), r, s.state[0], s.state[1]};
    s.be.run(p, arrays, n);
    if (c.weight_decay > 0) s.be.axpy(n, float(c.weight_decay), w, r);
    trust_.assign(layer_begin.size() - 1, 1.0);
    for (std::size_t l = 0; l + 1 < layer_begin.size(); ++l) {
      const std::size_t lo = layer_begin[l], len = layer_begin[l + 1] - lo;
      const double wn = norm(s.be, w + lo, len), rn = norm(s.be, r + lo, len);
      if (wn > 0 && rn > 0) trust_[l] = wn / rn;
    }
  }
  void update(const OptimizerStep& s, const float* w, const float*, float* w_out, std::size_t offset, std::size_t n,
              const std::vector<std::size_t>& layer_begin) override {
    const float* r = scratch(s.be, layer_begin.back());
    for_layers(layer_begin, offset, n, [&](std::size_t l, std::size_t at, std::size_t len) {
      const std::size_t i = at - offset;
      if (w_out != w) s.be.copy(w_out + i, w + i, len * sizeof(float));
      s.be.axpy(len, float(-s.lr) * float(trust_[l]), r + at, w_out + i);
    });
  }
};

}  // namespace

std::unique_ptr<OptimizerRule> make_lamb(const std::string&) { return std::make_unique<Lamb>(); }

}  // namespace pslab::optimizers
