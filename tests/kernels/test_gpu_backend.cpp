// The CUDA backend against the CPU backend: every Backend op on the same random inputs
// (fixed seeds), results compared element by element.
//
// Floating-point results agree when |gpu - cpu| <= 1e-4 * max(1, |cpu|) (FMA contraction,
// device expf/logf and reduction order differ in the last bits); failures report, like
// nccl-tests' #wrong column, how many elements are off, plus the worst one. Pure data movement
// (fill, copy, relu, im2col) and integer results (count_correct) must match exactly.
//
// Without a GPU (a build without CUDA, no driver, no device) every test is SKIPPED with the
// reason; with one, a backend that cannot be made fails every test (tests/support/gpu.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend.h"
#include "core/optimizer.h"
#include "cuda_plugin.h"
#include "gpu.h"

namespace pslab {
namespace {

constexpr double kTol = 1e-4;

// ---- helpers -------------------------------------------------------------------------------

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                 float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<std::int32_t> random_labels(std::size_t n, int C, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, std::max(C - 1, 0));
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

template <typename T>
DeviceBuffer<T> upload(Backend& be, const std::vector<T>& host) {
  DeviceBuffer<T> buf(be, host.size());
  be.copy_from_host(buf.data(), host.data(), buf.bytes());
  return buf;
}

template <typename T>
std::vector<T> download(Backend& be, const DeviceBuffer<T>& buf) {
  std::vector<T> host(buf.size());
  be.copy_to_host(host.data(), buf.data(), buf.bytes());
  return host;
}

bool close(double want, double got, double tol) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (tol == 0.0) return want == got;
  return std::fabs(want - got) <= tol * std::max(1.0, std::fabs(want));
}

// cpu = expected, gpu = actual. tol 0 demands bit equality (NaN matches NaN).
template <typename T>
::testing::AssertionResult agree(const std::string& what, const std::vector<T>& cpu,
                                 const std::vector<T>& gpu, double tol = kTol) {
  if (cpu.size() != gpu.size())
    return ::testing::AssertionFailure() << what << ": size " << gpu.size() << " != "
                                         << cpu.size();
  std::size_t wrong = 0, worst = 0;
  double worst_err = -1.0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double a = double(cpu[i]), b = double(gpu[i]);
    if (close(a, b, tol)) continue;
    ++wrong;
    const double err = std::isnan(a) || std::isnan(b)
                           ? std::numeric_limits<double>::infinity()
                           : std::fabs(a - b) / std::max(1.0, std::fabs(a));
    if (err > worst_err) worst_err = err, worst = i;
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << what << ": #wrong " << wrong << " of " << cpu.size() << "; worst at [" << worst
     << "]: cpu " << double(cpu[worst]) << ", gpu " << double(gpu[worst]) << " (rel err "
     << worst_err << ", tol " << tol << ")";
  return ::testing::AssertionFailure() << os.str();
}

::testing::AssertionResult agree_scalar(const std::string& what, double cpu, double gpu,
                                        double tol = kTol) {
  if (close(cpu, gpu, tol)) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(17);
  os << what << ": cpu " << cpu << ", gpu " << gpu << " (tol " << tol << ")";
  return ::testing::AssertionFailure() << os.str();
}

// Element counts: empty, one, around a warp, around a block, and a few thousand.
const std::vector<std::size_t> kSizes = {0, 1, 31, 32, 33, 255, 257, 1000, 4099, 100003};

class GpuBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    PSLAB_SKIP_WITHOUT_GPU();
    cpu_ = make_cpu_backend(1, CpuConvolutions::im2col);  // images in NCHW, as the GPU's (oneDNN's NHWC: test_kernels.cpp)
    gpu_ = make_cuda_backend(0);
    static bool printed = false;
    if (!printed) {
      std::printf("[ backends ] %s vs %s\n", gpu_->describe().c_str(),
                  cpu_->describe().c_str());
      printed = true;
    }
  }

  Backend& cpu() { return *cpu_; }
  Backend& gpu() { return *gpu_; }
  // The GPU without cuDNN (PSLAB_CUDNN=off): convolutions by im2col and cuBLAS, batch norm on
  // the backend's kernels. Made on first use.
  Backend& gpu_without_cudnn() { return with_cudnn("off", plain_); }
  // The GPU on cuDNN with algorithms it timed (PSLAB_CUDNN=timed; gpu() takes its heuristic's).
  Backend& gpu_timed() { return with_cudnn("timed", timed_); }

  // A GPU backend made with PSLAB_CUDNN set to `use` (then restored), kept in `made`.
  static Backend& with_cudnn(const char* use, std::unique_ptr<Backend>& made) {
    if (!made) {
      const char* was = std::getenv("PSLAB_CUDNN");
      const std::string saved = was ? was : "";
      setenv("PSLAB_CUDNN", use, 1);
      try {
        made = make_cuda_backend(0);
      } catch (...) {
        was ? setenv("PSLAB_CUDNN", saved.c_str(), 1) : unsetenv("PSLAB_CUDNN");
        throw;
      }
      was ? setenv("PSLAB_CUDNN", saved.c_str(), 1) : unsetenv("PSLAB_CUDNN");
    }
    return *made;
  }

  std::unique_ptr<Backend> cpu_, gpu_, plain_, timed_;
};

// ---- memory --------------------------------------------------------------------------------

TEST_F(GpuBackend, DeviceBufferRoundTrip) {
  for (const std::size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const auto host = random_floats(n, 1 + std::uint32_t(n));
    DeviceBuffer<float> a = upload(gpu(), host);
    EXPECT_EQ(a.size(), n);
    EXPECT_TRUE(agree("upload/download", host, download(gpu(), a), 0.0));

    DeviceBuffer<float> b(gpu(), n);  // device-to-device copy
    gpu().copy(b.data(), a.data(), a.bytes());
    EXPECT_TRUE(agree("copy", host, download(gpu(), b), 0.0));

    DeviceBuffer<float> moved(std::move(b));  // ownership moves, data stays
    EXPECT_EQ(b.data(), nullptr);
    EXPECT_TRUE(agree("moved", host, download(gpu(), moved), 0.0));

    const auto labels = random_labels(n, 1000, 7);  // integer data too
    DeviceBuffer<std::int32_t> l = upload(gpu(), labels);
    EXPECT_EQ(download(gpu(), l), labels);
  }
}

TEST_F(GpuBackend, OverlappingCopyActsLikeMemmove) {
  const std::size_t n = 1000, shift = 37;
  const auto host = random_floats(n, 11);
  for (const bool forward : {true, false}) {
    SCOPED_TRACE(forward ? "dst after src" : "dst before src");
    DeviceBuffer<float> c = upload(cpu(), host), g = upload(gpu(), host);
    const std::size_t d = forward ? shift : 0, s = forward ? 0 : shift;
    cpu().copy(c.data() + d, c.data() + s, (n - shift) * sizeof(float));
    gpu().copy(g.data() + d, g.data() + s, (n - shift) * sizeof(float));
    EXPECT_TRUE(agree("copy", download(cpu(), c), download(gpu(), g), 0.0));
  }
}

TEST_F(GpuBackend, Fill) {
  for (const std::size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    DeviceBuffer<float> c(cpu(), n), g = upload(gpu(), random_floats(n, 3));
    cpu().fill(c.data(), n, -2.5f);
    gpu().fill(g.data(), n, -2.5f);
    EXPECT_TRUE(agree("fill", download(cpu(), c), download(gpu(), g), 0.0));
  }
}

// A batch gathered on the device from its sample indices: rows of features and of labels.
TEST_F(GpuBackend, GatherRowsIsBitwiseTheCpus) {
  const std::size_t rows = 1000, f = 784, n = 300;
  const auto x = random_floats(rows * f, 41);
  const auto labels = random_labels(rows, 10, 42);
  std::vector<std::uint32_t> idx(n);
  std::mt19937 rng(43);
  for (auto& i : idx) i = std::uint32_t(rng() % rows);
  DeviceBuffer<float> cx = upload(cpu(), x), gx = upload(gpu(), x), cb(cpu(), n * f), gb(gpu(), n * f);
  DeviceBuffer<std::int32_t> cl = upload(cpu(), labels), gl = upload(gpu(), labels), cy(cpu(), n), gy(gpu(), n);
  DeviceBuffer<std::uint32_t> ci = upload(cpu(), idx), gi = upload(gpu(), idx);
  cpu().gather_rows(cx.data(), ci.data(), n, f * sizeof(float), cb.data());
  gpu().gather_rows(gx.data(), gi.data(), n, f * sizeof(float), gb.data());
  cpu().gather_rows(cl.data(), ci.data(), n, sizeof(std::int32_t), cy.data());
  gpu().gather_rows(gl.data(), gi.data(), n, sizeof(std::int32_t), gy.data());
  EXPECT_TRUE(agree("gather_rows x", download(cpu(), cb), download(gpu(), gb), 0.0));
  EXPECT_EQ(download(cpu(), cy), download(gpu(), gy));
}

TEST_F(GpuBackend, AugmentedImagesAreBitwiseTheCpus) {
  const std::size_t n = 64;
  const int C = 3, H = 32, W = 32;
  const auto x = random_floats(n * C * H * W, 44);
  std::vector<std::uint32_t> idx(n);
  for (std::size_t k = 0; k < n; ++k) idx[k] = std::uint32_t(7 * k + 3);
  DeviceBuffer<float> cx = upload(cpu(), x), gx = upload(gpu(), x), cy(cpu(), x.size()), gy(gpu(), x.size());
  DeviceBuffer<std::uint32_t> ci = upload(cpu(), idx), gi = upload(gpu(), idx);
  cpu().augment_images(cx.data(), ci.data(), n, C, H, W, 5, 2, 4, cy.data());
  gpu().augment_images(gx.data(), gi.data(), n, C, H, W, 5, 2, 4, gy.data());
  EXPECT_TRUE(agree("augment_images", download(cpu(), cy), download(gpu(), gy), 0.0));
}

// ---- linear algebra ------------------------------------------------------------------------

struct GemmShape {
  int M, N, K;
};

TEST_F(GpuBackend, Gemm) {
  const std::vector<GemmShape> shapes = {{1, 1, 1},   {0, 5, 3},   {5, 0, 3},   {4, 3, 0},
                                         {1, 7, 1},   {7, 1, 13},  {33, 17, 65}, {64, 64, 64},
                                         {100, 37, 129}, {31, 257, 33}};
  const float alpha = 0.75f, beta = -0.5f;
  const int pad = 3;  // every leading dimension exceeds its minimum
  std::uint32_t seed = 100;
  for (const Trans ta : {Trans::no, Trans::yes})
    for (const Trans tb : {Trans::no, Trans::yes})
      for (const GemmShape& s : shapes) {
        const std::string name = std::string("gemm ta=") + (ta == Trans::yes ? "T" : "N") +
                                 " tb=" + (tb == Trans::yes ? "T" : "N") + " M=" +
                                 std::to_string(s.M) + " N=" + std::to_string(s.N) +
                                 " K=" + std::to_string(s.K);
        SCOPED_TRACE(name);
        // Stored shapes (row-major): A is (M,K) or, transposed, (K,M); B is (K,N) or (N,K).
        const int a_rows = ta == Trans::no ? s.M : s.K, a_cols = ta == Trans::no ? s.K : s.M;
        const int b_rows = tb == Trans::no ? s.K : s.N, b_cols = tb == Trans::no ? s.N : s.K;
        const int lda = std::max(a_cols, 1) + pad, ldb = std::max(b_cols, 1) + pad,
                  ldc = std::max(s.N, 1) + pad;
        const auto A = random_floats(std::size_t(a_rows) * lda, ++seed);
        const auto B = random_floats(std::size_t(b_rows) * ldb, ++seed);
        // C's padding columns too must come back untouched.
        const auto C0 = random_floats(std::size_t(s.M) * ldc, ++seed);
        DeviceBuffer<float> ca = upload(cpu(), A), cb = upload(cpu(), B), cc = upload(cpu(), C0);
        DeviceBuffer<float> ga = upload(gpu(), A), gb = upload(gpu(), B), gc = upload(gpu(), C0);
        cpu().gemm(ta, tb, s.M, s.N, s.K, alpha, ca.data(), lda, cb.data(), ldb, beta,
                   cc.data(), ldc);
        gpu().gemm(ta, tb, s.M, s.N, s.K, alpha, ga.data(), lda, gb.data(), ldb, beta,
                   gc.data(), ldc);
        EXPECT_TRUE(agree(name, download(cpu(), cc), download(gpu(), gc)));
      }
}

// train.tf32: the GEMMs may round inputs to TF32 (10-bit mantissa); results stay within
// TF32's precision of the CPU's float32 ones, and the backend says so.
TEST_F(GpuBackend, Tf32GemmIsOptInAndCloseToFloat32) {
  const int n = 256;
  const auto A = random_floats(std::size_t(n) * n, 7), B = random_floats(std::size_t(n) * n, 8);
  DeviceBuffer<float> ca = upload(cpu(), A), cb = upload(cpu(), B), cc(cpu(), std::size_t(n) * n);
  DeviceBuffer<float> ga = upload(gpu(), A), gb = upload(gpu(), B), gc(gpu(), std::size_t(n) * n);
  cpu().gemm(Trans::no, Trans::no, n, n, n, 1.0f, ca.data(), n, cb.data(), n, 0.0f, cc.data(), n);
  EXPECT_EQ(gpu().describe().find("TF32"), std::string::npos) << "TF32 must be off by default";
  gpu().allow_tf32(true);
  EXPECT_NE(gpu().describe().find("TF32 GEMMs"), std::string::npos) << gpu().describe();
  gpu().gemm(Trans::no, Trans::no, n, n, n, 1.0f, ga.data(), n, gb.data(), n, 0.0f, gc.data(), n);
  EXPECT_TRUE(agree("tf32 gemm 256^3", download(cpu(), cc), download(gpu(), gc), 2e-2));
  gpu().allow_tf32(false);
  gpu().gemm(Trans::no, Trans::no, n, n, n, 1.0f, ga.data(), n, gb.data(), n, 0.0f, gc.data(), n);
  EXPECT_TRUE(agree("float32 gemm 256^3 after tf32 off", download(cpu(), cc), download(gpu(), gc)));
}

TEST_F(GpuBackend, GemmBetaZeroIgnoresGarbageInC) {
  const int M = 9, N = 11, K = 5;
  const auto A = random_floats(std::size_t(M) * K, 1), B = random_floats(std::size_t(K) * N, 2);
  const std::vector<float> C0(std::size_t(M) * N, std::numeric_limits<float>::quiet_NaN());
  for (const int k : {K, 0}) {
    SCOPED_TRACE("K = " + std::to_string(k));
    DeviceBuffer<float> ca = upload(cpu(), A), cb = upload(cpu(), B), cc = upload(cpu(), C0);
    DeviceBuffer<float> ga = upload(gpu(), A), gb = upload(gpu(), B), gc = upload(gpu(), C0);
    cpu().gemm(Trans::no, Trans::no, M, N, k, 1.5f, ca.data(), std::max(k, 1), cb.data(), N,
               0.0f, cc.data(), N);
    gpu().gemm(Trans::no, Trans::no, M, N, k, 1.5f, ga.data(), std::max(k, 1), gb.data(), N,
               0.0f, gc.data(), N);
    EXPECT_TRUE(agree("gemm beta=0", download(cpu(), cc), download(gpu(), gc)));
  }
}

TEST_F(GpuBackend, AxpyScale) {
  for (const std::size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const auto x = random_floats(n, 5), y = random_floats(n, 6);
    DeviceBuffer<float> cx = upload(cpu(), x), cy = upload(cpu(), y);
    DeviceBuffer<float> gx = upload(gpu(), x), gy = upload(gpu(), y);
    cpu().axpy(n, -0.3f, cx.data(), cy.data());
    gpu().axpy(n, -0.3f, gx.data(), gy.data());
    EXPECT_TRUE(agree("axpy", download(cpu(), cy), download(gpu(), gy)));
    cpu().scale(n, 1.7f, cx.data());
    gpu().scale(n, 1.7f, gx.data());
    EXPECT_TRUE(agree("scale", download(cpu(), cx), download(gpu(), gx)));
  }
}

TEST_F(GpuBackend, SumSquares) {
  std::vector<std::size_t> sizes = kSizes;
  sizes.push_back(1u << 20);  // more blocks than the partial-sum cap
  for (const std::size_t n : sizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const auto x = random_floats(n, 8, -3.0f, 3.0f);
    DeviceBuffer<float> cx = upload(cpu(), x), gx = upload(gpu(), x);
    const double c = cpu().sum_squares(cx.data(), n);
    const double g = gpu().sum_squares(gx.data(), n);
    EXPECT_TRUE(agree_scalar("sum_squares", c, g));
    EXPECT_EQ(g, gpu().sum_squares(gx.data(), n)) << "not deterministic";
  }
}

// ---- layers --------------------------------------------------------------------------------

struct BiasShape {
  int outer, channels, inner;
};

TEST_F(GpuBackend, AddBiasAndBiasGrad) {
  const std::vector<BiasShape> shapes = {{0, 3, 4},  {3, 0, 4},    {3, 4, 0},   {1, 1, 1},
                                         {7, 5, 1},  {64, 10, 1},  {3, 17, 33}, {2, 16, 784},
                                         {33, 1, 65}, {128, 300, 1}, {5, 3, 1000}};
  std::uint32_t seed = 200;
  for (const BiasShape& s : shapes) {
    const std::string name = "outer=" + std::to_string(s.outer) +
                             " channels=" + std::to_string(s.channels) +
                             " inner=" + std::to_string(s.inner);
    SCOPED_TRACE(name);
    const std::size_t n = std::size_t(s.outer) * s.channels * s.inner;
    const auto y = random_floats(n, ++seed), bias = random_floats(std::size_t(s.channels), ++seed);
    DeviceBuffer<float> cy = upload(cpu(), y), cb = upload(cpu(), bias);
    DeviceBuffer<float> gy = upload(gpu(), y), gb = upload(gpu(), bias);
    cpu().add_bias(cy.data(), cb.data(), s.outer, s.channels, s.inner);
    gpu().add_bias(gy.data(), gb.data(), s.outer, s.channels, s.inner);
    EXPECT_TRUE(agree("add_bias " + name, download(cpu(), cy), download(gpu(), gy)));

    // db starts as garbage: bias_grad must overwrite it (with zeros when outer*inner == 0).
    const auto garbage = random_floats(std::size_t(s.channels), ++seed, 10.0f, 20.0f);
    DeviceBuffer<float> cdb = upload(cpu(), garbage), gdb = upload(gpu(), garbage);
    cpu().bias_grad(cy.data(), s.outer, s.channels, s.inner, cdb.data());
    gpu().bias_grad(gy.data(), s.outer, s.channels, s.inner, gdb.data());
    EXPECT_TRUE(agree("bias_grad " + name, download(cpu(), cdb), download(gpu(), gdb)));
  }
}

TEST_F(GpuBackend, Relu) {
  for (const std::size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const auto x = random_floats(n, 9), dy = random_floats(n, 10);
    DeviceBuffer<float> cx = upload(cpu(), x), cy(cpu(), n), cdx(cpu(), n), cdy = upload(cpu(), dy);
    DeviceBuffer<float> gx = upload(gpu(), x), gy(gpu(), n), gdx(gpu(), n), gdy = upload(gpu(), dy);
    cpu().relu_forward(cx.data(), cy.data(), n);
    gpu().relu_forward(gx.data(), gy.data(), n);
    EXPECT_TRUE(agree("relu_forward", download(cpu(), cy), download(gpu(), gy), 0.0));
    cpu().relu_backward(cdy.data(), cy.data(), cdx.data(), n);
    gpu().relu_backward(gdy.data(), gy.data(), gdx.data(), n);
    EXPECT_TRUE(agree("relu_backward", download(cpu(), cdx), download(gpu(), gdx), 0.0));
    // In place: dx aliases dy.
    cpu().relu_backward(cdy.data(), cy.data(), cdy.data(), n);
    gpu().relu_backward(gdy.data(), gy.data(), gdy.data(), n);
    EXPECT_TRUE(agree("relu_backward in place", download(cpu(), cdy), download(gpu(), gdy), 0.0));
  }
}

// ---- losses --------------------------------------------------------------------------------

struct LossShape {
  int rows, C;
};

TEST_F(GpuBackend, SoftmaxXent) {
  const std::vector<LossShape> shapes = {{0, 10}, {1, 1},   {1, 10},  {7, 3},    {64, 10},
                                         {33, 100}, {5, 1000}, {257, 7}, {1000, 37}};
  std::uint32_t seed = 300;
  for (const LossShape& s : shapes) {
    const std::string name = "rows=" + std::to_string(s.rows) + " C=" + std::to_string(s.C);
    SCOPED_TRACE(name);
    const std::size_t n = std::size_t(s.rows) * s.C;
    const auto logits = random_floats(n, ++seed, -8.0f, 8.0f);
    const auto labels = random_labels(std::size_t(s.rows), s.C, ++seed);
    const float grad_scale = s.rows > 0 ? 1.0f / float(s.rows) : 1.0f;
    DeviceBuffer<float> cz = upload(cpu(), logits), cdz(cpu(), n);
    DeviceBuffer<float> gz = upload(gpu(), logits), gdz(gpu(), n);
    DeviceBuffer<std::int32_t> cl = upload(cpu(), labels), gl = upload(gpu(), labels);
    const double c = cpu().softmax_xent(cz.data(), cl.data(), s.rows, s.C, grad_scale, cdz.data());
    const double g = gpu().softmax_xent(gz.data(), gl.data(), s.rows, s.C, grad_scale, gdz.data());
    EXPECT_TRUE(agree_scalar("softmax_xent loss " + name, c, g));
    EXPECT_TRUE(agree("softmax_xent dlogits " + name, download(cpu(), cdz), download(gpu(), gdz)));
  }
}

// A training step queues backward before reading its loss (Model::forward_backward): the
// deferred losses give bitwise the values of the waiting ones, even when work that reuses the
// backend's scratch (sum_squares, softmax_xent) is queued between, and report bad labels when
// taken; one whose launch failed is not pending.
TEST_F(GpuBackend, DeferredLossesEqualTheWaitingOnes) {
  const int rows = 257, C = 10;
  const std::size_t n = std::size_t(rows) * C;
  const auto logits = random_floats(n, 41, -8.0f, 8.0f), other = random_floats(n, 42, -8.0f, 8.0f);
  const auto labels = random_labels(std::size_t(rows), C, 43);
  DeviceBuffer<float> z = upload(gpu(), logits), z2 = upload(gpu(), other), dz(gpu(), n), dz2(gpu(), n);
  DeviceBuffer<std::int32_t> l = upload(gpu(), labels);
  const double waited = gpu().softmax_xent(z.data(), l.data(), rows, C, 0.5f, dz.data());
  const auto dz_waited = download(gpu(), dz);
  gpu().softmax_xent_deferred(z.data(), l.data(), rows, C, 0.5f, dz.data());
  (void)gpu().sum_squares(z2.data(), n);                                    // reuses the scratch
  (void)gpu().softmax_xent(z2.data(), l.data(), rows, C, 1.0f, dz2.data());  // and again
  EXPECT_EQ(gpu().take_loss(), waited);
  EXPECT_TRUE(agree("deferred dlogits", dz_waited, download(gpu(), dz), 0.0));
  const double mse_waited = gpu().mse(z.data(), z2.data(), rows, C, 1.0f, dz.data());
  gpu().mse_deferred(z.data(), z2.data(), rows, C, 1.0f, dz.data());
  EXPECT_EQ(gpu().take_loss(), mse_waited);
  const std::vector<std::int32_t> bad = {0, 5, -1, 4};
  DeviceBuffer<std::int32_t> lb = upload(gpu(), bad);
  gpu().softmax_xent_deferred(z.data(), lb.data(), 4, 5, 1.0f, dz.data());
  EXPECT_THROW(gpu().take_loss(), std::invalid_argument);
  gpu().softmax_xent_deferred(z.data(), l.data(), 0, C, 1.0f, dz.data());
  EXPECT_EQ(gpu().take_loss(), 0.0);
  // A loss whose launch throws (C = 0 with rows) leaves nothing pending: no stale loss taken.
  EXPECT_ANY_THROW(gpu().softmax_xent_deferred(z.data(), l.data(), 3, 0, 1.0f, dz.data()));
  EXPECT_EQ(gpu().take_loss(), 0.0);
}

TEST_F(GpuBackend, SoftmaxXentRejectsOutOfRangeLabels) {
  const int rows = 4, C = 5;
  const auto logits = random_floats(std::size_t(rows) * C, 1);
  const std::vector<std::int32_t> labels = {0, 5, -1, 4};
  DeviceBuffer<float> gz = upload(gpu(), logits), gdz(gpu(), logits.size());
  DeviceBuffer<std::int32_t> gl = upload(gpu(), labels);
  EXPECT_THROW(gpu().softmax_xent(gz.data(), gl.data(), rows, C, 1.0f, gdz.data()),
               std::invalid_argument);
  // The backend is still usable afterwards.
  EXPECT_TRUE(agree("round trip after error", logits, download(gpu(), gz), 0.0));
}

TEST_F(GpuBackend, Mse) {
  const std::vector<LossShape> shapes = {{0, 4},    {1, 1},   {3, 0},    {7, 3},
                                         {64, 10},  {33, 100}, {5, 1000}, {1000, 37}};
  std::uint32_t seed = 400;
  for (const LossShape& s : shapes) {
    const std::string name = "rows=" + std::to_string(s.rows) + " C=" + std::to_string(s.C);
    SCOPED_TRACE(name);
    const std::size_t n = std::size_t(s.rows) * s.C;
    const auto y = random_floats(n, ++seed), t = random_floats(n, ++seed);
    const float grad_scale = 0.25f;
    DeviceBuffer<float> cy = upload(cpu(), y), ct = upload(cpu(), t), cdy(cpu(), n);
    DeviceBuffer<float> gy = upload(gpu(), y), gt = upload(gpu(), t), gdy(gpu(), n);
    const double c = cpu().mse(cy.data(), ct.data(), s.rows, s.C, grad_scale, cdy.data());
    const double g = gpu().mse(gy.data(), gt.data(), s.rows, s.C, grad_scale, gdy.data());
    EXPECT_TRUE(agree_scalar("mse loss " + name, c, g));
    EXPECT_TRUE(agree("mse dy " + name, download(cpu(), cdy), download(gpu(), gdy)));
  }
}

TEST_F(GpuBackend, CountCorrect) {
  const std::vector<LossShape> shapes = {{0, 10},  {1, 1},    {1, 10},  {3, 0},
                                         {64, 10}, {257, 7},  {1000, 37}, {70000, 10}};
  std::uint32_t seed = 500;
  for (const LossShape& s : shapes)
    for (const bool ties : {false, true}) {
      const std::string name = "rows=" + std::to_string(s.rows) + " C=" + std::to_string(s.C) +
                               (ties ? " with ties" : "");
      SCOPED_TRACE(name);
      const std::size_t n = std::size_t(s.rows) * s.C;
      auto logits = random_floats(n, ++seed, -4.0f, 4.0f);
      if (ties)  // few distinct values: many rows have several maxima (first one wins)
        for (float& z : logits) z = std::round(z);
      auto labels = random_labels(std::size_t(s.rows), s.C, ++seed);
      // Make about half of the rows correct: the label of every even row is its argmax.
      for (int r = 0; r < s.rows && s.C > 0; r += 2)
        labels[std::size_t(r)] =
            math::argmax_row(logits.data() + std::size_t(r) * s.C, s.C);
      DeviceBuffer<float> cz = upload(cpu(), logits), gz = upload(gpu(), logits);
      DeviceBuffer<std::int32_t> cl = upload(cpu(), labels), gl = upload(gpu(), labels);
      const long c = cpu().count_correct(cz.data(), cl.data(), s.rows, s.C);
      const long g = gpu().count_correct(gz.data(), gl.data(), s.rows, s.C);
      EXPECT_EQ(c, g);
      if (s.rows >= 2 && s.C > 0) {
        EXPECT_GE(c, (s.rows + 1) / 2);
      }
    }
}

// ---- element-wise programs and the optimizers made of them ---------------------------------

// Every op of an element-wise program, on both backends.
TEST_F(GpuBackend, EveryProgramOp) {
  using math::OpCode;
  for (const std::size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const auto x = random_floats(n, 30, 0.5f, 2.0f), y = random_floats(n, 31, 0.5f, 2.0f);
    math::Program p;
    p.arrays = 3;  // x, y, out
    p.op(OpCode::axpby, 3, 0, 1, 0.5f, -2.0f).op(OpCode::mul, 4, 3, 1).op(OpCode::div, 4, 4, 0).op(OpCode::sqrt, 5, 1);
    p.op(OpCode::add_scalar, 5, 5, 0, 0.25f).op(OpCode::scale, 5, 5, 0, 3.0f).op(OpCode::div_scalar, 5, 5, 0, 7.0f);
    p.op(OpCode::axpby, 2, 4, 5, 1.0f, 1.0f);
    DeviceBuffer<float> cx = upload(cpu(), x), cy = upload(cpu(), y), co = upload(cpu(), x);
    DeviceBuffer<float> gx = upload(gpu(), x), gy = upload(gpu(), y), go = upload(gpu(), x);
    float* ca[] = {cx.data(), cy.data(), co.data()};
    float* ga[] = {gx.data(), gy.data(), go.data()};
    cpu().run(p, ca, n);
    gpu().run(p, ga, n);
    EXPECT_TRUE(agree("program out", download(cpu(), co), download(gpu(), go)));
    EXPECT_TRUE(agree("program x untouched", download(cpu(), cx), download(gpu(), gx)));
  }
}

// Live scalars (math::Program::live): a program reads them as it runs; write_scalars is queued in
// order with the work (two runs queued back to back each see their own values); a program
// recorded in a step graph replays with the values written since, and write_scalars is refused
// while recording.
TEST_F(GpuBackend, ProgramsReadLiveScalarsWrittenInOrderAlsoInAGraph) {
  using math::OpCode;
  const std::size_t n = 100003;
  const auto x = random_floats(n, 40), y = random_floats(n, 41);
  math::Program p;
  p.arrays = 3;  // out = (x + live[1] y) live[0]
  p.op(OpCode::axpby, 2, 0, 1, 1.0f, math::Scalar::live(1)).op(OpCode::scale, 2, 2, 0, math::Scalar::live(0));
  DeviceBuffer<float> gx = upload(gpu(), x), gy = upload(gpu(), y), out1(gpu(), n), out2(gpu(), n), out3(gpu(), n);
  DeviceBuffer<float> live(gpu(), math::Program::kMaxLive);
  gpu().fill(live.data(), live.size(), 0.0f);
  p.live = live.data();
  const float first[] = {2.0f, 0.5f}, second[] = {-1.0f, 0.25f}, third[] = {3.0f, -4.0f};
  float* a1[] = {gx.data(), gy.data(), out1.data()};
  float* a2[] = {gx.data(), gy.data(), out2.data()};
  float* a3[] = {gx.data(), gy.data(), out3.data()};
  gpu().write_scalars(live.data(), first, 2);
  gpu().run(p, a1, n);
  gpu().write_scalars(live.data(), second, 2);
  gpu().run(p, a2, n);
  ASSERT_TRUE(gpu().records_graphs());
  gpu().begin_recording();
  gpu().run(p, a3, n);
  std::string why;
  const std::unique_ptr<Backend::Graph> g = gpu().end_recording(&why);
  ASSERT_TRUE(g) << why;
  gpu().write_scalars(live.data(), third, 2);
  ASSERT_TRUE(gpu().replay(*g));
  gpu().synchronize();
  gpu().begin_recording();
  EXPECT_THROW(gpu().write_scalars(live.data(), third, 2), std::logic_error) << "its values would be the recording's";
  gpu().end_recording(&why);
  const std::vector<float> o1 = download(gpu(), out1), o2 = download(gpu(), out2), o3 = download(gpu(), out3);
  for (std::size_t i = 0; i < n; i += 997) {
    EXPECT_EQ(o1[i], (x[i] + 0.5f * y[i]) * 2.0f) << i;
    EXPECT_EQ(o2[i], (x[i] + 0.25f * y[i]) * -1.0f) << i;
    EXPECT_EQ(o3[i], (x[i] + -4.0f * y[i]) * 3.0f) << "the replay read the scalars written after the recording; " << i;
  }
}

// Every optimizer that records, with live scalars on both backends and a rate that changes every
// step: the GPU's steps agree with the CPU's, and with the GPU's written-scalar steps bitwise
// (sgd without weight decay: its written update is the backend's axpy, within rounding).
TEST_F(GpuBackend, OptimizersWithLiveScalarsStepAlike) {
  for (const auto& e : optimizer_registry().entries()) {
    OptimizerConfig cfg;
    cfg.kind = e.name;
    cfg.weight_decay = e.name == "sgd" ? 0.0 : 1e-3;
    const std::size_t n = 4099;
    Optimizer oc(cpu(), cfg, n), og(gpu(), cfg, n), written(gpu(), cfg, n);
    if (!og.records()) continue;
    SCOPED_TRACE(e.name);
    oc.use_live_scalars();
    og.use_live_scalars();
    const auto w = random_floats(n, 17), g = random_floats(n, 18);
    DeviceBuffer<float> cw = upload(cpu(), w), gw = upload(gpu(), w), ww = upload(gpu(), w);
    DeviceBuffer<float> cg = upload(cpu(), g), gg = upload(gpu(), g);
    for (int s = 0; s < 3; ++s) {
      const double lr = 0.05 * (1.0 + s);
      oc.step(cw.data(), cg.data(), lr);
      og.step(gw.data(), gg.data(), lr);
      written.step(ww.data(), gg.data(), lr);
    }
    EXPECT_TRUE(agree("w", download(cpu(), cw), download(gpu(), gw)));
    if (e.name == "sgd") {
      EXPECT_TRUE(agree("w against written", download(gpu(), ww), download(gpu(), gw), 1e-6));
    } else {
      EXPECT_TRUE(download(gpu(), ww) == download(gpu(), gw)) << "live scalars changed the GPU's steps";
    }
  }
}

// Every optimizer kind (three steps each, so the state's evolution is compared too), two layers.
TEST_F(GpuBackend, EveryOptimizerStepsAlikeOnBothBackends) {
  for (const auto& e : optimizer_registry().entries())
    for (const std::size_t n : kSizes) {
      SCOPED_TRACE(e.name + ", n = " + std::to_string(n));
      OptimizerConfig cfg;
      cfg.kind = e.name;
      cfg.lr = 0.05;
      cfg.weight_decay = 1e-3;
      const std::vector<std::size_t> layers = {n / 3, n - n / 3};
      Optimizer oc(cpu(), cfg, n, layers), og(gpu(), cfg, n, layers);
      const auto w = random_floats(n, 17);
      DeviceBuffer<float> cw = upload(cpu(), w), gw = upload(gpu(), w);
      for (int step = 0; step < 3; ++step) {
        const auto g = random_floats(n, 18 + std::uint32_t(step));
        DeviceBuffer<float> cg = upload(cpu(), g), gg = upload(gpu(), g);
        oc.step(cw.data(), cg.data(), 0.05);
        og.step(gw.data(), gg.data(), 0.05);
      }
      EXPECT_TRUE(agree(e.name + " w", download(cpu(), cw), download(gpu(), gw)));
      const auto cs = oc.state(), gs = og.state();
      ASSERT_EQ(cs.size(), gs.size());
      for (std::size_t i = 0; i < cs.size(); ++i) EXPECT_TRUE(agree(e.name + " state", cs[i], gs[i]));
    }
}

// ---- convolution helpers -------------------------------------------------------------------

TEST_F(GpuBackend, Im2colCol2im) {
  // C, H, W, KH, KW, stride, pad
  const std::vector<math::ConvGeometry> geometries = {
      {1, 1, 1, 1, 1, 1, 0},   {0, 5, 5, 3, 3, 1, 1},  {3, 5, 5, 3, 3, 1, 1},
      {2, 7, 6, 3, 2, 2, 1},   {4, 28, 28, 5, 5, 1, 2}, {1, 4, 4, 2, 2, 2, 0},
      {2, 8, 8, 2, 2, 3, 0},   // stride > kernel: some pixels are never read
      {3, 9, 11, 3, 3, 3, 2},  {16, 14, 14, 3, 3, 1, 1}, {1, 33, 31, 7, 5, 2, 3}};
  std::uint32_t seed = 600;
  for (const math::ConvGeometry& g : geometries) {
    std::ostringstream os;
    os << "C=" << g.C << " H=" << g.H << " W=" << g.W << " K=" << g.KH << "x" << g.KW
       << " stride=" << g.stride << " pad=" << g.pad;
    SCOPED_TRACE(os.str());
    const int B = 3;  // a batch per call: (B, C, H, W) <-> (C*KH*KW, B*OH*OW)
    const std::size_t img = std::size_t(B) * g.C * g.H * g.W;
    const std::size_t ncols = std::size_t(g.C) * g.KH * g.KW * std::size_t(B * g.OH() * g.OW());
    const auto x = random_floats(img, ++seed);
    // Outputs start as NaN: every element must be written.
    const std::vector<float> nan_cols(ncols, std::numeric_limits<float>::quiet_NaN());
    DeviceBuffer<float> cx = upload(cpu(), x), ccols = upload(cpu(), nan_cols);
    DeviceBuffer<float> gx = upload(gpu(), x), gcols = upload(gpu(), nan_cols);
    cpu().im2col(cx.data(), g, B, ccols.data());
    gpu().im2col(gx.data(), g, B, gcols.data());
    EXPECT_TRUE(agree("im2col " + os.str(), download(cpu(), ccols), download(gpu(), gcols), 0.0));

    const auto cols = random_floats(ncols, ++seed);
    const std::vector<float> nan_img(img, std::numeric_limits<float>::quiet_NaN());
    DeviceBuffer<float> ccols2 = upload(cpu(), cols), cdx = upload(cpu(), nan_img);
    DeviceBuffer<float> gcols2 = upload(gpu(), cols), gdx = upload(gpu(), nan_img);
    cpu().col2im(ccols2.data(), g, B, cdx.data());
    gpu().col2im(gcols2.data(), g, B, gdx.data());
    EXPECT_TRUE(agree("col2im " + os.str(), download(cpu(), cdx), download(gpu(), gdx)));

    // The (OC, B, N) <-> (B, OC, N) swap around the convolution's GEMM: bitwise a copy.
    const int OC = 4, N = g.OH() * g.OW();
    const auto t = random_floats(std::size_t(OC) * B * N, ++seed);
    const std::vector<float> nan_t(t.size(), std::numeric_limits<float>::quiet_NaN());
    DeviceBuffer<float> ct = upload(cpu(), t), cy = upload(cpu(), nan_t);
    DeviceBuffer<float> gt = upload(gpu(), t), gy = upload(gpu(), nan_t);
    cpu().swap_outer(ct.data(), OC, B, N, cy.data());
    gpu().swap_outer(gt.data(), OC, B, N, gy.data());
    EXPECT_TRUE(agree("swap_outer " + os.str(), download(cpu(), cy), download(gpu(), gy), 0.0));
  }
}

// A convolution layer's passes (Backend::conv_forward / conv_backward): the GPU's, on cuDNN (its
// heuristic's algorithms, and timed ones) and by im2col and cuBLAS (PSLAB_CUDNN=off), against the
// CPU backend's (im2col, NCHW), batch of 5: the small CNN's shapes, an odd one, and ResNet's (3x3
// at stride 1 and 2, the 1x1 projection); the scratch is the largest of the backends' needs.
TEST_F(GpuBackend, ConvolutionForwardAndBackward) {
  std::uint32_t seed = 700;
  Backend* const backends[] = {&cpu(), &gpu(), &gpu_timed(), &gpu_without_cudnn()};
  for (auto [g, OC] : {std::pair{math::ConvGeometry{1, 28, 28, 5, 5, 2, 2}, 16}, {math::ConvGeometry{16, 14, 14, 5, 5, 2, 2}, 32},
                       {math::ConvGeometry{3, 9, 11, 3, 3, 3, 2}, 4}, {math::ConvGeometry{16, 32, 32, 3, 3, 1, 1}, 16},
                       {math::ConvGeometry{16, 32, 32, 3, 3, 2, 1}, 32}, {math::ConvGeometry{16, 32, 32, 1, 1, 2, 0}, 32}}) {
    SCOPED_TRACE("C=" + std::to_string(g.C) + " H=" + std::to_string(g.H) + " OC=" + std::to_string(OC));
    const int B = 5, K = g.C * g.KH * g.KW, N = g.OH() * g.OW();
    const auto x = random_floats(std::size_t(B) * g.C * g.H * g.W, ++seed);
    const auto W = random_floats(std::size_t(OC) * K, ++seed), dy = random_floats(std::size_t(B) * OC * N, ++seed);
    std::size_t scratch = 0;
    for (Backend* be : backends) scratch = std::max(scratch, be->conv_scratch_floats(g, OC, B));
    const std::vector<float> nan_y(dy.size(), std::numeric_limits<float>::quiet_NaN()), nan_dW(W.size(), std::nanf("")),
        nan_dx(x.size(), std::nanf("")), nan_s(scratch, std::nanf(""));
    std::vector<float> out[4][3];
    for (int k = 0; k < 4; ++k) {
      Backend& be = *backends[k];
      DeviceBuffer<float> bx = upload(be, x), bW = upload(be, W), bdy = upload(be, dy), by = upload(be, nan_y),
                          bdW = upload(be, nan_dW), bdx = upload(be, nan_dx), bs = upload(be, nan_s);
      be.conv_forward(bx.data(), bW.data(), g, OC, B, by.data(), bs.data());
      be.conv_backward(bx.data(), bW.data(), bdy.data(), g, OC, B, bdW.data(), bdx.data(), bs.data());
      out[k][0] = download(be, by), out[k][1] = download(be, bdW), out[k][2] = download(be, bdx);
    }
    for (int k : {1, 2, 3}) {
      SCOPED_TRACE(backends[k]->describe());
      EXPECT_TRUE(agree("conv_forward y", out[0][0], out[k][0]));
      EXPECT_TRUE(agree("conv_backward dW", out[0][1], out[k][1]));
      EXPECT_TRUE(agree("conv_backward dx", out[0][2], out[k][2]));
    }
  }
}

// PSLAB_CUDNN other than heuristic, timed or off: refused, naming the variable and its values.
TEST_F(GpuBackend, UnknownCudnnSettingIsRefused) {
  const char* was = std::getenv("PSLAB_CUDNN");
  const std::string before = was ? was : "(unset)";
  std::unique_ptr<Backend> made;
  try {
    with_cudnn("fastest", made);
    FAIL() << "PSLAB_CUDNN=fastest was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("PSLAB_CUDNN is \"fastest\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"heuristic\""), std::string::npos) << e.what();
  }
  const char* now = std::getenv("PSLAB_CUDNN");
  EXPECT_EQ(now ? now : "(unset)", before);  // restored
}

// Batch norm in both modes, over channels of a few values and of more than a block's threads.
TEST_F(GpuBackend, BatchNormForwardAndBackward) {
  std::uint32_t seed = 800;
  for (auto [B, C, HW] : {std::tuple{3, 2, 4}, {16, 5, 49}, {64, 3, 1}}) {
    SCOPED_TRACE("B=" + std::to_string(B) + " C=" + std::to_string(C) + " HW=" + std::to_string(HW));
    const std::size_t n = std::size_t(B) * C * HW;
    const auto x = random_floats(n, ++seed, -2.0f, 3.0f), dy = random_floats(n, ++seed);
    const auto gamma = random_floats(std::size_t(C), ++seed, 0.5f, 1.5f), beta = random_floats(std::size_t(C), ++seed);
    std::vector<float> running(2 * std::size_t(C), 1.0f);
    for (int c = 0; c < C; ++c) running[std::size_t(c)] = 0.1f * float(c);
    const std::vector<float> nan_n(n, std::nanf("")), nan_c(2 * std::size_t(C), std::nanf(""));
    std::vector<float> out[3][6];
    for (Backend* be : {&cpu(), &gpu(), &gpu_without_cudnn()}) {
      DeviceBuffer<float> bx = upload(*be, x), bdy = upload(*be, dy), bg = upload(*be, gamma), bb = upload(*be, beta),
                          br = upload(*be, running), bs = upload(*be, nan_c), by = upload(*be, nan_n),
                          bi = upload(*be, nan_n), bdx = upload(*be, nan_n), bd = upload(*be, nan_c);
      const int C2 = C;
      be->batch_norm_forward(bx.data(), B, C, HW, bg.data(), bb.data(), true, 0.1f, 1e-5f, br.data(), br.data() + C2,
                             bs.data(), bs.data() + C2, by.data());
      be->batch_norm_backward(bx.data(), bdy.data(), B, C, HW, bg.data(), bs.data(), bs.data() + C2, bd.data(),
                              bd.data() + C2, bdx.data());
      be->batch_norm_forward(bx.data(), B, C, HW, bg.data(), bb.data(), false, 0.1f, 1e-5f, br.data(), br.data() + C2,
                             nullptr, nullptr, bi.data());
      const int k = be == &cpu() ? 0 : be == &gpu() ? 1 : 2;
      out[k][0] = download(*be, by), out[k][1] = download(*be, bs), out[k][2] = download(*be, br);
      out[k][3] = download(*be, bd), out[k][4] = download(*be, bdx), out[k][5] = download(*be, bi);
    }
    for (int k : {1, 2}) {
      SCOPED_TRACE(k == 1 ? gpu().describe() : gpu_without_cudnn().describe());
      EXPECT_TRUE(agree("training y", out[0][0], out[k][0]));
      EXPECT_TRUE(agree("saved mean, invstd", out[0][1], out[k][1]));
      EXPECT_TRUE(agree("running mean, variance", out[0][2], out[k][2]));
      EXPECT_TRUE(agree("dgamma, dbeta", out[0][3], out[k][3]));
      EXPECT_TRUE(agree("dx", out[0][4], out[k][4]));
      EXPECT_TRUE(agree("inference y", out[0][5], out[k][5]));
    }
  }
}

// The GPU backend runs convolutions and batch norm on cuDNN where it can load libcudnn.so.9
// (tests/gpu.sh puts Python's nvidia-cudnn on LD_LIBRARY_PATH); TF32 for convolutions is opt-in
// and re-plans them: a ResNet convolution in TF32 is close to FP32's (a 10-bit mantissa), and
// back in FP32 agrees with the CPU again.
TEST_F(GpuBackend, ConvolutionsAndBatchNormRunOnCudnnWithTf32OptIn) {
  if (gpu().describe().find("cuDNN 9") == std::string::npos) PSLAB_GPU_UNAVAILABLE("no cuDNN: " + gpu().describe());
  const math::ConvGeometry g{16, 32, 32, 3, 3, 1, 1};
  const int OC = 16, B = 8;
  const auto x = random_floats(std::size_t(B) * g.C * g.H * g.W, 901), W = random_floats(std::size_t(OC) * 16 * 9, 902);
  const std::vector<float> nan_y(std::size_t(B) * OC * g.OH() * g.OW(), std::nanf(""));
  auto forward = [&](Backend& be) {
    DeviceBuffer<float> bx = upload(be, x), bW = upload(be, W), by = upload(be, nan_y),
                        bs = upload(be, std::vector<float>(be.conv_scratch_floats(g, OC, B)));
    be.conv_forward(bx.data(), bW.data(), g, OC, B, by.data(), bs.data());
    return download(be, by);
  };
  const std::vector<float> want = forward(cpu());
  gpu().allow_tf32(true);
  const std::vector<float> tf32 = forward(gpu());
  gpu().allow_tf32(false);
  EXPECT_TRUE(agree("TF32 conv_forward y", want, tf32, 2e-2));
  EXPECT_TRUE(agree("FP32 again: conv_forward y", want, forward(gpu())));
}

// The CUDA plugin finds libcudnn.so.9 with every entry point pslab calls, version 9 (no GPU
// needed: the toolkit of a build machine has it). Skipped where it cannot be loaded (a build
// without CUDA, a host without cuDNN), failed so under PSLAB_REQUIRE_GPU.
TEST(CudnnLibrary, LoadsWithEveryEntryPointPslabCalls) {
  std::string why;
  using Version = std::size_t (*)(std::string*);
  const auto version = reinterpret_cast<Version>(cuda_plugin_symbol("libpslab_cuda.so", "pslab_cudnn_version", &why));
  if (!version) PSLAB_GPU_UNAVAILABLE(why);
  const std::size_t v = version(&why);
  if (v == 0) PSLAB_GPU_UNAVAILABLE(why);
  EXPECT_EQ(v / 10000, 9u) << v;
  std::printf("[ cudnn    ] version %zu\n", v);
}

}  // namespace
}  // namespace pslab
