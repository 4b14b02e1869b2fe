// The layers models are built from (core/models/), each over its slices of θ and ∇θ
// (Layer, core/model.h): Linear, Relu, Conv2d, BatchNorm2d, GlobalAvgPool and Residual.
#pragma once

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/model.h"

namespace pslab {

// How a layer's weights start (its biases start at zero): He-uniform for a layer followed by a
// ReLU, Xavier-uniform otherwise (the output layer).
enum class Init { he, xavier };

// n values uniform in [-limit, limit] from rng.
void init_uniform(float* w, std::size_t n, double limit, Rng& rng);

// y = x W + b.  W (in, out) row-major, b (out). An image input (channels and pixels) is read in
// NCHW order on every backend: on an NHWC one (Backend::image_layout) it is relaid into the
// scratch first, and its gradient relaid back, so that W means the same everywhere.
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
  std::size_t scratch_floats(Backend& be, int batch) const override {
    return relaid(be) ? std::size_t(batch) * fan_in() : 0;  // the input in NCHW, then its gradient
  }
  void forward(Backend& be, const float* x, float* y, int B, float* scratch) override {
    const int I = fan_in(), O = fan_out();
    if (relaid(be)) be.relayout_images(x, B, in().c, in().h * in().w, ImageLayout::nchw, scratch), x = scratch;
    be.gemm(Trans::no, Trans::no, B, O, I, 1.0f, x, I, W_, O, 0.0f, y, O);  // (B,I)(I,O)
    be.add_bias(y, b_, B, O, 1);
  }
  void backward(Backend& be, const float* x, const float*, const float* dy, float* dx, int B,
                float* scratch, const GradProgress& progress) override {
    const int I = fan_in(), O = fan_out();
    if (relaid(be)) x = scratch;  // (forward's NCHW input)
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
    if (!dx) return;
    float* dx_nchw = relaid(be) ? scratch : dx;
    be.gemm(Trans::no, Trans::yes, B, I, O, 1.0f, dy, O, W_, O, 0.0f, dx_nchw, I);  // dy W^T
    if (relaid(be)) be.relayout_images(dx_nchw, B, in().c, in().h * in().w, ImageLayout::nhwc, dx);
  }

 private:
  // An image input (more than one channel and pixel) on an NHWC backend.
  bool relaid(const Backend& be) const {
    return be.image_layout() == ImageLayout::nhwc && in().c > 1 && in().h * in().w > 1;
  }
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
// number of backend calls per pass, whatever the batch size), then the bias (if it has one:
// none before a batch norm, which would cancel it).
//   x (B, C, H, W) -> y (B, OC, OH, OW) in the backend's image layout; W (OC, C*K*K) row-major
//   (OIHW on every backend), b (OC).
// Scratch: what the backend's convolution needs (Backend::conv_scratch_floats), kept from
// forward to backward.
class Conv2d final : public Layer {
 public:
  Conv2d(Shape in, int out_channels, int k, int stride, int pad, Init init, bool bias = true)
      : Layer(in, out_shape(in, out_channels, k, stride, pad)),
        g_{in.c, in.h, in.w, k, k, stride, pad}, init_(init), bias_(bias) {}
  std::string describe() const override {
    return "conv" + std::to_string(g_.KH) + "x" + std::to_string(g_.KW) + "/s" +
           std::to_string(g_.stride) + "(" + std::to_string(in().c) + "->" +
           std::to_string(out().c) + ", " + std::to_string(out().h) + "x" +
           std::to_string(out().w) + (bias_ ? "" : ", no bias") + ")";
  }
  std::size_t num_params() const override { return std::size_t(out().c) * (ckk() + bias_); }
  void init_params(float* w, Rng& rng) const override {
    const double fan_in = ckk(), fan_out = double(out().c) * g_.KH * g_.KW;
    const double limit = init_ == Init::he ? std::sqrt(6.0 / fan_in) : std::sqrt(6.0 / (fan_in + fan_out));
    init_uniform(w, std::size_t(out().c) * ckk(), limit, rng);
    if (bias_) std::fill_n(w + std::size_t(out().c) * ckk(), out().c, 0.0f);
  }
  void bind(float* w, float* g) override {
    W_ = w;
    b_ = w + std::size_t(out().c) * ckk();
    dW_ = g;
    db_ = g + std::size_t(out().c) * ckk();
  }
  std::size_t scratch_floats(Backend& be, int batch) const override {
    return be.conv_scratch_floats(g_, out().c, batch);
  }
  void forward(Backend& be, const float* x, float* y, int B, float* scratch) override {
    be.conv_forward(x, W_, g_, out().c, B, y, scratch);
    if (!bias_) return;
    const auto [outer, inner] = around_channels(be, B);
    be.add_bias(y, b_, outer, out().c, inner);
  }
  void backward(Backend& be, const float* x, const float*, const float* dy, float* dx, int B,
                float* scratch, const GradProgress&) override {
    be.conv_backward(x, W_, dy, g_, out().c, B, dW_, dx, scratch);
    if (!bias_) return;
    if (B == 0) return be.fill(db_, std::size_t(out().c), 0.0f);
    const auto [outer, inner] = around_channels(be, B);
    be.bias_grad(dy, outer, out().c, inner, db_);
  }

 private:
  static Shape out_shape(Shape in, int oc, int k, int stride, int pad) {
    const math::ConvGeometry g{in.c, in.h, in.w, k, k, stride, pad};
    if (g.OH() < 1 || g.OW() < 1) throw std::invalid_argument("conv: input too small for the kernel");
    return Shape{oc, g.OH(), g.OW()};
  }
  int ckk() const { return g_.C * g_.KH * g_.KW; }
  int ohw() const { return out().h * out().w; }
  // The output's dimensions outside and inside its channels (Backend::add_bias's outer and
  // inner): (B, OH*OW) in NCHW, (B*OH*OW, 1) in NHWC.
  std::pair<int, int> around_channels(const Backend& be, int B) const {
    return be.image_layout() == ImageLayout::nhwc ? std::pair{B * ohw(), 1} : std::pair{B, ohw()};
  }
  math::ConvGeometry g_;
  Init init_;
  bool bias_;
  float *W_ = nullptr, *b_ = nullptr, *dW_ = nullptr, *db_ = nullptr;
};

// Batch normalisation over each channel of x (B, C, H, W) (Backend::batch_norm_forward):
// y = gamma (x - mean) invstd + beta. θ: gamma (C), starting at 1, then beta (C), at 0.
// State: the running mean (C), from 0, then the running variance (C), from 1. Scratch: the
// batch's mean and invstd (C each), kept from forward to backward. Training mode normalises
// with the batch's statistics, inference mode with the running ones (ForwardMode).
class BatchNorm2d final : public Layer {
 public:
  static constexpr float kEps = 1e-5f;  // PyTorch's and cuDNN's default
  explicit BatchNorm2d(Shape s) : Layer(s, s) {}
  std::string describe() const override { return "batchnorm(" + std::to_string(in().c) + ")"; }
  std::size_t num_params() const override { return 2 * std::size_t(in().c); }
  void init_params(float* w, Rng&) const override {
    std::fill_n(w, in().c, 1.0f);
    std::fill_n(w + in().c, in().c, 0.0f);
  }
  void bind(float* w, float* g) override { gamma_ = w, dgamma_ = g; }
  std::size_t state_floats() const override { return 2 * std::size_t(in().c); }
  void init_state(float* s) const override {
    std::fill_n(s, in().c, 0.0f);
    std::fill_n(s + in().c, in().c, 1.0f);
  }
  void bind_state(float* s) override { running_ = s; }
  void set_mode(const ForwardMode& m) override { mode_ = m; }
  std::size_t scratch_floats(Backend&, int) const override { return 2 * std::size_t(in().c); }
  void forward(Backend& be, const float* x, float* y, int B, float* scratch) override {
    const int C = in().c;
    be.batch_norm_forward(x, B, C, hw(), gamma_, gamma_ + C, mode_.training, mode_.momentum, kEps, running_,
                          running_ + C, scratch, scratch + C, y);
  }
  void backward(Backend& be, const float* x, const float*, const float* dy, float* dx, int B, float* scratch,
                const GradProgress&) override {
    const int C = in().c;
    be.batch_norm_backward(x, dy, B, C, hw(), gamma_, scratch, scratch + C, dgamma_, dgamma_ + C, dx);
  }

 private:
  int hw() const { return in().h * in().w; }
  float *gamma_ = nullptr, *dgamma_ = nullptr, *running_ = nullptr;
  ForwardMode mode_;
};

// The mean of each channel: x (B, C, H, W) -> y (B, C). One GEMM each way against a vector of
// ones (scratch: H*W floats, written by forward); on an NHWC backend its mean pool.
class GlobalAvgPool final : public Layer {
 public:
  explicit GlobalAvgPool(Shape in) : Layer(in, Shape{in.c, 1, 1}) {}
  std::string describe() const override { return "avgpool(" + std::to_string(in().h) + "x" + std::to_string(in().w) + ")"; }
  std::size_t scratch_floats(Backend&, int) const override { return std::size_t(hw()); }
  void forward(Backend& be, const float* x, float* y, int B, float* ones) override {
    if (be.image_layout() == ImageLayout::nhwc) return be.mean_pool_nhwc(x, B, in().c, hw(), y);
    be.fill(ones, std::size_t(hw()), 1.0f);
    be.gemm(Trans::no, Trans::no, B * in().c, 1, hw(), 1.0f / float(hw()), x, hw(), ones, 1, 0.0f, y, 1);  // (BC,HW)(HW,1)
  }
  void backward(Backend& be, const float*, const float*, const float* dy, float* dx, int B, float* ones,
                const GradProgress&) override {
    if (dx && be.image_layout() == ImageLayout::nhwc) return be.mean_pool_nhwc_backward(dy, B, in().c, hw(), dx);
    if (dx) be.gemm(Trans::no, Trans::no, B * in().c, hw(), 1, 1.0f / float(hw()), dy, 1, ones, hw(), 0.0f, dx, hw());
  }

 private:
  int hw() const { return in().h * in().w; }
};

// A residual block: y = relu(main(x) + shortcut(x)), each path a chain of layers (an empty
// shortcut: the identity, which needs main's output shape to be the input's). θ, the state and
// the scratch hold the main path's layers' then the shortcut's, in order; the scratch also
// every sub-layer's output and three gradient buffers (Residual::Layout).
class Residual final : public Layer {
 public:
  Residual(std::vector<std::unique_ptr<Layer>> main, std::vector<std::unique_ptr<Layer>> shortcut);
  ~Residual() override;
  std::string describe() const override;
  std::size_t num_params() const override;
  void init_params(float* w, Rng& rng) const override;
  void bind(float* w, float* g) override;
  std::size_t state_floats() const override;
  void init_state(float* s) const override;
  void bind_state(float* s) override;
  void set_mode(const ForwardMode& m) override;
  std::vector<std::size_t> param_groups() const override;
  std::size_t scratch_floats(Backend& be, int batch) const override;
  void forward(Backend& be, const float* x, float* y, int B, float* scratch) override;
  void backward(Backend& be, const float* x, const float* y, const float* dy, float* dx, int B, float* scratch,
                const GradProgress& progress) override;

 private:
  struct Layout;  // where each part of the scratch is for a batch of B
  const Layout& layout(Backend& be, float* scratch, int B);  // (layout_, filled in: no allocation per pass)
  const std::vector<Layer*>& all() const;  // main's layers, then the shortcut's
  std::vector<std::unique_ptr<Layer>> main_, shortcut_;
  std::vector<Layer*> all_;
  std::unique_ptr<Layout> layout_;
};

}  // namespace pslab
