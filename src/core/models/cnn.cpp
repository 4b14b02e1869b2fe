// cnn: a 5x5 stride-2 pad-2 convolution + ReLU per channel count of model.conv_channels, then a
// Linear head. Needs image input (the data's height and width).
#include "core/layers.h"

namespace pslab::models {
namespace {

struct Cnn final : ModelKind {
  std::vector<std::unique_ptr<Layer>> layers(const ModelSpec& spec) const override {
    if (spec.height < 5 || spec.width < 5)
      throw std::invalid_argument("\"cnn\" needs image data (data.kind = \"fashion-mnist\", \"cifar10\", or \"arrays\" "
                                  "of (n, H, W) or (n, C, H, W)): its input is " +
                                  std::to_string(spec.channels) + "x" + std::to_string(spec.height) + "x" +
                                  std::to_string(spec.width));
    std::vector<std::unique_ptr<Layer>> l;
    Shape s{spec.channels, spec.height, spec.width};
    for (int oc : spec.conv_channels) {
      l.push_back(std::make_unique<Conv2d>(s, oc, 5, 2, 2, Init::he));
      l.push_back(std::make_unique<Relu>(s = l.back()->out()));
    }
    l.push_back(std::make_unique<Linear>(s, spec.outputs, Init::xavier));
    return l;
  }
};

}  // namespace

std::unique_ptr<ModelKind> make_cnn(const std::string&) { return std::make_unique<Cnn>(); }

}  // namespace pslab::models
