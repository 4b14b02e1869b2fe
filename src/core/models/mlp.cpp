// mlp: Linear + ReLU per width of model.hidden, then a Linear head.
#include "core/layers.h"

namespace pslab::models {
namespace {

struct Mlp final : ModelKind {
  std::vector<std::unique_ptr<Layer>> layers(const ModelSpec& spec) const override {
    std::vector<std::unique_ptr<Layer>> l;
    Shape s{spec.channels, spec.height, spec.width};
    for (int width : spec.hidden) {
      l.push_back(std::make_unique<Linear>(s, width, Init::he));
      l.push_back(std::make_unique<Relu>(s = l.back()->out()));
    }
    l.push_back(std::make_unique<Linear>(s, spec.outputs, Init::xavier));
    return l;
  }
};

}  // namespace

std::unique_ptr<ModelKind> make_mlp(const std::string&) { return std::make_unique<Mlp>(); }

}  // namespace pslab::models
