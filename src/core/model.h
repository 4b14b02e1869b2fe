// Models over one flat parameter vector.
//
// A model is a sequence of layers. Its parameters θ are ONE contiguous float32 vector of
// length P on the backend's device, and its gradient ∇θ another; each layer's weights and
// biases are views (offsets) into them. Push, pull, all-reduce and checkpoints therefore move
// one buffer. Activations are preallocated for `max_batch` rows: no allocation per step.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "core/registry.h"
#include "core/rng.h"

namespace pslab {

enum class Loss { softmax_xent, mse };

// What to build. Input shape (channels, height, width); `outputs` = classes (softmax_xent)
// or regression outputs (mse).
struct ModelSpec {
  std::string kind = "mlp";           // a model of core/models/: "linear", "mlp", "cnn", "resnet"
  int channels = 1, height = 28, width = 28;
  int outputs = 10;
  std::vector<int> hidden = {256, 128};     // mlp: widths of the hidden layers
  std::vector<int> conv_channels = {16, 32};  // cnn: 5x5 stride-2 pad-2 convolutions, then a linear head
  int depth = 20;        // resnet: layers, 6n + 2 (n blocks per stage)
  int stage_width = 16;  // resnet: channels of the first stage (model.width); then twice, four times
  Loss loss = Loss::softmax_xent;
  std::string init = "he";  // "he": He/Xavier-uniform weights, zero biases; "zeros": all zero
  std::vector<int> sizes;   // external: its parameter tensors' sizes, in θ's order
  std::string theta_file;   // external: θ at initialisation, P float32 values (native byte order); "": zeros
};

// Told during backward which part of ∇θ is final, so that communication can start on it
// while backward goes on (overlap). ready(lo): ∇θ[lo, P) will not change again this step. lo
// never grows within a step and the last call of a step has lo = 0. On a GPU backend the
// kernels writing ∇θ[lo, P) are enqueued, not necessarily finished.
// Threading: called on the thread that runs backward.
class GradListener {
 public:
  virtual ~GradListener() = default;
  virtual void ready(std::size_t lo) = 0;
};

// A layer's view of the listener: its gradient slice starts at `base` in ∇θ.
struct GradProgress {
  GradListener* listener = nullptr;
  std::size_t base = 0;
  void ready_from(std::size_t local_lo) const {
    if (listener) listener->ready(base + local_lo);
  }
};

// Floats of ∇θ a layer finishes between two ready() calls when someone listens (about
// 128 KiB: small enough to start pushes early, large enough for BLAS to stay efficient).
inline constexpr std::size_t kGradPieceFloats = 32768;

struct Shape {
  int c = 1, h = 1, w = 1;
  int size() const { return c * h * w; }
};

// How a forward pass runs. Training: batch norm normalises with the batch's statistics and
// moves its running statistics by `momentum` toward them (1: replaces them). Inference: the
// running statistics normalise, and nothing changes.
struct ForwardMode {
  bool training = true;
  float momentum = 0.1f;
};

// One layer. Threading: used by the thread that owns the model.
class Layer {
 public:
  Layer(Shape in, Shape out) : in_(in), out_(out) {}
  virtual ~Layer() = default;
  virtual std::string describe() const = 0;
  Shape in() const { return in_; }
  Shape out() const { return out_; }

  virtual std::size_t num_params() const { return 0; }
  // Writes this layer's initial parameters (host memory, num_params() floats).
  virtual void init_params(float* /*w*/, Rng& /*rng*/) const {}
  // Points the layer at its slices of θ and ∇θ (device memory).
  virtual void bind(float* /*w*/, float* /*g*/) {}
  // Device scratch floats needed on `be` for a batch of `batch` rows, kept from forward to
  // backward (a batch smaller than the one it was sized for needs no more).
  virtual std::size_t scratch_floats(Backend& /*be*/, int /*batch*/) const { return 0; }
  // State forward keeps beside θ (batch norm's running statistics): not trained, not pushed.
  // state_floats() floats of device memory; init_state writes their initial values (host).
  virtual std::size_t state_floats() const { return 0; }
  virtual void init_state(float* /*s*/) const {}
  virtual void bind_state(float* /*s*/) {}
  // Set by the model before each forward pass.
  virtual void set_mode(const ForwardMode& /*m*/) {}
  // The sizes of the layers this one is made of that hold parameters (a composite's parts), in
  // θ's order: what a layer-wise optimizer treats as layers.
  virtual std::vector<std::size_t> param_groups() const {
    return num_params() ? std::vector<std::size_t>{num_params()} : std::vector<std::size_t>{};
  }

  // x (B, in) -> y (B, out).
  virtual void forward(Backend& be, const float* x, float* y, int B, float* scratch) = 0;
  // dy (B, out) -> dx (B, in) and this layer's gradient slice (overwritten, not accumulated).
  // dx == nullptr when the input gradient is not needed (the first layer). A layer may report
  // finished tails of its slice to `progress` as it goes (same values, just told earlier).
  virtual void backward(Backend& be, const float* x, const float* y, const float* dy, float* dx,
                        int B, float* scratch, const GradProgress& progress) = 0;

 private:
  Shape in_, out_;
};

// A model kind (model.kind): the layers it builds for a spec. One file each in core/models/,
// a line each in model_registry() (core/models/registry.cpp).
class ModelKind {
 public:
  virtual ~ModelKind() = default;
  // The layers for `spec` (its input shape, its outputs, the kind's own keys); throws
  // std::invalid_argument saying what the spec lacks (a cnn: image input).
  virtual std::vector<std::unique_ptr<Layer>> layers(const ModelSpec& spec) const = 0;
};
Registry<ModelKind>& model_registry();

// Builds the layers of a spec (no device memory; the server uses this to size and
// initialise θ without a backend).
std::vector<std::unique_ptr<Layer>> build_layers(const ModelSpec& spec);
std::size_t count_params(const ModelSpec& spec);
// Whether a layer keeps state besides θ (batch norm's running statistics).
bool has_state(const ModelSpec& spec);
// θ at initialisation, deterministic for a seed: He-uniform for layers followed by ReLU,
// Xavier-uniform for the output layer, zero biases (init "he"); or all zeros (init "zeros",
// fine for convex models and for exact tests). An external model's: its theta_file, or zeros.
std::vector<float> initial_params(const ModelSpec& spec, std::uint64_t seed);

struct ParamInfo {
  std::string name;    // e.g. "2.linear.weight"
  std::size_t offset;  // into θ, in floats
  std::size_t size;    // floats
};

// The sizes of the parameter-holding layers of `spec` cut to θ[offset, offset + length), in
// order (they sum to length): what a layer-wise optimizer over that range treats as layers.
std::vector<std::size_t> layer_sizes(const ModelSpec& spec, std::size_t offset, std::size_t length);

struct EvalCounts {
  double loss_sum = 0.0;  // summed over samples
  long correct = 0;       // classification only
  long samples = 0;
};

// Milliseconds `work` takes on `be`, the backend synchronized before and after it (its queued
// work counted, not only the host's): for profiling (Model::profile_passes), never a step.
template <typename F>
double synchronized_ms(Backend& be, F&& work) {
  be.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  work();
  be.synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

class Model {
 public:
  // grad_storage: num_params() floats of host memory to hold ∇θ instead of a buffer of the
  // model's own (CPU backends only; e.g. memory a transport sends from without a copy).
  Model(Backend& be, const ModelSpec& spec, int max_batch, float* grad_storage = nullptr);

  const ModelSpec& spec() const { return spec_; }
  std::size_t num_params() const { return params_.size(); }
  float* params() { return params_.data(); }  // θ, device
  float* grads() { return grads_ptr_; }       // ∇θ, device
  int max_batch() const { return max_batch_; }
  std::vector<ParamInfo> param_info() const;
  std::string describe() const;

  // θ = initial_params(spec, seed).
  void init(std::uint64_t seed);
  // Copies θ from / to host memory (num_params() floats).
  void load_params(const float* host);
  void store_params(float* host) const;

  // Forward (training mode) and backward on a batch already on the device: x (B, features; images
  // in NCHW, which the model relays once where the backend holds them otherwise); labels (B) for
  // softmax_xent or targets (B, outputs) for mse. Overwrites ∇θ with the gradient of
  // grad_scale x the summed loss (grad_scale < 0: 1/B, the batch mean) and returns the mean
  // loss of the batch. B == 0 gives a zero gradient and loss 0. (All-reduce passes
  // 1/global batch, so that the sum over ranks is the global mean with no extra pass.)
  // `listener` (optional) hears which tail of ∇θ is final as backward goes; the gradient is
  // bitwise the same with or without one.
  double forward_backward(const float* x, const std::int32_t* labels, const float* targets, int B,
                          float grad_scale = -1.0f, GradListener* listener = nullptr);
  // forward_backward's work for B >= 1, queued: the loss is then the backend's pending deferred
  // loss (Backend::take_loss() is its sum over the batch). Nothing here waits or reads back: a
  // backend may record it as a step graph (Backend::begin_recording).
  void queue_forward_backward(const float* x, const std::int32_t* labels, const float* targets, int B,
                              float grad_scale = -1.0f, GradListener* listener = nullptr);
  // Forward only, in inference mode (batch norm: the running statistics): summed loss and
  // number of correct argmax predictions.
  EvalCounts evaluate(const float* x, const std::int32_t* labels, const float* targets, int B);

  // Floats of state beside θ (batch norm's running statistics; 0: the model keeps none).
  std::size_t state_floats() const { return state_.size(); }
  // Sets the state to its initial values (running mean 0, variance 1).
  void reset_state();
  void load_state(const float* host);
  void store_state(float* host) const;
  // Measures the running statistics afresh for the current θ: call with batches k = 0, 1, ...
  // of training samples; afterwards they are the plain average of those batches' statistics
  // (a training-mode forward whose momentum is 1 / (k + 1)). ∇θ is not touched.
  void measure_statistics(const float* x, int B, int k);

  // Where a training step's time goes (bench_train --profile): each layer's forward and backward
  // pass and the loss's, timed apart (the backend synchronized before and after each, so a
  // pass's time is its own), averaged over `reps` steps after one untimed step (plans,
  // workspaces). A step graph or a GPU's queue runs them back to back: their sum exceeds a
  // step's time. Leaves what a training step on the batch leaves (∇θ, running statistics).
  struct PassTimes {
    std::string pass;  // "2.conv5x5/s2(16->32, 7x7)", or "loss"
    double forward_ms = 0.0, backward_ms = 0.0;
  };
  std::vector<PassTimes> profile_passes(const float* x, const std::int32_t* labels, const float* targets, int B, int reps);

 private:
  const float* forward(const float* x, int B, const ForwardMode& mode);
  const float* model_input(const float* x, int B);  // x in the backend's image layout
  // Layer i's forward on `in` (its output), and its backward from dy (dx: null for layer 0),
  // writing its slice of ∇θ, which ends at `end` (moved to where it begins).
  const float* forward_layer(std::size_t i, const float* in, int B, const ForwardMode& mode);
  const float* backward_layer(std::size_t i, const float* dy, int B, std::size_t& end, GradListener* listener);
  double loss(const float* out, const std::int32_t* labels, const float* targets, int B,
              float grad_scale);

  Backend& be_;
  ModelSpec spec_;
  int max_batch_;
  std::vector<std::unique_ptr<Layer>> layers_;
  DeviceBuffer<float> params_, grads_, state_;
  float* grads_ptr_ = nullptr;  // grads_, or the caller's grad_storage
  std::vector<DeviceBuffer<float>> acts_;     // acts_[i]: input of layer i (acts_[0] unused: x)
  std::vector<DeviceBuffer<float>> scratch_;  // per layer
  DeviceBuffer<float> dout_, dping_, dpong_;  // loss gradient and ping-pong input gradients
  std::vector<const float*> inputs_;          // inputs_[i] = pointer used as input of layer i
  DeviceBuffer<float> relaid_input_;  // x in the backend's image layout, where that is not NCHW (Backend::image_layout)
};

}  // namespace pslab
