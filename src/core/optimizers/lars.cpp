// lars (You et al. 2017): per layer t = η ||w|| / (||g|| + wd ||w||) (1 where a norm is 0), then
// momentum on t g with weight decay wd t: v = μ v + t (g + wd w); w −= lr v. State: v.
#include "core/optimizers/layer_wise.h"
#include "core/optimizers/programs.h"

namespace pslab::optimizers {
namespace {

class Lars final : public LayerWise {
 public:
  int state_buffers() const override { return 1; }
  void prepare(const OptimizerStep& s, const float* w, const float* g, const std::vector<std::size_t>& layer_begin) override {
    const std::size_t n = layer_begin.back();
    float* tg = scratch(s.be, n);
    trust_.assign(layer_begin.size() - 1, 1.0);
    for (std::size_t l = 0; l + 1 < layer_begin.size(); ++l) {
      const std::size_t lo = layer_begin[l], len = layer_begin[l + 1] - lo;
      const double wn = norm(s.be, w + lo, len), gn = norm(s.be, g + lo, len);
      if (wn > 0 && gn > 0) trust_[l] = s.cfg.trust * wn / (gn + s.cfg.weight_decay * wn);
      s.be.copy(tg + lo, g + lo, len * sizeof(float));
      s.be.scale(len, float(trust_[l]), tg + lo);
    }
  }
  void update(const OptimizerStep& s, const float* w, const float*, float* w_out, std::size_t offset, std::size_t n,
              const std::vector<std::size_t>& layer_begin) override {
    const float* tg = scratch(s.be, layer_begin.back());
    for_layers(layer_begin, offset, n, [&](std::size_t l, std::size_t at, std::size_t len) {
      const float t = float(trust_[l]);
      const std::size_t i = at - offset;
      float* arrays[] = {const_cast<float*>(w + i), const_cast<float*>(tg + at), w_out + i, s.state[0] + at};
      s.be.run(momentum_program(-float(s.lr), float(s.cfg.momentum), float(s.cfg.weight_decay) * t, false), arrays, len);
    });
  }
};

}  // namespace

std::unique_ptr<OptimizerRule> make_lars(const std::string&) { return std::make_unique<Lars>(); }

}  // namespace pslab::optimizers
