// The models pslab knows: model.kind -> its layers. Adding one: its file beside these (built
// from the layers of core/layers.h), a line here, its gradient check (tests/core/test_model.cpp).
#include "core/model.h"

namespace pslab {

namespace models {
std::unique_ptr<ModelKind> make_linear(const std::string&);
std::unique_ptr<ModelKind> make_mlp(const std::string&);
std::unique_ptr<ModelKind> make_cnn(const std::string&);
std::unique_ptr<ModelKind> make_resnet(const std::string&);
std::unique_ptr<ModelKind> make_external(const std::string&);
}  // namespace models

Registry<ModelKind>& model_registry() {
  using namespace models;
  static Registry<ModelKind> r("model", {
      {"linear", "linear", "softmax regression (classes) or least squares (regression outputs)", false, make_linear},
      {"mlp", "mlp", "ReLU layers of model.hidden widths, then a linear head", false, make_mlp},
      {"cnn", "cnn", "5x5 stride-2 convolutions of model.conv_channels, then a linear head (image data)", false, make_cnn},
      {"resnet", "resnet", "the CIFAR ResNet of model.depth layers (6n + 2), stages of model.width, 2x and 4x channels, "
       "batch norm (image data)", false, make_resnet},
      {"external", "external", "your own model, trained by your own workers (libpslab_client.so): tensors of model.sizes, "
       "θ0 from model.theta_file", false, make_external},
  });
  return r;
}

}  // namespace pslab
