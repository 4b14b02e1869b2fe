// The optimizers pslab knows: optimizer.kind -> its rule. Adding one: its file beside these
// (composed of the backend's element-wise programs and vector primitives, programs.h), a line
// here, its tests (tests/core/test_optimizer.cpp).
#include "core/optimizer.h"

namespace pslab {

namespace optimizers {
std::unique_ptr<OptimizerRule> make_sgd(const std::string&);
std::unique_ptr<OptimizerRule> make_momentum(const std::string&);
std::unique_ptr<OptimizerRule> make_nesterov(const std::string&);
std::unique_ptr<OptimizerRule> make_adam(const std::string&);
std::unique_ptr<OptimizerRule> make_lars(const std::string&);
std::unique_ptr<OptimizerRule> make_lamb(const std::string&);
}  // namespace optimizers

Registry<OptimizerRule>& optimizer_registry() {
  using namespace optimizers;
  static Registry<OptimizerRule> r("optimizer", {
      {"sgd", "sgd", "w -= lr (g + wd w)", false, make_sgd},
      {"momentum", "momentum", "heavy-ball momentum (PyTorch's convention): v = mu v + g; w -= lr v", false, make_momentum},
      {"nesterov", "nesterov", "Nesterov momentum: w -= lr (g + mu v)", false, make_nesterov},
      {"adam", "adam", "Adam with bias correction (beta1, beta2, eps)", false, make_adam},
      {"lars", "lars", "layer-wise trust ratios on momentum (optimizer.trust)", false, make_lars},
      {"lamb", "lamb", "layer-wise trust ratios on Adam, weight decay decoupled", false, make_lamb},
  });
  return r;
}

}  // namespace pslab
