// Gradient checks: the float32 backprop of every layer and of whole models against central
// finite differences of an independent float64 reference (direct loops, direct convolution
// instead of im2col), on the CPU backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend.h"
#include "core/layers.h"
#include "core/model.h"
#include "core/optimizer.h"
#include "core/replica.h"
#include "core/rng.h"

using namespace pslab;

namespace {

// ---- float64 reference forward pass, following the parameter layout of model.cpp ----
// Linear: W (in, out) row-major then b (out). Conv: W (OC, C*5*5) then b (OC), stride 2, pad 2.
struct Ref {
  const ModelSpec& spec;
  const std::vector<double>& theta;
  std::size_t off = 0;

  std::vector<double> linear(const std::vector<double>& x, int B, int in, int out) {
    std::vector<double> y(std::size_t(B) * out);
    const double* W = &theta[off];
    const double* b = W + std::size_t(in) * out;
    for (int r = 0; r < B; ++r)
      for (int o = 0; o < out; ++o) {
        double s = b[o];
        for (int i = 0; i < in; ++i) s += x[std::size_t(r) * in + i] * W[std::size_t(i) * out + o];
        y[std::size_t(r) * out + o] = s;
      }
    off += std::size_t(in + 1) * out;
    return y;
  }
  static std::vector<double> relu(std::vector<double> x) {
    for (auto& v : x) v = v > 0 ? v : 0;
    return x;
  }
  // x (B, C, H, W) -> (B, OC, OH, OW), a K x K kernel with stride S and padding P; W (OC, C*K*K)
  // then, if `bias`, b (OC).
  std::vector<double> conv(const std::vector<double>& x, int B, int C, int H, int W_, int OC, int& OH, int& OW,
                           int K = 5, int S = 2, int P = 2, bool bias = true) {
    OH = (H + 2 * P - K) / S + 1, OW = (W_ + 2 * P - K) / S + 1;
    const double* W = &theta[off];
    const double* b = W + std::size_t(OC) * C * K * K;
    std::vector<double> y(std::size_t(B) * OC * OH * OW);
    for (int n = 0; n < B; ++n)
      for (int oc = 0; oc < OC; ++oc)
        for (int oh = 0; oh < OH; ++oh)
          for (int ow = 0; ow < OW; ++ow) {
            double s = bias ? b[oc] : 0.0;
            for (int c = 0; c < C; ++c)
              for (int kh = 0; kh < K; ++kh)
                for (int kw = 0; kw < K; ++kw) {
                  const int ih = oh * S - P + kh, iw = ow * S - P + kw;
                  if (ih < 0 || iw < 0 || ih >= H || iw >= W_) continue;
                  s += W[((oc * C + c) * K + kh) * K + kw] * x[((std::size_t(n) * C + c) * H + ih) * W_ + iw];
                }
            y[((std::size_t(n) * OC + oc) * OH + oh) * OW + ow] = s;
          }
    off += std::size_t(OC) * (C * K * K + bias);
    return y;
  }
  // Batch norm in training mode: each channel of x (B, C, HW) by its batch mean and biased
  // variance; gamma (C) then beta (C).
  std::vector<double> batch_norm(std::vector<double> x, int B, int C, int HW) {
    const double* gamma = &theta[off];
    const double* beta = gamma + C;
    for (int c = 0; c < C; ++c) {
      double mean = 0, var = 0;
      for (int n = 0; n < B; ++n)
        for (int i = 0; i < HW; ++i) mean += x[(std::size_t(n) * C + c) * HW + i] / (B * HW);
      for (int n = 0; n < B; ++n)
        for (int i = 0; i < HW; ++i) var += std::pow(x[(std::size_t(n) * C + c) * HW + i] - mean, 2) / (B * HW);
      for (int n = 0; n < B; ++n)
        for (int i = 0; i < HW; ++i) {
          double& v = x[(std::size_t(n) * C + c) * HW + i];
          v = gamma[c] * (v - mean) / std::sqrt(var + 1e-5) + beta[c];
        }
    }
    off += 2 * std::size_t(C);
    return x;
  }
  // The resnet of core/models/resnet.cpp: conv-bn-relu, 3 stages of basic blocks, mean pool.
  std::vector<double> resnet(std::vector<double> h, int B, int& width) {
    int C = spec.channels, H = spec.height, W = spec.width, OH, OW;
    auto conv_bn = [&](const std::vector<double>& in, int c, int hh, int ww, int oc, int k, int stride) {
      std::vector<double> y = conv(in, B, c, hh, ww, oc, OH, OW, k, stride, k / 2, false);
      return batch_norm(y, B, oc, OH * OW);
    };
    h = relu(conv_bn(h, C, H, W, spec.stage_width, 3, 1));
    C = spec.stage_width;
    for (int stage = 0; stage < 3; ++stage)
      for (int b = 0; b < (spec.depth - 2) / 6; ++b) {
        const int oc = spec.stage_width << stage, stride = stage > 0 && b == 0 ? 2 : 1;
        std::vector<double> m = relu(conv_bn(h, C, H, W, oc, 3, stride));
        const int MH = OH, MW = OW;
        m = conv_bn(m, oc, MH, MW, oc, 3, 1);
        const std::vector<double> shortcut = stride != 1 || C != oc ? conv_bn(h, C, H, W, oc, 1, stride) : h;
        for (std::size_t i = 0; i < m.size(); ++i) m[i] = std::max(0.0, m[i] + shortcut[i]);
        h = m, C = oc, H = MH, W = MW;
      }
    std::vector<double> pooled(std::size_t(B) * C, 0.0);
    for (std::size_t i = 0; i < pooled.size(); ++i)
      for (int k = 0; k < H * W; ++k) pooled[i] += h[i * H * W + k] / (H * W);
    width = C;
    return pooled;
  }

  // Mean loss over the batch.
  double loss(const std::vector<double>& x, const std::vector<std::int32_t>& labels,
              const std::vector<double>& targets, int B) {
    off = 0;
    std::vector<double> h = x;
    int width = spec.channels * spec.height * spec.width;
    if (spec.kind == "mlp") {
      for (int w : spec.hidden) h = relu(linear(h, B, width, w)), width = w;
    } else if (spec.kind == "cnn") {
      int C = spec.channels, H = spec.height, W = spec.width;
      for (int oc : spec.conv_channels) {
        int OH, OW;
        h = relu(conv(h, B, C, H, W, oc, OH, OW));
        C = oc, H = OH, W = OW;
      }
      width = C * H * W;
    } else if (spec.kind == "resnet") {
      h = resnet(h, B, width);
    }
    h = linear(h, B, width, spec.outputs);
    double total = 0;
    const int O = spec.outputs;
    for (int r = 0; r < B; ++r) {
      const double* z = &h[std::size_t(r) * O];
      if (spec.loss == Loss::softmax_xent) {
        double m = z[0], s = 0;
        for (int c = 1; c < O; ++c) m = std::max(m, z[c]);
        for (int c = 0; c < O; ++c) s += std::exp(z[c] - m);
        total += std::log(s) + m - z[labels[r]];
      } else {
        for (int c = 0; c < O; ++c) total += 0.5 * std::pow(z[c] - targets[std::size_t(r) * O + c], 2);
      }
    }
    return total / B;
  }
};

struct Case {
  const char* name;
  ModelSpec spec;
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }
};

class GradCheck : public ::testing::TestWithParam<Case> {};
void check_gradients(const ModelSpec& spec, CpuConvolutions conv);

// On both CPU paths: oneDNN (images in NHWC between layers, relaid at the input and before a
// Linear layer) and im2col (NCHW); the reference is NCHW.
TEST_P(GradCheck, MatchesCentralDifferencesOfFloat64Reference) {
  for (const CpuConvolutions conv : {CpuConvolutions::onednn, CpuConvolutions::im2col}) {
    SCOPED_TRACE(conv == CpuConvolutions::onednn ? "oneDNN" : "im2col");
    check_gradients(GetParam().spec, conv);
  }
}

void check_gradients(const ModelSpec& spec, CpuConvolutions conv) {
  const int B = 3;
  auto be = make_cpu_backend(1, conv);
  Model model(*be, spec, B);
  model.init(42);
  // Non-zero biases, so that their gradients are exercised away from the initial point.
  std::vector<float> theta(model.num_params());
  model.store_params(theta.data());
  Rng rng(7);
  for (auto& v : theta) v += float(0.05 * rng.normal());
  model.load_params(theta.data());

  const int F = spec.channels * spec.height * spec.width;
  std::vector<float> x(std::size_t(B) * F), t(std::size_t(B) * spec.outputs);
  for (auto& v : x) v = float(rng.normal());
  for (auto& v : t) v = float(rng.normal());
  std::vector<std::int32_t> labels(B);
  for (auto& l : labels) l = std::int32_t(rng.below(std::uint64_t(spec.outputs)));

  const double loss = model.forward_backward(x.data(), labels.data(), t.data(), B);
  std::vector<float> grad(model.num_params());
  be->copy_to_host(grad.data(), model.grads(), grad.size() * sizeof(float));

  std::vector<double> th(theta.begin(), theta.end()), xd(x.begin(), x.end()), td(t.begin(), t.end());
  Ref ref{spec, th};
  EXPECT_NEAR(loss, ref.loss(xd, labels, td, B), 1e-5 * std::max(1.0, std::abs(loss))) << "forward differs";

  // Every parameter of small models; a strided sample of bigger ones, always including
  // each layer's first and last weight and bias.
  long wrong = 0, checked = 0;
  const double h = 1e-6;
  for (const ParamInfo& p : model.param_info()) {
    const std::size_t stride = std::max<std::size_t>(1, p.size / 200);
    std::vector<std::size_t> picks;
    for (std::size_t k = 0; k < p.size; k += stride) picks.push_back(k);
    if (picks.back() != p.size - 1) picks.push_back(p.size - 1);
    for (std::size_t k : picks) {
      const std::size_t i = p.offset + k;
      const double saved = th[i];
      th[i] = saved + h;
      const double up = ref.loss(xd, labels, td, B);
      th[i] = saved - h;
      const double down = ref.loss(xd, labels, td, B);
      th[i] = saved;
      const double numeric = (up - down) / (2 * h);
      const bool ok = std::abs(grad[i] - numeric) <= 1e-4 + 1e-3 * std::abs(numeric);
      if (!ok && wrong < 5)
        ADD_FAILURE() << p.name << "[" << k << "]: backprop " << grad[i] << " vs finite difference " << numeric;
      wrong += !ok;
      ++checked;
    }
  }
  EXPECT_EQ(wrong, 0) << "of " << checked << " parameters checked";
  EXPECT_GT(checked, 20);
}

ModelSpec make(std::string kind, int c, int h, int w, int out, std::vector<int> hidden,
               std::vector<int> conv, Loss loss) {
  ModelSpec s;
  s.kind = std::move(kind);
  s.channels = c, s.height = h, s.width = w, s.outputs = out;
  s.hidden = std::move(hidden);
  s.conv_channels = std::move(conv);
  s.loss = loss;
  return s;
}

// A resnet of `depth` layers, stages of `width`, 2 width and 4 width channels, on c x h x w images.
ModelSpec make_resnet(int depth, int width, int c, int h, int w, int classes) {
  ModelSpec s = make("resnet", c, h, w, classes, {}, {}, Loss::softmax_xent);
  s.depth = depth, s.stage_width = width;
  return s;
}

INSTANTIATE_TEST_SUITE_P(
    Layers, GradCheck,
    ::testing::Values(
        Case{"SoftmaxRegression", make("linear", 1, 1, 12, 4, {}, {}, Loss::softmax_xent)},
        Case{"LeastSquares", make("linear", 1, 1, 9, 3, {}, {}, Loss::mse)},
        Case{"MlpTwoHidden", make("mlp", 1, 1, 10, 5, {8, 6}, {}, Loss::softmax_xent)},
        Case{"MlpDefaultShape", make("mlp", 1, 28, 28, 10, {256, 128}, {}, Loss::softmax_xent)},
        Case{"MlpOnColourImages", make("mlp", 3, 4, 5, 4, {6}, {}, Loss::softmax_xent)},
        Case{"CnnTwoConv", make("cnn", 2, 9, 8, 3, {}, {3, 4}, Loss::softmax_xent)},
        Case{"ResNet8", make_resnet(8, 2, 2, 7, 6, 3)},
        Case{"ResNet14", make_resnet(14, 2, 1, 6, 6, 4)}),
    [](const auto& info) { return std::string(info.param.name); });

// Batch norm by hand: one channel, two images of two pixels, x = 1, 2 | 3, 4; gamma 2, beta 0.5.
// Batch mean 2.5, biased variance 1.25, unbiased 5/3.
TEST(BatchNorm, TrainingForwardAndBackwardMatchAHandComputedExample) {
  auto be = make_cpu_backend(1);
  BatchNorm2d bn(Shape{1, 1, 2});
  float theta[2] = {2.0f, 0.5f}, grad[2] = {}, state[2], scratch[2];
  bn.init_state(state);
  EXPECT_EQ(state[0], 0.0f) << "running mean starts at 0";
  EXPECT_EQ(state[1], 1.0f) << "running variance starts at 1";
  bn.bind(theta, grad);
  bn.bind_state(state);
  bn.set_mode(ForwardMode{true, 0.1f});
  const float x[4] = {1, 2, 3, 4};
  float y[4];
  bn.forward(*be, x, y, 2, scratch);
  const double invstd = 1.0 / std::sqrt(1.25 + 1e-5);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], 2.0 * (x[i] - 2.5) * invstd + 0.5, 1e-6) << i;
  EXPECT_NEAR(state[0], 0.9 * 0.0 + 0.1 * 2.5, 1e-7) << "running mean";
  EXPECT_NEAR(state[1], 0.9 * 1.0 + 0.1 * (5.0 / 3.0), 1e-7) << "running variance (unbiased)";
  // dy = 1, 0, 0, 0: dbeta = 1; dgamma = xhat[0] = -1.5 invstd;
  // dx = gamma invstd (dy - dbeta / 4 - xhat dgamma / 4).
  const float dy[4] = {1, 0, 0, 0};
  float dx[4];
  bn.backward(*be, x, y, dy, dx, 2, scratch, GradProgress{});
  EXPECT_NEAR(grad[0], -1.5 * invstd, 1e-6) << "dgamma";
  EXPECT_NEAR(grad[1], 1.0, 1e-6) << "dbeta";
  const double expected[4] = {0.5366606077860684, -0.7155367440505952, -0.17888686926202277, 0.3577630055265496};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(dx[i], expected[i], 1e-6) << "dx[" << i << "]";
}

TEST(BatchNorm, InferenceUsesTheRunningStatisticsAndChangesNothing) {
  auto be = make_cpu_backend(1);
  BatchNorm2d bn(Shape{1, 1, 2});
  float theta[2] = {2.0f, 0.5f}, grad[2] = {}, state[2] = {0.25f, 4.0f}, scratch[2] = {-7.0f, -7.0f};
  bn.bind(theta, grad);
  bn.bind_state(state);
  bn.set_mode(ForwardMode{false, 0.1f});
  const float x[4] = {1, 2, 3, 4};
  float y[4];
  bn.forward(*be, x, y, 2, scratch);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], 2.0 * (x[i] - 0.25) / std::sqrt(4.0 + 1e-5) + 0.5, 1e-6) << i;
  EXPECT_EQ(state[0], 0.25f);
  EXPECT_EQ(state[1], 4.0f);
  EXPECT_EQ(scratch[0], -7.0f) << "inference writes no batch statistics";
}

// Model::measure_statistics: after batches k = 0, 1, 2 the running statistics are the plain
// average of the three batches' (whatever they were before), and evaluate() uses them.
TEST(BatchNorm, MeasuredStatisticsAreThePlainAverageOfTheBatches) {
  auto be = make_cpu_backend(1);
  ModelSpec spec = make_resnet(8, 2, 1, 6, 6, 3);
  Model m(*be, spec, 4);
  m.init(3);
  ASSERT_EQ(m.state_floats(), 2u * (2 + 2 * 2 + 4 * 3 + 8 * 3)) << "mean and variance of every batch norm";
  std::vector<float> x(3 * 4 * 36);
  Rng rng(5);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(rng.normal() + double(i / 144));  // batch k: mean k
  std::vector<std::int32_t> y(4, 1);
  // The stem's batch norm sees conv(x); with the input's mean shifted by k per batch, its
  // channels' means move too: check the average of the stem's running mean against the
  // batches' own statistics, measured one batch at a time with momentum 1.
  std::vector<float> alone(3 * m.state_floats()), averaged(m.state_floats()), again(m.state_floats());
  for (int k = 0; k < 3; ++k) {
    m.measure_statistics(x.data() + k * 144, 4, 0);
    m.store_state(alone.data() + k * m.state_floats());
  }
  for (int k = 0; k < 3; ++k) m.measure_statistics(x.data() + k * 144, 4, k);
  m.store_state(averaged.data());
  for (std::size_t i = 0; i < 2; ++i) {  // the stem's running mean and variance: the first entries
    const double mean = (alone[i] + alone[m.state_floats() + i] + alone[2 * m.state_floats() + i]) / 3;
    EXPECT_NEAR(averaged[i], mean, 1e-5) << "stem running mean " << i;
    EXPECT_NE(alone[i], alone[m.state_floats() + i]) << "the batches differ";
  }
  const EvalCounts e1 = m.evaluate(x.data(), y.data(), nullptr, 4);
  m.store_state(again.data());
  EXPECT_EQ(again, averaged) << "evaluate() changed the running statistics";
  m.reset_state();
  const EvalCounts e2 = m.evaluate(x.data(), y.data(), nullptr, 4);
  EXPECT_NE(e1.loss_sum, e2.loss_sum) << "inference ignored the running statistics";
  m.load_state(averaged.data());
  EXPECT_EQ(m.evaluate(x.data(), y.data(), nullptr, 4).loss_sum, e1.loss_sum);
}

TEST(ModelLayout, ParametersAreOneContiguousVectorOfViews) {
  auto be = make_cpu_backend(1);
  Model m(*be, make("mlp", 1, 1, 784, 10, {256, 128}, {}, Loss::softmax_xent), 4);
  EXPECT_EQ(m.num_params(), 784u * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  std::size_t next = 0;
  for (const auto& p : m.param_info()) {
    EXPECT_EQ(p.offset, next) << p.name;
    next = p.offset + p.size;
  }
  EXPECT_EQ(next, m.num_params());
}

TEST(ModelInit, DeterministicForASeedAndScaledByFanIn) {
  const ModelSpec s = make("mlp", 1, 1, 784, 10, {256, 128}, {}, Loss::softmax_xent);
  const auto a = initial_params(s, 5), b = initial_params(s, 5), c = initial_params(s, 6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // He-uniform on the first layer: |w| <= sqrt(6 / 784); biases zero.
  const double limit = std::sqrt(6.0 / 784);
  double maxabs = 0;
  for (std::size_t i = 0; i < 784u * 256; ++i) maxabs = std::max(maxabs, double(std::abs(a[i])));
  EXPECT_LE(maxabs, limit);
  EXPECT_GT(maxabs, 0.9 * limit);
  for (std::size_t i = 784u * 256; i < 784u * 256 + 256; ++i) EXPECT_EQ(a[i], 0.0f);
}

// What f() throws as an E, or "(nothing thrown)".
template <typename E, typename F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

TEST(ModelResNet, HasTheParametersOfHeEtAlAndRefusesBadDepths) {
  ModelSpec s = make_resnet(20, 16, 3, 32, 32, 10);
  // ResNet-20 for CIFAR-10: 0.27M parameters (He et al. 2016, table 6).
  EXPECT_NEAR(double(count_params(s)), 0.27e6, 0.005e6);
  EXPECT_EQ(count_params(s), 272474u) << "PyTorch's count for the same network (experiments/torch/resnet.py)";
  s.depth = 56;
  EXPECT_NEAR(double(count_params(s)), 0.85e6, 0.01e6);
  s.depth = 9;
  EXPECT_NE(thrown<std::invalid_argument>([&] { count_params(s); }).find("model.depth must be 6n + 2"), std::string::npos);
  s = make_resnet(8, 16, 1, 1, 1, 10);
  EXPECT_NE(thrown<std::invalid_argument>([&] { count_params(s); }).find("needs image data"), std::string::npos);
  s = make_resnet(8, 2, 1, 4, 4, 3);  // 1x1 in the last stage: a batch of 1 there normalised to β alone
  EXPECT_NE(thrown<std::invalid_argument>([&] { count_params(s); }).find("needs images of at least 5x5 pixels"),
            std::string::npos);
  // A layer-wise optimizer sees the blocks' convolutions and batch norms, not whole blocks.
  s = make_resnet(8, 2, 1, 6, 6, 3);
  const auto groups = layer_sizes(s, 0, count_params(s));
  EXPECT_EQ(groups.size(), 2u + 3 * 4 + 2 * 2 + 1);
}

TEST(ModelExternal, IsItsTensorsSizesAndItsThetaFileAndComputesNothing) {
  // model.kind = "external": the servers' view of a model whose workers are the user's own
  ModelSpec spec;
  spec.kind = "external";
  spec.sizes = {6, 2, 4};
  EXPECT_EQ(count_params(spec), 12u);
  EXPECT_EQ(layer_sizes(spec, 4, 6), (std::vector<std::size_t>{2, 2, 2})) << "tensors cut to a shard's range";
  EXPECT_EQ(initial_params(spec, 1), std::vector<float>(12, 0.0f)) << "no theta_file: zeros";
  const std::string path = testing::TempDir() + "pslab-theta0.f32";
  std::vector<float> theta(12), longer(13, 1.0f);
  for (std::size_t i = 0; i < theta.size(); ++i) theta[i] = 0.5f * float(i) - 1.0f;
  auto write = [&](std::size_t n) {  // the first n of θ (13: one more)
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(n <= 12 ? theta.data() : longer.data(), sizeof(float), n, f), n);
    std::fclose(f);
  };
  write(12);
  spec.theta_file = path;
  EXPECT_EQ(initial_params(spec, 1), theta);
  EXPECT_EQ(initial_params(spec, 99), theta) << "the file's, whatever the seed";
  write(11);
  EXPECT_NE(thrown<std::invalid_argument>([&] { initial_params(spec, 1); })
                .find("model.theta_file " + path + ": holds 11 float32 values; model.sizes add up to 12"),
            std::string::npos);
  write(13);
  EXPECT_NE(thrown<std::invalid_argument>([&] { initial_params(spec, 1); }).find("holds more than 12 float32 values"),
            std::string::npos);
  spec.theta_file = path + ".missing";
  EXPECT_NE(thrown<std::invalid_argument>([&] { initial_params(spec, 1); })
                .find("model.theta_file " + path + ".missing: cannot open it"),
            std::string::npos);
  std::remove(path.c_str());
  auto be = make_cpu_backend(1);
  auto layers = build_layers(spec);
  float x = 0.0f, y = 0.0f;
  EXPECT_NE(thrown<std::logic_error>([&] { layers[0]->forward(*be, &x, &y, 1, nullptr); }).find("computed by its own workers"),
            std::string::npos);
  spec.sizes = {};
  EXPECT_NE(thrown<std::invalid_argument>([&] { count_params(spec); }).find("needs model.sizes"), std::string::npos);
}

TEST(ModelBatch, EmptyBatchGivesZeroGradient) {
  auto be = make_cpu_backend(1);
  Model m(*be, make("mlp", 1, 1, 6, 3, {4}, {}, Loss::softmax_xent), 2);
  m.init(1);
  be->fill(m.grads(), m.num_params(), 7.0f);
  EXPECT_EQ(m.forward_backward(nullptr, nullptr, nullptr, 0), 0.0);
  for (std::size_t i = 0; i < m.num_params(); ++i) ASSERT_EQ(m.grads()[i], 0.0f);
}

// Overlap: a listener hears tails of ∇θ as they become final. Each tail it was told about must
// already hold its final values, the tails must only grow, the last report must be 0, and the
// gradient must be bitwise the one computed without a listener.
TEST(ModelBatch, AListenerHearsFinalTailsEarlyAndChangesNoBit) {
  for (const ModelSpec& spec : {make("mlp", 1, 28, 28, 10, {256, 128}, {}, Loss::softmax_xent),
                                make("cnn", 2, 9, 8, 3, {}, {3, 4}, Loss::softmax_xent)}) {
    auto be = make_cpu_backend(1);
    const int B = 37;
    Model m(*be, spec, B);
    m.init(3);
    const std::size_t P = m.num_params(), F = std::size_t(spec.channels) * spec.height * spec.width;
    Rng rng(9);
    std::vector<float> x(std::size_t(B) * F);
    for (auto& v : x) v = float(rng.uniform(-1, 1));
    std::vector<std::int32_t> y(B);
    for (int i = 0; i < B; ++i) y[std::size_t(i)] = i % spec.outputs;
    m.forward_backward(x.data(), y.data(), nullptr, B);
    const std::vector<float> plain(m.grads(), m.grads() + P);

    struct Recorder : GradListener {
      Model* m;
      std::vector<std::size_t> reports;
      std::vector<std::vector<float>> tails;  // ∇θ[lo, P) at the time of each report
      void ready(std::size_t lo) override {
        reports.push_back(lo);
        tails.emplace_back(m->grads() + lo, m->grads() + m->num_params());
      }
    } rec;
    rec.m = &m;
    be->fill(m.grads(), P, 7.0f);
    m.forward_backward(x.data(), y.data(), nullptr, B, -1.0f, &rec);
    EXPECT_EQ(std::vector<float>(m.grads(), m.grads() + P), plain) << "a listener changed the gradient";
    ASSERT_FALSE(rec.reports.empty());
    EXPECT_EQ(rec.reports.back(), 0u);
    for (std::size_t k = 0; k < rec.reports.size(); ++k) {
      if (k > 0) {
        EXPECT_LE(rec.reports[k], rec.reports[k - 1]) << "a tail shrank";
      }
      EXPECT_EQ(rec.tails[k], std::vector<float>(plain.begin() + long(rec.reports[k]), plain.end()))
          << "the tail from " << rec.reports[k] << " was reported before it was final";
    }
    if (spec.kind == "mlp") {  // the first layer (85% of θ) is reported in pieces
      const std::size_t first_layer = 784u * 256 + 256;
      long inside = 0;
      for (std::size_t lo : rec.reports) {
        if (lo > 0 && lo < first_layer) ++inside;
      }
      EXPECT_GE(inside, 5) << "the first layer's weight gradient should come in pieces";
    }
  }
}

// profile_passes (bench_train --profile): a row per layer and the loss, each with a time, and
// the gradient it leaves is forward_backward's, bit for bit (the passes are the same calls).
TEST(ModelProfile, EachPassTimedAndTheGradientForwardBackwardsBitwise) {
  for (const ModelSpec& spec : {make("cnn", 2, 9, 8, 3, {}, {3, 4}, Loss::softmax_xent), make_resnet(8, 2, 1, 6, 6, 3)}) {
    auto be = make_cpu_backend(1);
    const int B = 5;
    Model m(*be, spec, B);
    m.init(3);
    const std::size_t P = m.num_params(), F = std::size_t(spec.channels) * spec.height * spec.width;
    Rng rng(11);
    std::vector<float> x(std::size_t(B) * F);
    for (auto& v : x) v = float(rng.uniform(-1, 1));
    std::vector<std::int32_t> y(B);
    for (int i = 0; i < B; ++i) y[std::size_t(i)] = i % spec.outputs;
    std::vector<float> state0(m.state_floats());
    m.store_state(state0.data());
    m.forward_backward(x.data(), y.data(), nullptr, B);
    const std::vector<float> plain(m.grads(), m.grads() + P);
    be->fill(m.grads(), P, 7.0f);
    m.load_state(state0.data());
    const auto passes = m.profile_passes(x.data(), y.data(), nullptr, B, 2);
    EXPECT_EQ(std::vector<float>(m.grads(), m.grads() + P), plain) << spec.kind;
    ASSERT_GE(passes.size(), 3u);
    EXPECT_EQ(passes.back().pass, "loss");
    EXPECT_EQ(passes.front().pass.rfind("0.", 0), 0u) << passes.front().pass;
    double total = 0;
    for (const auto& p : passes) {
      EXPECT_GE(p.forward_ms, 0.0) << p.pass;
      EXPECT_GE(p.backward_ms, 0.0) << p.pass;
      total += p.forward_ms + p.backward_ms;
    }
    EXPECT_GT(total, 0.0);
    EXPECT_THROW(m.profile_passes(x.data(), y.data(), nullptr, B + 1, 1), std::invalid_argument);  // over max_batch
  }
}

// Replica::profile_step: the gather first, the model's passes, the update last; and it trains
// as train_step does (reps + 1 rounds: θ bitwise that of as many train_steps on the batch).
TEST(ModelProfile, AReplicasStepIsGatherPassesAndUpdate) {
  Dataset d;
  d.n = 20, d.channels = 1, d.height = 4, d.width = 4, d.classes = 3;
  d.x.resize(std::size_t(d.n) * d.features());
  d.labels.resize(std::size_t(d.n));
  Rng rng(5);
  for (auto& v : d.x) v = float(rng.normal());
  for (auto& l : d.labels) l = std::int32_t(rng.below(3));
  ModelSpec spec;
  spec.kind = "mlp", spec.channels = 1, spec.height = 4, spec.width = 4, spec.outputs = 3, spec.hidden = {8};
  const std::vector<std::uint32_t> idx = {3, 1, 4, 15, 9, 2};
  std::vector<float> theta[2];
  for (int k = 0; k < 2; ++k) {
    auto be = make_cpu_backend(1);
    Replica replica(*be, spec, d, 8);
    replica.model().init(3);
    OptimizerConfig cfg;
    Optimizer opt(*be, cfg, replica.model().num_params());
    if (k == 0) {
      for (int i = 0; i < 3; ++i) replica.train_step(idx, opt, 0.1);
    } else {
      const auto rows = replica.profile_step(idx, opt, 0.1, 2);
      ASSERT_EQ(rows.size(), 2u + 2u + 1u + 1u);  // gather, linear, relu, linear, loss, update
      EXPECT_EQ(rows.front().pass, "gather");
      EXPECT_EQ(rows[1].pass.rfind("0.linear", 0), 0u) << rows[1].pass;
      EXPECT_EQ(rows[rows.size() - 2].pass, "loss");
      EXPECT_EQ(rows.back().pass, "update");
    }
    theta[k].resize(replica.model().num_params());
    replica.model().store_params(theta[k].data());
  }
  EXPECT_EQ(theta[1], theta[0]);
}

// A backend that counts the calls it forwards to another (the CPU backend).
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(Backend& inner) : in_(inner) {}
  long calls = 0;
  Device device() const override { return in_.device(); }
  std::string describe() const override { return "counting " + in_.describe(); }
  void* allocate(std::size_t b) override { return ++calls, in_.allocate(b); }
  void deallocate(void* p) noexcept override { in_.deallocate(p); }
  void copy_from_host(void* d, const void* s, std::size_t b) override { ++calls, in_.copy_from_host(d, s, b); }
  void copy_to_host(void* d, const void* s, std::size_t b) override { ++calls, in_.copy_to_host(d, s, b); }
  void copy(void* d, const void* s, std::size_t b) override { ++calls, in_.copy(d, s, b); }
  void fill(float* x, std::size_t n, float v) override { ++calls, in_.fill(x, n, v); }
  void synchronize() override { ++calls, in_.synchronize(); }
  void gather_rows(const void* s, const std::uint32_t* i, std::size_t n, std::size_t b, void* d) override {
    ++calls, in_.gather_rows(s, i, n, b, d);
  }
  void augment_images(const float* s, const std::uint32_t* i, std::size_t n, int C, int H, int W, std::uint64_t seed,
                      std::uint64_t epoch, int pad, float* d) override {
    ++calls, in_.augment_images(s, i, n, C, H, W, seed, epoch, pad, d);
  }
  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc) override {
    ++calls, in_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void axpy(std::size_t n, float a, const float* x, float* y) override { ++calls, in_.axpy(n, a, x, y); }
  void scale(std::size_t n, float a, float* x) override { ++calls, in_.scale(n, a, x); }
  double sum_squares(const float* x, std::size_t n) override { return ++calls, in_.sum_squares(x, n); }
  void add_bias(float* y, const float* b, int o, int c, int i) override { ++calls, in_.add_bias(y, b, o, c, i); }
  void bias_grad(const float* dy, int o, int c, int i, float* db) override { ++calls, in_.bias_grad(dy, o, c, i, db); }
  void relu_forward(const float* x, float* y, std::size_t n) override { ++calls, in_.relu_forward(x, y, n); }
  void relu_backward(const float* dy, const float* y, float* dx, std::size_t n) override {
    ++calls, in_.relu_backward(dy, y, dx, n);
  }
  void batch_norm_forward(const float* x, int B, int C, int HW, const float* g, const float* b, bool training, float m,
                          float eps, float* rm, float* rv, float* sm, float* si, float* y) override {
    ++calls, in_.batch_norm_forward(x, B, C, HW, g, b, training, m, eps, rm, rv, sm, si, y);
  }
  void batch_norm_backward(const float* x, const float* dy, int B, int C, int HW, const float* g, const float* sm,
                           const float* si, float* dg, float* db, float* dx) override {
    ++calls, in_.batch_norm_backward(x, dy, B, C, HW, g, sm, si, dg, db, dx);
  }
  double softmax_xent(const float* l, const std::int32_t* y, int r, int C, float s, float* d) override {
    return ++calls, in_.softmax_xent(l, y, r, C, s, d);
  }
  double mse(const float* y, const float* t, int r, int C, float s, float* d) override { return ++calls, in_.mse(y, t, r, C, s, d); }
  long count_correct(const float* l, const std::int32_t* y, int r, int C) override { return ++calls, in_.count_correct(l, y, r, C); }
  void run(const math::Program& p, float* const* arrays, std::size_t n) override { ++calls, in_.run(p, arrays, n); }
  void im2col(const float* x, const math::ConvGeometry& g, int B, float* c) override { ++calls, in_.im2col(x, g, B, c); }
  void col2im(const float* c, const math::ConvGeometry& g, int B, float* dx) override { ++calls, in_.col2im(c, g, B, dx); }
  void swap_outer(const float* x, int A, int B, int N, float* y) override { ++calls, in_.swap_outer(x, A, B, N, y); }
  ImageLayout image_layout() const override { return in_.image_layout(); }
  void relayout_images(const float* x, int B, int C, int HW, ImageLayout to, float* y) override {
    ++calls, in_.relayout_images(x, B, C, HW, to, y);
  }
  void mean_pool_nhwc(const float* x, int B, int C, int HW, float* y) override { ++calls, in_.mean_pool_nhwc(x, B, C, HW, y); }
  void mean_pool_nhwc_backward(const float* dy, int B, int C, int HW, float* dx) override {
    ++calls, in_.mean_pool_nhwc_backward(dy, B, C, HW, dx);
  }
  std::size_t conv_scratch_floats(const math::ConvGeometry& g, int OC, int B) override {
    return in_.conv_scratch_floats(g, OC, B);
  }
  void conv_forward(const float* x, const float* W, const math::ConvGeometry& g, int OC, int B, float* y,
                    float* s) override {
    ++calls, in_.conv_forward(x, W, g, OC, B, y, s);
  }
  void conv_backward(const float* x, const float* W, const float* dy, const math::ConvGeometry& g, int OC, int B,
                     float* dW, float* dx, float* s) override {
    ++calls, in_.conv_backward(x, W, dy, g, OC, B, dW, dx, s);
  }

 private:
  Backend& in_;
};

// A training step (forward, backward, SGD) issues as many backend calls at batch 512 as at
// batch 8: a GPU pays per launch, so no call may be per sample (the CNN's convolutions were).
TEST(ModelBatch, BackendCallsPerStepDoNotGrowWithTheBatch) {
  for (const ModelSpec& spec : {make("mlp", 1, 28, 28, 10, {256, 128}, {}, Loss::softmax_xent),
                                make("cnn", 1, 28, 28, 10, {}, {16, 32}, Loss::softmax_xent),
                                make_resnet(8, 4, 1, 28, 28, 10)}) {
    auto cpu = make_cpu_backend(1);
    CountingBackend be(*cpu);
    Model m(be, spec, 512);
    m.init(1);
    const std::size_t F = 28 * 28;
    std::vector<float> x(512 * F, 0.5f);
    std::vector<std::int32_t> y(512, 3);
    long calls[2];
    for (int k = 0; k < 2; ++k) {
      const int B = k == 0 ? 8 : 512;
      be.calls = 0;
      m.forward_backward(x.data(), y.data(), nullptr, B);
      be.axpy(m.num_params(), -0.01f, m.grads(), m.params());  // an SGD step
      calls[k] = be.calls;
    }
    EXPECT_EQ(calls[0], calls[1]) << spec.kind << ": backend calls per step at batch 8 vs 512";
    EXPECT_GT(calls[0], 5) << spec.kind;
  }
}

TEST(ModelBatch, OversizedBatchIsRefusedWithTheSizes) {
  auto be = make_cpu_backend(1);
  Model m(*be, make("mlp", 1, 1, 6, 3, {4}, {}, Loss::softmax_xent), 2);
  std::vector<float> x(18);
  std::vector<std::int32_t> y(3);
  try {
    m.forward_backward(x.data(), y.data(), nullptr, 3);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("batch of 3 exceeds the max_batch 2"), std::string::npos) << e.what();
  }
}

}  // namespace
