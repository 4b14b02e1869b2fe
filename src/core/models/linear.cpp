// linear: softmax regression (classes) or least squares (regression outputs): one Linear layer.
#include "core/layers.h"

namespace pslab::models {
namespace {

struct LinearModel final : ModelKind {
  std::vector<std::unique_ptr<Layer>> layers(const ModelSpec& spec) const override {
    std::vector<std::unique_ptr<Layer>> l;
    l.push_back(std::make_unique<Linear>(Shape{spec.channels, spec.height, spec.width}, spec.outputs, Init::xavier));
    return l;
  }
};

}  // namespace

std::unique_ptr<ModelKind> make_linear(const std::string&) { return std::make_unique<LinearModel>(); }

}  // namespace pslab::models
