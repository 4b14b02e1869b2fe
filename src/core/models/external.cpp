// external: a model pslab does not compute — its workers are the user's own (a PyTorch module
// through worker/python/pslab and libpslab_client.so). The servers need only its shape: one
// parameter tensor per entry of model.sizes, in θ's order (what layer-wise optimizers treat as
// layers), and its θ at initialisation (model.theta_file, else zeros). pslab_worker refuses to
// train or evaluate it.
#include <stdexcept>

#include "core/model.h"

namespace pslab::models {
namespace {

// One parameter tensor of `size` floats, with nothing to compute.
class Tensor final : public Layer {
 public:
  explicit Tensor(int size) : Layer(Shape{}, Shape{}), size_(std::size_t(size)) {}
  std::string describe() const override { return "tensor(" + std::to_string(size_) + ")"; }
  std::size_t num_params() const override { return size_; }
  void forward(Backend&, const float*, float*, int, float*) override { refuse(); }
  void backward(Backend&, const float*, const float*, const float*, float*, int, float*, const GradProgress&) override {
    refuse();
  }

 private:
  [[noreturn]] static void refuse() {
    throw std::logic_error("model.kind = \"external\" is computed by its own workers (libpslab_client.so), not by pslab");
  }
  std::size_t size_;
};

struct ExternalModel final : ModelKind {
  std::vector<std::unique_ptr<Layer>> layers(const ModelSpec& spec) const override {
    if (spec.sizes.empty())
      throw std::invalid_argument("model.kind = \"external\" needs model.sizes: its parameter tensors' sizes, in θ's order");
    std::vector<std::unique_ptr<Layer>> l;
    for (int size : spec.sizes) {
      if (size <= 0) throw std::invalid_argument("model.sizes: every size must be > 0, got " + std::to_string(size));
      l.push_back(std::make_unique<Tensor>(size));
    }
    return l;
  }
};

}  // namespace

std::unique_ptr<ModelKind> make_external(const std::string&) { return std::make_unique<ExternalModel>(); }

}  // namespace pslab::models
