// CPU backend ops against naive double-precision references.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend.h"
#include "elementwise.h"
#include "core/rng.h"

using namespace pslab;

namespace {

std::vector<float> random_vec(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(r.normal() * scale);
  return v;
}

// Number of elements where |a - b| > tol * max(1, |b|).
long count_wrong(const std::vector<float>& a, const std::vector<double>& b, double tol) {
  long wrong = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    wrong += std::abs(double(a[i]) - b[i]) > tol * std::max(1.0, std::abs(b[i]));
  return wrong;
}

class CpuKernels : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(1);
};

TEST_F(CpuKernels, GemmAllTransposesAndStrides) {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (auto [M, N, K] : {std::tuple{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {0, 4, 3}, {3, 4, 0}}) {
        const int lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 3;
        const auto A = random_vec(std::size_t(ta ? K : M) * lda, 1);
        const auto B = random_vec(std::size_t(tb ? N : K) * ldb, 2);
        auto C = random_vec(std::size_t(M) * ldc, 3);
        std::vector<double> ref(C.begin(), C.end());
        const float alpha = 0.7f, beta = -0.3f;
        for (int i = 0; i < M; ++i)
          for (int j = 0; j < N; ++j) {
            double s = 0;
            for (int k = 0; k < K; ++k)
              s += double(ta ? A[k * lda + i] : A[i * lda + k]) * double(tb ? B[j * ldb + k] : B[k * ldb + j]);
            ref[i * ldc + j] = alpha * s + beta * double(C[i * ldc + j]);
          }
        be->gemm(ta ? Trans::yes : Trans::no, tb ? Trans::yes : Trans::no, M, N, K, alpha,
                 A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        EXPECT_EQ(count_wrong(C, ref, 1e-5), 0) << "ta=" << ta << " tb=" << tb << " M=" << M << " N=" << N << " K=" << K;
      }
}

TEST_F(CpuKernels, Tf32IsRefusedNamingTheBackend) {
  EXPECT_NO_THROW(be->allow_tf32(false));
  try {
    be->allow_tf32(true);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("TF32 is a CUDA option: cpu (", 0), 0u) << e.what();
  }
}

TEST_F(CpuKernels, BiasAddAndGradient) {
  for (auto [outer, ch, inner] : {std::tuple{5, 7, 1}, {3, 4, 9}, {1, 1, 1}}) {
    auto y = random_vec(std::size_t(outer) * ch * inner, 4);
    const auto b = random_vec(std::size_t(ch), 5);
    std::vector<double> ref(y.begin(), y.end()), dref(std::size_t(ch), 0.0);
    for (int o = 0; o < outer; ++o)
      for (int c = 0; c < ch; ++c)
        for (int i = 0; i < inner; ++i) {
          ref[(o * ch + c) * inner + i] += b[c];
          dref[c] += y[(o * ch + c) * inner + i];
        }
    std::vector<float> db(std::size_t(ch), 99.0f);
    be->bias_grad(y.data(), outer, ch, inner, db.data());
    EXPECT_EQ(count_wrong(db, dref, 1e-5), 0);
    be->add_bias(y.data(), b.data(), outer, ch, inner);
    EXPECT_EQ(count_wrong(y, ref, 1e-6), 0);
  }
}

// The GPU's bias gradient (math::bias_grad_thread_sum, one block per channel): the threads of a
// block, together, visit each of their channel's elements once. Small integers, so that every
// partial sum is exact and any order gives the one answer; blocks of 1024 (the kernel's), and of 3
// and 32 to cross row ends at other offsets; a row longer than the block; empty channels.
TEST(GpuMath, BiasGradThreadsSumEachOfTheirChannelsElementsOnce) {
  for (auto [outer, ch, inner] : {std::tuple{0, 3, 4}, {3, 4, 0}, {1, 1, 1}, {7, 5, 1}, {64, 10, 1}, {3, 17, 33},
                                  {2, 16, 784}, {33, 1, 65}, {5, 3, 1000}, {3, 2, 1500}, {1024, 16, 196},
                                  {1024, 32, 49}, {4096, 2, 196}}) {
    const std::size_t n = std::size_t(outer) * ch * inner;
    std::vector<float> dy(n);
    std::vector<long> want(std::size_t(ch), 0);
    for (int o = 0; o < outer; ++o)
      for (int c = 0; c < ch; ++c)
        for (int i = 0; i < inner; ++i) {
          const int v = (o * 31 + c * 7 + i * 13) % 11;
          dy[(std::size_t(o) * ch + c) * inner + i] = float(v);
          want[std::size_t(c)] += v;
        }
    for (int T : {1024, 32, 3}) {
      SCOPED_TRACE("outer=" + std::to_string(outer) + " channels=" + std::to_string(ch) +
                   " inner=" + std::to_string(inner) + " T=" + std::to_string(T));
      for (int c = 0; c < ch; ++c) {
        double got = 0;
        for (int t = 0; t < T; ++t) got += math::bias_grad_thread_sum<8>(dy.data(), outer, ch, inner, c, t, T);
        ASSERT_EQ(got, double(want[std::size_t(c)])) << "channel " << c;
      }
      // Each element once, not another of equal value: channel c alone holds 1, 2, ..., its
      // element count (distinct; every sum exact in float up to 5000 elements).
      if (std::size_t(outer) * inner > 5000) continue;
      for (int c = 0; c < ch; ++c) {
        std::vector<float> one(n, 0.0f);
        for (std::size_t j = 0; j < std::size_t(outer) * inner; ++j)
          one[(j / inner * ch + c) * inner + j % inner] = float(j + 1);
        double got = 0;
        for (int t = 0; t < T; ++t) got += math::bias_grad_thread_sum<8>(one.data(), outer, ch, inner, c, t, T);
        const double m = double(outer) * inner;
        ASSERT_EQ(got, m * (m + 1) / 2) << "channel " << c << " alone";
      }
    }
  }
}

TEST_F(CpuKernels, ReluForwardBackward) {
  const std::vector<float> x = {-2.0f, -0.0f, 0.0f, 0.5f, 3.0f};
  std::vector<float> y(5), dx(5);
  be->relu_forward(x.data(), y.data(), 5);
  EXPECT_EQ(y, (std::vector<float>{0, 0, 0, 0.5f, 3.0f}));
  const std::vector<float> dy = {1, 2, 3, 4, 5};
  be->relu_backward(dy.data(), y.data(), dx.data(), 5);
  EXPECT_EQ(dx, (std::vector<float>{0, 0, 0, 4, 5}));
}

// A label outside [0, C) (bad data): refused, as on the GPU; it was read past its row (label
// 5 read the next row's logit, -1 the row before) and its gradient silently wrong.
TEST_F(CpuKernels, SoftmaxCrossEntropyRefusesOutOfRangeLabels) {
  const int rows = 4, C = 5;
  std::vector<float> z(std::size_t(rows) * C, 0.5f), dz(z.size());
  const std::vector<std::int32_t> labels = {0, 5, -1, 4};
  try {
    be->softmax_xent(z.data(), labels.data(), rows, C, 1.0f, dz.data());
    ADD_FAILURE() << "labels outside [0, C) were taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "softmax_xent: 2 of 4 labels lie outside [0, 5)");
  }
}

TEST_F(CpuKernels, SoftmaxCrossEntropyIsStableAndMatchesDouble) {
  const int rows = 4, C = 5;
  auto z = random_vec(std::size_t(rows) * C, 6, 3.0);
  z[0] = 1000.0f;  // would overflow exp() without the max shift
  z[6] = -1000.0f;
  const std::vector<std::int32_t> labels = {0, 1, 4, 2};
  std::vector<float> dz(z.size());
  const double loss = be->softmax_xent(z.data(), labels.data(), rows, C, 0.5f, dz.data());
  double ref_loss = 0;
  std::vector<double> ref_dz(z.size());
  for (int r = 0; r < rows; ++r) {
    double m = -1e300, s = 0;
    for (int c = 0; c < C; ++c) m = std::max(m, double(z[r * C + c]));
    for (int c = 0; c < C; ++c) s += std::exp(double(z[r * C + c]) - m);
    ref_loss += std::log(s) + m - z[r * C + labels[r]];
    for (int c = 0; c < C; ++c)
      ref_dz[r * C + c] = 0.5 * (std::exp(double(z[r * C + c]) - m) / s - (c == labels[r]));
  }
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, ref_loss, 1e-4 * std::abs(ref_loss));
  EXPECT_EQ(count_wrong(dz, ref_dz, 1e-6), 0);
  EXPECT_EQ(be->count_correct(z.data(), labels.data(), rows, C),
            [&] { long n = 0; for (int r = 0; r < rows; ++r) n += math::argmax_row(&z[r * C], C) == labels[r]; return n; }());
}

TEST_F(CpuKernels, MseLossAndGradient) {
  const std::vector<float> y = {1, 2, 3, 4}, t = {0, 2, 5, 4};
  std::vector<float> dy(4);
  const double loss = be->mse(y.data(), t.data(), 2, 2, 0.5f, dy.data());
  EXPECT_DOUBLE_EQ(loss, 0.5 * (1 + 0 + 4 + 0));
  EXPECT_EQ(dy, (std::vector<float>{0.5f, 0.0f, -1.0f, 0.0f}));
}

TEST_F(CpuKernels, CountCorrect) {
  const std::vector<float> z = {0.1f, 0.9f, 0.0f, /**/ 2.0f, 1.0f, 0.0f, /**/ 0.0f, 0.0f, 1.0f};
  const std::vector<std::int32_t> labels = {1, 1, 2};
  EXPECT_EQ(be->count_correct(z.data(), labels.data(), 3, 3), 2);
}

TEST_F(CpuKernels, AxpyScaleSumSquares) {
  std::vector<float> x = {1, 2, 3}, y = {1, 1, 1};
  be->axpy(3, 2.0f, x.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{3, 5, 7}));
  be->scale(3, 0.5f, y.data());
  EXPECT_EQ(y, (std::vector<float>{1.5f, 2.5f, 3.5f}));
  EXPECT_DOUBLE_EQ(be->sum_squares(x.data(), 3), 14.0);
  EXPECT_DOUBLE_EQ(be->sum_squares(x.data(), 0), 0.0);
}

// A long axpy on 2 threads runs on OpenBLAS's threads right after a GEMM and on the backend's
// team after a pass of the team's: y + a x within rounding (one FMA or a product and a sum) on
// either, every element written, on the same backend in turn.
TEST(CpuKernelsThreads, ALongAxpyIsRightAfterAGemmAndAfterATeamPass) {
  auto be = make_cpu_backend(2, CpuConvolutions::im2col);
  const std::size_t n = std::size_t(1) << 18;  // past the length a pass is split at
  const auto x = random_vec(n, 11), y0 = random_vec(n, 12);
  std::vector<float> g(64 * 64, 1.0f), gc(64 * 64), r_in(n);
  for (int after_gemm : {1, 0, 1}) {
    if (after_gemm) be->gemm(Trans::no, Trans::no, 64, 64, 64, 1.0f, g.data(), 64, g.data(), 64, 0.0f, gc.data(), 64);
    else be->relu_forward(y0.data(), r_in.data(), n);  // long: split over the team
    std::vector<float> y = y0;
    const float a = -0.37f;
    be->axpy(n, a, x.data(), y.data());
    for (std::size_t i = 0; i < n; ++i) {
      const double want = double(y0[i]) + double(a) * double(x[i]);
      ASSERT_NEAR(y[i], want, 1e-6 * (1.0 + std::abs(want))) << "element " << i << (after_gemm ? " after a GEMM" : " after a team pass");
    }
  }
}

// im2col and col2im are adjoint: <im2col(x), c> == <x, col2im(c)> for all x, c. With x a
// unit vector this also checks every single entry of both.
TEST_F(CpuKernels, Im2colCol2imAreAdjointAndMatchDirectIndexing) {
  for (auto g : {math::ConvGeometry{2, 5, 6, 3, 3, 1, 1}, math::ConvGeometry{3, 7, 7, 5, 5, 2, 2},
                 math::ConvGeometry{1, 4, 4, 2, 2, 2, 0}}) {
    const int rows = g.C * g.KH * g.KW, cols = g.OH() * g.OW(), n = g.C * g.H * g.W;
    const auto x = random_vec(std::size_t(n), 7);
    const auto c = random_vec(std::size_t(rows) * cols, 8);
    std::vector<float> xc(std::size_t(rows) * cols), cx(static_cast<std::size_t>(n));
    be->im2col(x.data(), g, 1, xc.data());
    be->col2im(c.data(), g, 1, cx.data());
    double lhs = 0, rhs = 0;
    for (std::size_t i = 0; i < xc.size(); ++i) lhs += double(xc[i]) * c[i];
    for (std::size_t i = 0; i < cx.size(); ++i) rhs += double(x[i]) * cx[i];
    EXPECT_NEAR(lhs, rhs, 1e-4 * std::max(1.0, std::abs(lhs)));
    // Direct: column (r, p) holds x[c, oh*s - pad + kh, ow*s - pad + kw] or 0.
    for (int r = 0; r < rows; ++r)
      for (int p = 0; p < cols; ++p) {
        const int kw = r % g.KW, kh = r / g.KW % g.KH, ch = r / (g.KW * g.KH);
        const int ih = p / g.OW() * g.stride - g.pad + kh, iw = p % g.OW() * g.stride - g.pad + kw;
        const float want = ih < 0 || iw < 0 || ih >= g.H || iw >= g.W ? 0.0f : x[(ch * g.H + ih) * g.W + iw];
        ASSERT_EQ(xc[std::size_t(r) * cols + p], want) << "row " << r << " col " << p;
      }
  }
}

TEST(Augment, CropsWithZeroPaddingAndFlipsAsDrawnPerSampleAndEpoch) {
  // draws: in range, the same for the same (seed, epoch, sample), different across them
  int flips = 0;
  for (std::uint32_t s = 0; s < 1000; ++s) {
    const math::AugmentDraw d = math::augment_draw(9, 3, s, 4);
    ASSERT_TRUE(d.dx >= 0 && d.dx <= 8 && d.dy >= 0 && d.dy <= 8);
    const math::AugmentDraw again = math::augment_draw(9, 3, s, 4);
    ASSERT_TRUE(d.dx == again.dx && d.dy == again.dy && d.flip == again.flip);
    flips += d.flip;
  }
  EXPECT_NEAR(flips, 500, 60);
  int same = 0;
  for (std::uint32_t s = 0; s < 100; ++s) {
    const auto a = math::augment_draw(9, 3, s, 4), b = math::augment_draw(9, 4, s, 4);
    same += a.dx == b.dx && a.dy == b.dy && a.flip == b.flip;
  }
  EXPECT_LT(same, 10) << "another epoch, other draws";
  // a 1 x 3 x 4 image: pixel (y, x) = 10 y + x
  float img[12];
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 4; ++x) img[y * 4 + x] = float(10 * y + x);
  auto at = [&](math::AugmentDraw d, int y, int x) { return math::augmented_pixel(img, 0, y, x, 3, 4, d, 1); };
  EXPECT_EQ(at({1, 1, false}, 2, 3), 23.0f);  // the centre window: the image itself
  EXPECT_EQ(at({2, 1, false}, 1, 1), 12.0f);  // shifted one right: x + 1
  EXPECT_EQ(at({2, 1, false}, 1, 3), 0.0f);   // past the edge: a padded zero
  EXPECT_EQ(at({1, 0, false}, 0, 2), 0.0f);   // shifted one up: row -1 is padding
  EXPECT_EQ(at({1, 1, true}, 0, 0), 3.0f);    // flipped
  EXPECT_EQ(at({1, 1, true}, 2, 3), 20.0f);
  // the CPU backend applies each sample's own draw, whatever its place in the batch
  auto be = make_cpu_backend(1);
  const std::uint32_t idx[2] = {17, 4};
  float two[24], out[24], one[12];
  std::copy(img, img + 12, two), std::copy(img, img + 12, two + 12);
  be->augment_images(two, idx, 2, 1, 3, 4, 9, 3, 1, out);
  be->augment_images(img, idx + 1, 1, 1, 3, 4, 9, 3, 1, one);
  EXPECT_TRUE(std::equal(one, one + 12, out + 12));
  const math::AugmentDraw d17 = math::augment_draw(9, 3, 17, 1);
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 4; ++x) EXPECT_EQ(out[y * 4 + x], at(d17, y, x));
}

TEST(ConvGeometry, OutputSizeIsZeroWhenTheKernelDoesNotFit) {
  EXPECT_EQ((math::ConvGeometry{1, 3, 3, 4, 4, 2, 0}.OH()), 0);  // 3 - 4 = -1: not 1 (-1 / 2 + 1)
  EXPECT_EQ((math::ConvGeometry{1, 3, 3, 4, 4, 2, 0}.OW()), 0);
  EXPECT_EQ((math::ConvGeometry{1, 3, 3, 4, 4, 2, 1}.OH()), 1);  // padded to 5: only offset 0 fits
  EXPECT_EQ((math::ConvGeometry{1, 28, 28, 5, 5, 2, 2}.OW()), 14);
}

// The CPU walks the column matrix in loops; the GPU computes each entry with the shared
// math::im2col_value / col2im_value. Both must give bitwise the same results.
TEST_F(CpuKernels, Im2colCol2imEqualTheSharedPerElementMathBitwise) {
  for (auto g : {math::ConvGeometry{2, 5, 6, 3, 3, 1, 1}, math::ConvGeometry{3, 7, 7, 5, 5, 2, 2},
                 math::ConvGeometry{1, 4, 4, 2, 2, 2, 0}, math::ConvGeometry{16, 14, 14, 5, 5, 2, 2},
                 math::ConvGeometry{2, 9, 8, 3, 4, 3, 1}}) {
    const int rows = g.C * g.KH * g.KW, cols = g.OH() * g.OW(), n = g.C * g.H * g.W;
    const auto x = random_vec(std::size_t(n), 17);
    const auto c = random_vec(std::size_t(rows) * cols, 18);
    for (const int B : {1, 3}) {  // a batch's matrix: (rows, B*cols), image b's columns at b*cols
      const int bc = B * cols;
      const auto x = random_vec(std::size_t(B) * n, 17);
      const auto c = random_vec(std::size_t(rows) * bc, 18);
      std::vector<float> xc(std::size_t(rows) * bc, -1.0f), cx(std::size_t(B) * n, -1.0f);
      be->im2col(x.data(), g, B, xc.data());
      be->col2im(c.data(), g, B, cx.data());
      long wrong = 0;
      for (int r = 0; r < rows; ++r)
        for (int p = 0; p < bc; ++p) {
          wrong += xc[std::size_t(r) * bc + p] != math::im2col_batch_value(x.data(), g, r, p);
          wrong += xc[std::size_t(r) * bc + p] != math::im2col_value(x.data() + std::size_t(p / cols) * n, g, r, p % cols);
        }
      for (int b = 0; b < B; ++b)
        for (int ch = 0; ch < g.C; ++ch)
          for (int h = 0; h < g.H; ++h)
            for (int w = 0; w < g.W; ++w)
              wrong += cx[std::size_t(b) * n + (std::size_t(ch) * g.H + h) * g.W + w] !=
                       math::col2im_value(c.data() + std::size_t(b) * cols, g, ch, h, w, bc);
      EXPECT_EQ(wrong, 0) << "B " << B << " C " << g.C << " H " << g.H << " W " << g.W << " K " << g.KH << "x"
                          << g.KW << " stride " << g.stride << " pad " << g.pad;
    }
  }
}

// Gathering a batch's rows (features, labels) from sample indices: what the shared math
// (which the GPU computes per word) and direct indexing say.
TEST_F(CpuKernels, GatherRowsCopiesTheIndexedRows) {
  const std::size_t rows = 50, f = 7;
  const auto x = random_vec(rows * f, 31);
  std::vector<std::int32_t> labels(rows);
  for (std::size_t r = 0; r < rows; ++r) labels[r] = std::int32_t(r * 3 + 1);
  const std::vector<std::uint32_t> idx = {4, 0, 49, 4, 17};
  std::vector<float> xb(idx.size() * f, -1.0f);
  std::vector<std::int32_t> yb(idx.size(), -1);
  be->gather_rows(x.data(), idx.data(), idx.size(), f * sizeof(float), xb.data());
  be->gather_rows(labels.data(), idx.data(), idx.size(), sizeof(std::int32_t), yb.data());
  for (std::size_t k = 0; k < idx.size(); ++k) {
    EXPECT_EQ(yb[k], labels[idx[k]]);
    for (std::size_t j = 0; j < f; ++j) {
      ASSERT_EQ(xb[k * f + j], x[idx[k] * f + j]) << k << " " << j;
      ASSERT_EQ(math::gather_source_word(idx.data(), f, k * f + j), idx[k] * f + j);
    }
  }
}

TEST_F(CpuKernels, SwapOuterSwapsTheTwoOuterDimensions) {
  const int A = 3, B = 4, N = 5;
  const auto x = random_vec(std::size_t(A) * B * N, 21);
  std::vector<float> y(x.size(), -1.0f);
  be->swap_outer(x.data(), A, B, N, y.data());
  for (int a = 0; a < A; ++a)
    for (int b = 0; b < B; ++b)
      for (int k = 0; k < N; ++k)
        ASSERT_EQ(y[(std::size_t(b) * A + a) * N + k], x[(std::size_t(a) * B + b) * N + k]) << a << " " << b << " " << k;
}

// v (B, C, HW) relaid into `to` (from the other layout): each image's two dimensions swapped.
std::vector<float> relaid(const std::vector<float>& v, int B, int C, int HW, ImageLayout to) {
  std::vector<float> out(v.size());
  const int rows = to == ImageLayout::nhwc ? C : HW, cols = to == ImageLayout::nhwc ? HW : C;
  for (int b = 0; b < B; ++b)
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        out[(std::size_t(b) * cols + c) * rows + r] = v[(std::size_t(b) * rows + r) * cols + c];
  return out;
}

// A convolution layer's forward and backward (Backend::conv_forward / conv_backward) against a
// direct convolution in double, on the CPU backend's paths: oneDNN (where built with it: its
// images in NHWC) and im2col (NCHW; image by image on 1 BLAS thread, split over a team on 2),
// on 1 and 2 threads; shapes of ResNet's and odd ones. Scratch is filled with garbage first: no
// path may read what it did not write.
TEST(CpuConvolution, ForwardAndBackwardEqualADirectConvolutionOnEveryPath) {
  for (const auto& [threads, conv] : {std::pair{1, CpuConvolutions::onednn}, {2, CpuConvolutions::onednn},
                                     {1, CpuConvolutions::im2col}, {2, CpuConvolutions::im2col}}) {
    auto be = make_cpu_backend(threads, conv);
    for (auto [g, OC] : {std::pair{math::ConvGeometry{2, 5, 6, 3, 3, 1, 1}, 3}, {math::ConvGeometry{3, 7, 7, 5, 5, 2, 2}, 4},
                         {math::ConvGeometry{1, 4, 4, 2, 2, 2, 0}, 2}, {math::ConvGeometry{4, 9, 8, 3, 4, 3, 1}, 5},
                         {math::ConvGeometry{16, 8, 8, 3, 3, 1, 1}, 16}, {math::ConvGeometry{16, 8, 8, 3, 3, 2, 1}, 32},
                         {math::ConvGeometry{16, 8, 8, 1, 1, 2, 0}, 32}, {math::ConvGeometry{1, 7, 7, 3, 3, 1, 1}, 16}}) {
      for (const int B : {0, 1, 3}) {
        const int K = g.C * g.KH * g.KW, OH = g.OH(), OW = g.OW(), N = OH * OW, n = g.C * g.H * g.W;
        const auto x = random_vec(std::size_t(B) * n, 41), W = random_vec(std::size_t(OC) * K, 42);
        const auto dy = random_vec(std::size_t(B) * OC * N, 43);
        std::vector<float> y(std::size_t(B) * OC * N, -7.0f), dW(std::size_t(OC) * K, -7.0f), dx(x.size(), -7.0f);
        std::vector<float> scratch(be->conv_scratch_floats(g, OC, B), std::nanf(""));
        const ImageLayout layout = be->image_layout();
        const bool nhwc = layout == ImageLayout::nhwc;
        const auto x_in = nhwc ? relaid(x, B, g.C, g.H * g.W, layout) : x, dy_in = nhwc ? relaid(dy, B, OC, N, layout) : dy;
        be->conv_forward(x_in.data(), W.data(), g, OC, B, y.data(), scratch.data());
        be->conv_backward(x_in.data(), W.data(), dy_in.data(), g, OC, B, dW.data(), dx.data(), scratch.data());
        if (nhwc) y = relaid(y, B, OC, N, ImageLayout::nchw), dx = relaid(dx, B, g.C, g.H * g.W, ImageLayout::nchw);
        // Direct (NCHW): y[b,o,oh,ow] = sum over (c,kh,kw) inside the image of W[o,c,kh,kw] x[b,c,ih,iw].
        std::vector<double> y_want(y.size(), 0.0), dW_want(dW.size(), 0.0), dx_want(dx.size(), 0.0);
        for (int b = 0; b < B; ++b)
          for (int o = 0; o < OC; ++o)
            for (int p = 0; p < N; ++p)
              for (int r = 0; r < K; ++r) {
                const int kw = r % g.KW, kh = r / g.KW % g.KH, c = r / (g.KW * g.KH);
                const int ih = p / OW * g.stride - g.pad + kh, iw = p % OW * g.stride - g.pad + kw;
                if (ih < 0 || iw < 0 || ih >= g.H || iw >= g.W) continue;
                const std::size_t xi = std::size_t(b) * n + (std::size_t(c) * g.H + ih) * g.W + iw;
                const std::size_t yi = (std::size_t(b) * OC + o) * N + p, wi = std::size_t(o) * K + r;
                y_want[yi] += double(W[wi]) * x[xi];
                dW_want[wi] += double(dy[yi]) * x[xi];
                dx_want[xi] += double(dy[yi]) * W[wi];
              }
        const std::string what = be->describe() + ", B " + std::to_string(B) + ", C " +
                                 std::to_string(g.C) + ", K " + std::to_string(g.KH) + "x" + std::to_string(g.KW) +
                                 ", stride " + std::to_string(g.stride);
        EXPECT_EQ(count_wrong(y, y_want, 1e-4), 0) << "forward, " << what;
        EXPECT_EQ(count_wrong(dW, dW_want, 1e-4), 0) << "weight gradient, " << what;
        EXPECT_EQ(count_wrong(dx, dx_want, 1e-4), 0) << "input gradient, " << what;
      }
    }
  }
  set_cpu_backend_threads(1);
}

// The CPU backend on oneDNN holds images in NHWC: its batch norm (training and inference
// forward, backward) and mean pool equal the NCHW backend's on the same images relaid, on 1 and
// 2 threads (bitwise the same on both: the sums in image order); relayout_images is the
// transposition of each image, and its inverse.
// The backend's batch-norm loops are cloned for AVX-512 and AVX2 and picked by the CPU: each
// clone must give the values of the plain scalar arithmetic (math::bn_forward_value, here
// compiled for any x86-64), bitwise: no contraction into fused multiply-adds.
TEST(CpuImages, BatchNormIsThePlainArithmeticBitwiseOnEveryCpu) {
  for (const CpuConvolutions conv : {CpuConvolutions::onednn, CpuConvolutions::im2col}) {
    auto be = make_cpu_backend(1, conv);
    const int B = 3, C = 6, HW = 37;
    const std::size_t n = std::size_t(B) * C * HW;
    const auto x = random_vec(n, 61, 3.0);
    std::vector<float> gamma(C), beta(C);
    for (int c = 0; c < C; ++c) gamma[c] = 0.7f + 0.13f * float(c), beta[c] = 0.3f - 0.11f * float(c);
    for (const bool training : {true, false}) {
      std::vector<float> y(n), mean(C), invstd(C), running_mean(C, 0.2f), running_var(C, 1.7f);
      be->batch_norm_forward(x.data(), B, C, HW, gamma.data(), beta.data(), training, 0.1f, 1e-5f, running_mean.data(),
                             running_var.data(), mean.data(), invstd.data(), y.data());
      if (!training)
        for (int c = 0; c < C; ++c) {
          const math::BnChannel s = math::bn_running_channel(running_mean[c], running_var[c], 1e-5f);
          mean[c] = s.mean, invstd[c] = s.invstd;
        }
      const bool nhwc = be->image_layout() == ImageLayout::nhwc;
      long differ = 0;
      for (int b = 0; b < B; ++b)
        for (int c = 0; c < C; ++c)
          for (int k = 0; k < HW; ++k) {
            const std::size_t at = nhwc ? (std::size_t(b) * HW + k) * C + c : (std::size_t(b) * C + c) * HW + k;
            differ += y[at] != math::bn_forward_value(x[at], math::BnChannel{mean[c], invstd[c]}, gamma[c], beta[c]);
          }
      EXPECT_EQ(differ, 0) << (training ? "training" : "inference") << ", " << be->describe();
    }
  }
}

// Batch norm of channels whose mean is 100-3000 times their spread (raw pixel values, an input
// not normalised): the batch's statistics, y and the gradients against double arithmetic, in
// NCHW and NHWC. The float lanes' Σ x^2 of raw values lost the variance (y off by 0.05, dx by 3x
// this bound); summed from a pivot they keep it.
TEST(CpuImages, BatchNormKeepsTheVarianceOfChannelsFarFromZero) {
  const int B = 8, C = 3, HW = 196, n = B * HW;
  const float offset[C] = {1000.0f, -300.0f, 3000.0f}, spread[C] = {1.0f, 0.5f, 2.0f};
  const auto noise = random_vec(std::size_t(B) * C * HW, 71), dy = random_vec(std::size_t(B) * C * HW, 72);
  std::vector<float> x(noise.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = offset[i / HW % C] + spread[i / HW % C] * noise[i];
  const std::vector<float> gamma = {0.8f, 1.1f, 1.3f}, beta = {0.1f, -0.2f, 0.0f};
  // The reference, in double: statistics, y, dgamma, dbeta, dx (NCHW).
  std::vector<double> mean(C), invstd(C), y(x.size()), dgamma(C), dbeta(C), dx(x.size());
  for (int c = 0; c < C; ++c) {
    double s = 0, ss = 0;
    for (int b = 0; b < B; ++b)
      for (int k = 0; k < HW; ++k) s += x[(std::size_t(b) * C + c) * HW + k];
    mean[c] = s / n;
    for (int b = 0; b < B; ++b)
      for (int k = 0; k < HW; ++k) ss += std::pow(x[(std::size_t(b) * C + c) * HW + k] - mean[c], 2);
    invstd[c] = 1.0 / std::sqrt(ss / n + 1e-5);
    for (int b = 0; b < B; ++b)
      for (int k = 0; k < HW; ++k) {
        const std::size_t at = (std::size_t(b) * C + c) * HW + k;
        const double xhat = (x[at] - mean[c]) * invstd[c];
        y[at] = gamma[c] * xhat + beta[c], dgamma[c] += dy[at] * xhat, dbeta[c] += dy[at];
      }
    for (int b = 0; b < B; ++b)
      for (int k = 0; k < HW; ++k) {
        const std::size_t at = (std::size_t(b) * C + c) * HW + k;
        const double xhat = (x[at] - mean[c]) * invstd[c];
        dx[at] = gamma[c] * invstd[c] * (dy[at] - dbeta[c] / n - xhat * dgamma[c] / n);
      }
  }
  for (const CpuConvolutions conv : {CpuConvolutions::im2col, CpuConvolutions::onednn}) {
    auto be = make_cpu_backend(1, conv);
    SCOPED_TRACE(be->describe());
    const bool nhwc = be->image_layout() == ImageLayout::nhwc;
    auto there = [&](const std::vector<float>& v) { return nhwc ? relaid(v, B, C, HW, ImageLayout::nhwc) : v; };
    auto back = [&](const std::vector<float>& v) { return nhwc ? relaid(v, B, C, HW, ImageLayout::nchw) : v; };
    const auto bx = there(x), bdy = there(dy);
    std::vector<float> got_y(x.size()), saved(2 * C), running(2 * C, 1.0f), dgb(2 * C), got_dx(x.size());
    be->batch_norm_forward(bx.data(), B, C, HW, gamma.data(), beta.data(), true, 0.1f, 1e-5f, running.data(),
                           running.data() + C, saved.data(), saved.data() + C, got_y.data());
    be->batch_norm_backward(bx.data(), bdy.data(), B, C, HW, gamma.data(), saved.data(), saved.data() + C, dgb.data(),
                            dgb.data() + C, got_dx.data());
    got_y = back(got_y), got_dx = back(got_dx);
    for (int c = 0; c < C; ++c) {
      SCOPED_TRACE("channel " + std::to_string(c));
      EXPECT_NEAR(saved[std::size_t(c)], mean[c], 1e-6 * std::abs(mean[c]));
      EXPECT_NEAR(saved[std::size_t(C + c)], invstd[c], 1e-3 * invstd[c]);
      EXPECT_NEAR(dgb[std::size_t(c)], dgamma[c], 1e-3 * std::max(1.0, std::abs(dgamma[c])));
      EXPECT_NEAR(dgb[std::size_t(C + c)], dbeta[c], 1e-4 * std::max(1.0, std::abs(dbeta[c])));
    }
    double y_err = 0, dx_err = 0, dx_max = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      y_err = std::max(y_err, std::abs(got_y[i] - y[i])), dx_err = std::max(dx_err, std::abs(got_dx[i] - dx[i])),
      dx_max = std::max(dx_max, std::abs(dx[i]));
    EXPECT_LT(y_err, 2e-3);
    EXPECT_LT(dx_err, 1e-3 * dx_max);
  }
}

TEST(CpuImages, NhwcBatchNormMeanPoolAndRelayoutEqualNchws) {
  for (const int threads : {1, 2}) {
    auto nhwc = make_cpu_backend(threads), nchw = make_cpu_backend(threads, CpuConvolutions::im2col);
    if (nhwc->image_layout() != ImageLayout::nhwc) GTEST_SKIP() << "built without oneDNN: " << nhwc->describe();
    for (auto [B, C, HW] : {std::tuple{3, 5, 7}, {4, 16, 49}, {2, 70, 9}, {5, 1, 4}}) {
      const std::string what = std::to_string(threads) + " thread(s), B " + std::to_string(B) + ", C " + std::to_string(C) +
                               ", HW " + std::to_string(HW);
      const std::size_t n = std::size_t(B) * C * HW;
      const auto x = random_vec(n, 51, 2.0), dy = random_vec(n, 52);
      std::vector<float> gamma(C), beta(C);
      for (int c = 0; c < C; ++c) gamma[c] = 0.5f + 0.1f * float(c % 7), beta[c] = 0.05f * float(c % 5) - 0.1f;
      std::vector<float> out[2][6];  // y, saved (mean, invstd), running (mean, var), inference y, dgamma|dbeta, dx
      for (int k = 0; k < 2; ++k) {
        Backend& be = k == 0 ? *nchw : *nhwc;
        const auto bx = k ? relaid(x, B, C, HW, ImageLayout::nhwc) : x, bdy = k ? relaid(dy, B, C, HW, ImageLayout::nhwc) : dy;
        std::vector<float> y(n), saved(2 * C), running(2 * C, 1.0f), yi(n), dgb(2 * C), dx(n);
        std::fill_n(running.begin(), C, 0.25f);
        be.batch_norm_forward(bx.data(), B, C, HW, gamma.data(), beta.data(), true, 0.1f, 1e-5f, running.data(),
                              running.data() + C, saved.data(), saved.data() + C, y.data());
        be.batch_norm_backward(bx.data(), bdy.data(), B, C, HW, gamma.data(), saved.data(), saved.data() + C, dgb.data(),
                               dgb.data() + C, dx.data());
        be.batch_norm_forward(bx.data(), B, C, HW, gamma.data(), beta.data(), false, 0.1f, 1e-5f, running.data(),
                              running.data() + C, nullptr, nullptr, yi.data());
        if (k) y = relaid(y, B, C, HW, ImageLayout::nchw), yi = relaid(yi, B, C, HW, ImageLayout::nchw), dx = relaid(dx, B, C, HW, ImageLayout::nchw);
        out[k][0] = y, out[k][1] = saved, out[k][2] = running, out[k][3] = yi, out[k][4] = dgb, out[k][5] = dx;
      }
      const char* names[] = {"training y", "saved mean, invstd", "running mean, variance", "inference y", "dgamma, dbeta", "dx"};
      for (int i = 0; i < 6; ++i) {
        const std::vector<double> want(out[0][i].begin(), out[0][i].end());
        EXPECT_EQ(count_wrong(out[1][i], want, 1e-5), 0) << names[i] << ", " << what;
      }
      // Mean pool: y (B, C) and its gradient, against the per-channel means of the NCHW images.
      std::vector<float> pooled(std::size_t(B) * C), dpool(n);
      const auto x_nhwc = relaid(x, B, C, HW, ImageLayout::nhwc);
      nhwc->mean_pool_nhwc(x_nhwc.data(), B, C, HW, pooled.data());
      std::vector<double> pooled_want(pooled.size()), dpool_want(n);
      for (std::size_t i = 0; i < pooled.size(); ++i)
        for (int k = 0; k < HW; ++k) pooled_want[i] += double(x[i * HW + k]) / HW, dpool_want[i * HW + k] = double(dy[i]) / HW;
      nhwc->mean_pool_nhwc_backward(dy.data(), B, C, HW, dpool.data());
      EXPECT_EQ(count_wrong(pooled, pooled_want, 1e-5), 0) << "mean pool, " << what;
      EXPECT_EQ(count_wrong(relaid(dpool, B, C, HW, ImageLayout::nchw), dpool_want, 1e-6), 0) << "mean pool gradient, " << what;
      // relayout_images: the transposition, both ways.
      std::vector<float> there(n), back(n);
      nhwc->relayout_images(x.data(), B, C, HW, ImageLayout::nhwc, there.data());
      nhwc->relayout_images(there.data(), B, C, HW, ImageLayout::nchw, back.data());
      EXPECT_EQ(there, x_nhwc) << what;
      EXPECT_EQ(back, x) << what;
    }
  }
  set_cpu_backend_threads(1);
}

TEST_F(CpuKernels, DeviceBufferOwnsAndMoves) {
  DeviceBuffer<float> a(*be, 10);
  be->fill(a.data(), 10, 2.5f);
  DeviceBuffer<float> b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.size(), 10u);
  float host[10];
  be->copy_to_host(host, b.data(), b.bytes());
  for (float v : host) EXPECT_EQ(v, 2.5f);
}

}  // namespace

// A program's live scalars (math::Program::live) are read when it runs, not when it was written:
// what a step graph replays with each step's learning rate.
TEST_F(CpuKernels, ProgramsReadTheirLiveScalarsWhenTheyRun) {
  using math::OpCode;
  math::Program p;
  p.arrays = 3;  // x, y, out = x + live[1] y, then × live[0]
  p.op(OpCode::axpby, 2, 0, 1, 1.0f, math::Scalar::live(1)).op(OpCode::scale, 2, 2, 0, math::Scalar::live(0));
  std::vector<float> x = {1.0f, 2.0f, 3.0f}, y = {10.0f, 20.0f, 30.0f}, out(3), live = {2.0f, 0.5f, 0.0f, 0.0f};
  float* arrays[] = {x.data(), y.data(), out.data()};
  EXPECT_THROW(be->run(p, arrays, 3), std::logic_error) << "live scalars without live memory";
  p.live = live.data();
  be->run(p, arrays, 3);
  EXPECT_EQ(out, (std::vector<float>{12.0f, 24.0f, 36.0f}));
  const float next[] = {-1.0f, 0.25f};
  be->write_scalars(live.data(), next, 2);
  be->run(p, arrays, 3);
  EXPECT_EQ(out, (std::vector<float>{-3.5f, -7.0f, -10.5f})) << "the values written since";
  EXPECT_THROW(p.op(OpCode::scale, 2, 2, 0, math::Scalar::live(math::Program::kMaxLive)), std::logic_error);
  EXPECT_THROW(be->write_scalars(live.data(), next, Backend::kMaxScalarWrite + 1), std::logic_error);
}
