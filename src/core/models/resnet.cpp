// resnet: the CIFAR ResNets of He et al. (2016), section 4.2, with batch norm and projection
// shortcuts where the shape changes: a 3x3 convolution of model.width channels, then three
// stages of n basic blocks each (width, 2 width and 4 width channels; the second and third
// stage start with stride 2), global average pooling and a linear head; depth = 6n + 2
// (8, 20, 56, ...). A basic block: conv3x3 - bn - relu - conv3x3 - bn, plus the input (or its
// 1x1 stride-s convolution and bn), then relu. Convolutions have no bias (batch norm follows).
// The same network as experiments/torch/resnet.py. Needs image input.
#include "core/layers.h"

namespace pslab::models {
namespace {

using Layers = std::vector<std::unique_ptr<Layer>>;

// conv3x3 (or 1x1 for a shortcut) without bias, then batch norm.
void conv_bn(Layers& l, Shape in, int channels, int k, int stride) {
  l.push_back(std::make_unique<Conv2d>(in, channels, k, stride, k / 2, Init::he, false));
  l.push_back(std::make_unique<BatchNorm2d>(l.back()->out()));
}

std::unique_ptr<Layer> basic_block(Shape in, int channels, int stride) {
  Layers main, shortcut;
  conv_bn(main, in, channels, 3, stride);
  main.push_back(std::make_unique<Relu>(main.back()->out()));
  conv_bn(main, main.back()->out(), channels, 3, 1);
  if (stride != 1 || in.c != channels) conv_bn(shortcut, in, channels, 1, stride);
  return std::make_unique<Residual>(std::move(main), std::move(shortcut));
}

struct ResNet final : ModelKind {
  Layers layers(const ModelSpec& spec) const override {
    if (spec.depth < 8 || (spec.depth - 2) % 6 != 0)
      throw std::invalid_argument("\"resnet\": model.depth must be 6n + 2 for n >= 1 blocks per stage (8, 14, 20, 32, 44, "
                                  "56, 110), not " + std::to_string(spec.depth));
    if (spec.stage_width < 1) throw std::invalid_argument("\"resnet\": model.width must be >= 1");
    if (spec.height < 4 || spec.width < 4)
      throw std::invalid_argument("\"resnet\" needs image data (data.kind = \"fashion-mnist\", \"cifar10\", or \"arrays\" "
                                  "of (n, H, W) or (n, C, H, W)): its input is " + std::to_string(spec.channels) + "x" +
                                  std::to_string(spec.height) + "x" + std::to_string(spec.width));
    if (spec.height < 5 || spec.width < 5)  // (4x4: 1x1 in the last stage, where a batch of 1 normalises to β alone)
      throw std::invalid_argument("\"resnet\" needs images of at least 5x5 pixels (its last stage is a quarter of "
                                  "their size, and batch norm needs more than one value per channel): its input is " +
                                  std::to_string(spec.height) + "x" + std::to_string(spec.width));
    Layers l;
    conv_bn(l, Shape{spec.channels, spec.height, spec.width}, spec.stage_width, 3, 1);
    l.push_back(std::make_unique<Relu>(l.back()->out()));
    const int blocks = (spec.depth - 2) / 6;
    for (int stage = 0; stage < 3; ++stage)
      for (int b = 0; b < blocks; ++b)
        l.push_back(basic_block(l.back()->out(), spec.stage_width << stage, stage > 0 && b == 0 ? 2 : 1));
    l.push_back(std::make_unique<GlobalAvgPool>(l.back()->out()));
    l.push_back(std::make_unique<Linear>(l.back()->out(), spec.outputs, Init::xavier));
    return l;
  }
};

}  // namespace

std::unique_ptr<ModelKind> make_resnet(const std::string&) { return std::make_unique<ResNet>(); }

}  // namespace pslab::models
