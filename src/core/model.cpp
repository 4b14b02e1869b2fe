#include "core/model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace pslab {
namespace {

enum class Init { he, xavier };

void init_uniform(float* w, std::size_t n, double limit, Rng& rng) {
  for (std::size_t i = 0; i < n; ++i) w[i] = float(rng.uniform(-limit, limit));
}

// y = x W + b.  W (in, out) row-major, b (out).
class Linear final : public Layer {
 public:
  Linear(Shape in, int out, Init init) : Layer(in, Shape{out, 1, 1}), init_(init) {}
  std::string describe() const override {
    return "linear(" + std::to_string(in().size()) + "->" + std::to_string(out().size()) + ")";
  }
  std::size_t num_params() const override { return std::size_t(fan_in() + 1) * fan_out(); }
  void init_params(float* w, Rng& rng) const override {
    const double limit = init_ == Init::he ? std::sqrt(6.0 / fan_in())
                                           : std::sqrt(6.0 / (fan_in() + fan_out()));
    init_uniform(w, std::size_t(fan_in()) * fan_out(), limit, rng);
    std::fill_n(w + std::size_t(fan_in()) * fan_out(), fan_out(), 0.0f);
  }
  void bind(float* w, float* g) override {
    W_ = w;
    b_ = w + std::size_t(fan_in()) * fan_out();
    dW_ = g;
    db_ = g + std::size_t(fan_in()) * fan_out();
  }
  void forward(Backend& be, const float* x, float* y, int B, float*) override {
    const int I = fan_in(), O = fan_out();
    be.gemm(Trans::no, Trans::no, B, O, I, 1.0f, x, I, W_, O, 0.0f, y, O);  // (B,I)(I,O)
    be.add_bias(y, b_, B, O, 1);
  }
  void backward(Backend& be, const float* x, const float*, const float* dy, float* dx, int B,
                float*, const GradProgress& progress) override {
    const int I = fan_in(), O = fan_out();
    be.bias_grad(dy, B, O, 1, db_);  // the tail of the slice: b follows W
    progress.ready_from(std::size_t(I) * O);
    // dW = x^T dy, (I, O). On the CPU in blocks of rows from the last, so that a listener
    // hears the tail early; always in the same blocks, listener or not, because BLAS rounds a
    // block's dot products differently from the whole product's. (GPU: one GEMM, one launch.)
    const int rows = be.device() == Device::cpu ? block_rows(I, O) : I;
    for (int hi = I; hi > 0; hi -= rows) {
      const int lo = std::max(0, hi - rows);
      be.gemm(Trans::yes, Trans::no, hi - lo, O, B, 1.0f, x + lo, I, dy, O, 0.0f, dW_ + std::size_t(lo) * O, O);
      progress.ready_from(std::size_t(lo) * O);
    }
    if (dx) be.gemm(Trans::no, Trans::yes, B, I, O, 1.0f, dy, O, W_, O, 0.0f, dx, I);  // dy W^T
  }

 private:
  int fan_in() const { return in().size(); }
  int fan_out() const { return out().size(); }
  // Rows of dW per block: I rows in blocks of about kGradPieceFloats floats, as even as a
  // multiple of 16 rows (BLAS's row blocking) allows, so that no block is a sliver.
  static int block_rows(int I, int O) {
    const std::size_t blocks = std::max<std::size_t>(1, (std::size_t(I) * O + kGradPieceFloats - 1) / kGradPieceFloats);
    return int((std::size_t(I) + blocks - 1) / blocks + 15) / 16 * 16;
  }
  Init init_;
  float *W_ = nullptr, *b_ = nullptr, *dW_ = nullptr, *db_ = nullptr;
};

class Relu final : public Layer {
 public:
  explicit Relu(Shape s) : Layer(s, s) {}
  std::string describe() const override { return "relu"; }
  void forward(Backend& be, const float* x, float* y, int B, float*) override {
    be.relu_forward(x, y, std::size_t(B) * in().size());
  }
  void backward(Backend& be, const float*, const float* y, const float* dy, float* dx, int B,
                float*, const GradProgress&) override {
    if (dx) be.relu_backward(dy, y, dx, std::size_t(B) * in().size());
  }
};

// 2-D convolution: Backend::conv_forward / conv_backward over the whole batch (a constant
// number of backend calls per pass, whatever the batch size), then the bias.
//   x (B, C, H, W) -> y (B, OC, OH, OW); W (OC, C*K*K) row-major, b (OC).
// Scratch: what the backend's convolution needs (Backend::conv_scratch_floats), kept from
// forward to backward.
class Conv2d final : public Layer {
 public:
  Conv2d(Shape in, int out_channels, int k, int stride, int pad, Init init)
      : Layer(in, out_shape(in, out_channels, k, stride, pad)),
        g_{in.c, in.h, in.w, k, k, stride, pad}, init_(init) {}
  std::string describe() const override {
    return "conv" + std::to_string(g_.KH) + "x" + std::to_string(g_.KW) + "/s" +
           std::to_string(g_.stride) + "(" + std::to_string(in().c) + "->" +
           std::to_string(out().c) + ", " + std::to_string(out().h) + "x" +
           std::to_string(out().w) + ")";
  }
  std::size_t num_params() const override { return std::size_t(out().c) * (ckk() + 1); }
  void init_params(float* w, Rng& rng) const override {
    const double fan_in = ckk(), fan_out = double(out().c) * g_.KH * g_.KW;
    const double limit = init_ == Init::he ? std::sqrt(6.0 / fan_in) : std::sqrt(6.0 / (fan_in + fan_out));
    init_uniform(w, std::size_t(out().c) * ckk(), limit, rng);
    std::fill_n(w + std::size_t(out().c) * ckk(), out().c, 0.0f);
  }
  void bind(float* w, float* g) override {
    W_ = w;
    b_ = w + std::size_t(out().c) * ckk();
    dW_ = g;
    db_ = g + std::size_t(out().c) * ckk();
  }
  std::size_t scratch_floats(int batch) const override {
    return Backend::conv_scratch_floats(g_, out().c, batch);
  }
  void forward(Backend& be, const float* x, float* y, int B, float* scratch) override {
    be.conv_forward(x, W_, g_, out().c, B, y, scratch);
    be.add_bias(y, b_, B, out().c, ohw());
  }
  void backward(Backend& be, const float*, const float*, const float* dy, float* dx, int B,
                float* scratch, const GradProgress&) override {
    be.conv_backward(W_, dy, g_, out().c, B, dW_, dx, scratch);
    if (B == 0) return be.fill(db_, std::size_t(out().c), 0.0f);
    be.bias_grad(dy, B, out().c, ohw(), db_);
  }

 private:
  static Shape out_shape(Shape in, int oc, int k, int stride, int pad) {
    const math::ConvGeometry g{in.c, in.h, in.w, k, k, stride, pad};
    if (g.OH() < 1 || g.OW() < 1) throw std::invalid_argument("conv: input too small for the kernel");
    return Shape{oc, g.OH(), g.OW()};
  }
  int ckk() const { return g_.C * g_.KH * g_.KW; }
  int ohw() const { return out().h * out().w; }
  math::ConvGeometry g_;
  Init init_;
  float *W_ = nullptr, *b_ = nullptr, *dW_ = nullptr, *db_ = nullptr;
};

}  // namespace

std::vector<std::unique_ptr<Layer>> build_layers(const ModelSpec& spec) {
  std::vector<std::unique_ptr<Layer>> layers;
  Shape s{spec.channels, spec.height, spec.width};
  auto add = [&](std::unique_ptr<Layer> l) {
    s = l->out();
    layers.push_back(std::move(l));
  };
  if (spec.kind == "linear") {
    add(std::make_unique<Linear>(s, spec.outputs, Init::xavier));
  } else if (spec.kind == "mlp") {
    for (int width : spec.hidden) {
      add(std::make_unique<Linear>(s, width, Init::he));
      add(std::make_unique<Relu>(s));
    }
    add(std::make_unique<Linear>(s, spec.outputs, Init::xavier));
  } else if (spec.kind == "cnn") {
    for (int oc : spec.conv_channels) {
      add(std::make_unique<Conv2d>(s, oc, 5, 2, 2, Init::he));
      add(std::make_unique<Relu>(s));
    }
    add(std::make_unique<Linear>(s, spec.outputs, Init::xavier));
  } else {
    throw std::invalid_argument("unknown model kind \"" + spec.kind +
                                "\" (expected \"linear\", \"mlp\" or \"cnn\")");
  }
  return layers;
}

std::size_t count_params(const ModelSpec& spec) {
  std::size_t p = 0;
  for (const auto& l : build_layers(spec)) p += l->num_params();
  return p;
}

std::vector<float> initial_params(const ModelSpec& spec, std::uint64_t seed) {
  const auto layers = build_layers(spec);
  std::vector<float> theta(count_params(spec), 0.0f);
  if (spec.init == "zeros") return theta;
  if (spec.init != "he") throw std::invalid_argument("unknown model init \"" + spec.init + "\" (expected \"he\" or \"zeros\")");
  std::size_t off = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    Rng rng = Rng::derive(seed, {0x1A7E5u, i});
    layers[i]->init_params(theta.data() + off, rng);
    off += layers[i]->num_params();
  }
  return theta;
}

Model::Model(Backend& be, const ModelSpec& spec, int max_batch, float* grad_storage)
    : be_(be), spec_(spec), max_batch_(max_batch), layers_(build_layers(spec)) {
  if (max_batch < 1) throw std::invalid_argument("Model: max_batch must be >= 1");
  if (grad_storage && be.device() != Device::cpu) throw std::invalid_argument("Model: grad_storage is for CPU backends");
  const std::size_t P = count_params(spec);
  params_ = DeviceBuffer<float>(be, P);
  if (!grad_storage) grads_ = DeviceBuffer<float>(be, P);
  grads_ptr_ = grad_storage ? grad_storage : grads_.data();
  std::size_t off = 0;
  std::size_t widest = std::size_t(spec.channels) * spec.height * spec.width;
  acts_.emplace_back();  // the input is the caller's buffer
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = *layers_[i];
    l.bind(params_.data() + off, grads_ptr_ + off);
    off += l.num_params();
    acts_.emplace_back(be, std::size_t(max_batch) * l.out().size());
    scratch_.emplace_back(be, l.scratch_floats(max_batch));
    widest = std::max(widest, std::size_t(l.out().size()));
  }
  if (layers_.back()->out().size() != spec.outputs)
    throw std::logic_error("Model: last layer width differs from spec.outputs");
  dout_ = DeviceBuffer<float>(be, std::size_t(max_batch) * spec.outputs);
  dping_ = DeviceBuffer<float>(be, std::size_t(max_batch) * widest);
  dpong_ = DeviceBuffer<float>(be, std::size_t(max_batch) * widest);
  inputs_.resize(layers_.size());
  be.fill(params_.data(), params_.size(), 0.0f);
  be.fill(grads_ptr_, P, 0.0f);
}

void Model::init(std::uint64_t seed) { load_params(initial_params(spec_, seed).data()); }

void Model::load_params(const float* host) {
  be_.copy_from_host(params_.data(), host, params_.bytes());
}

void Model::store_params(float* host) const {
  be_.copy_to_host(host, params_.data(), params_.bytes());
}

std::vector<std::size_t> layer_sizes(const ModelSpec& spec, std::size_t offset, std::size_t length) {
  std::vector<std::size_t> out;
  std::size_t lo = 0;
  for (const auto& l : build_layers(spec)) {
    const std::size_t hi = lo + l->num_params();
    const std::size_t a = std::max(lo, offset), b = std::min(hi, offset + length);
    if (a < b) out.push_back(b - a);
    lo = hi;
  }
  return out;
}

std::vector<ParamInfo> Model::param_info() const {
  std::vector<ParamInfo> out;
  std::size_t off = 0;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const std::size_t n = layers_[i]->num_params();
    if (n) out.push_back({std::to_string(i) + "." + layers_[i]->describe(), off, n});
    off += n;
  }
  return out;
}

std::string Model::describe() const {
  std::string s;
  for (const auto& l : layers_) s += (s.empty() ? "" : " -> ") + l->describe();
  return s + " (" + std::to_string(num_params()) + " parameters)";
}

const float* Model::forward(const float* x, int B) {
  if (B > max_batch_)
    throw std::invalid_argument("Model: batch of " + std::to_string(B) +
                                " exceeds the max_batch " + std::to_string(max_batch_));
  const float* in = x;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    inputs_[i] = in;
    layers_[i]->forward(be_, in, acts_[i + 1].data(), B, scratch_[i].data());
    in = acts_[i + 1].data();
  }
  return in;
}

double Model::loss(const float* out, const std::int32_t* labels, const float* targets, int B,
                   float grad_scale) {
  return spec_.loss == Loss::softmax_xent
             ? be_.softmax_xent(out, labels, B, spec_.outputs, grad_scale, dout_.data())
             : be_.mse(out, targets, B, spec_.outputs, grad_scale, dout_.data());
}

double Model::forward_backward(const float* x, const std::int32_t* labels, const float* targets,
                               int B, float grad_scale, GradListener* listener) {
  if (B == 0) {
    be_.fill(grads_ptr_, num_params(), 0.0f);
    if (listener) listener->ready(0);
    return 0.0;
  }
  const float* out = forward(x, B);
  // The loss is read after backward is queued: on a GPU it does not stall the step between
  // the two (Backend::take_loss waits for the loss alone).
  const float scale = grad_scale < 0 ? 1.0f / float(B) : grad_scale;
  if (spec_.loss == Loss::softmax_xent) be_.softmax_xent_deferred(out, labels, B, spec_.outputs, scale, dout_.data());
  else be_.mse_deferred(out, targets, B, spec_.outputs, scale, dout_.data());
  const float* dy = dout_.data();
  float* bufs[2] = {dping_.data(), dpong_.data()};
  std::size_t offset = num_params();  // of layer i's slice in ∇θ
  for (std::size_t i = layers_.size(); i-- > 0;) {
    float* dx = i == 0 ? nullptr : bufs[i % 2];
    offset -= layers_[i]->num_params();
    const GradProgress progress{listener, offset};
    layers_[i]->backward(be_, inputs_[i], acts_[i + 1].data(), dy, dx, B, scratch_[i].data(), progress);
    progress.ready_from(0);
    dy = dx;
  }
  return be_.take_loss() / B;
}

EvalCounts Model::evaluate(const float* x, const std::int32_t* labels, const float* targets,
                           int B) {
  EvalCounts c;
  if (B == 0) return c;
  const float* out = forward(x, B);
  c.loss_sum = loss(out, labels, targets, B, 0.0f);
  if (spec_.loss == Loss::softmax_xent) c.correct = be_.count_correct(out, labels, B, spec_.outputs);
  c.samples = B;
  return c;
}

}  // namespace pslab
