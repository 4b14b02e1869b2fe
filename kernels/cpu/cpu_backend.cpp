// CPU backend: OpenBLAS for matrix products, plain loops over kernels/elementwise.h for the rest.
#include <cblas.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"
#include "thread_team.h"
#ifdef PSLAB_HAVE_ONEDNN
#include "onednn_conv.h"
#endif

namespace pslab {
namespace {

CBLAS_TRANSPOSE cblas_trans(Trans t) { return t == Trans::yes ? CblasTrans : CblasNoTrans; }

blasint blas_int(std::size_t n) {
  if (n > std::size_t(std::numeric_limits<blasint>::max()))
    throw std::length_error("vector of " + std::to_string(n) + " floats is too long for BLAS");
  return blasint(n);
}

// One op of an element-wise program over m elements of its registers: math::apply_op with the
// op's code fixed, so that the switch is out of the loop and the loop vectorizes.
template <math::OpCode C>
void op_loop(const math::Op& op, float* d, const float* x, const float* y, std::size_t m) {
  const math::Op fixed{C, 0, 0, 0, op.a, op.b, -1, -1};  // (op resolved: its live scalars read)
  for (std::size_t i = 0; i < m; ++i) d[i] = math::apply_op(fixed, x[i], y[i]);
}

void run_op(const math::Op& op, float* const* reg, std::size_t m) {
  float* d = reg[op.dst];
  const float* x = reg[op.x];
  const float* y = reg[op.y];
  using math::OpCode;
  switch (op.code) {
    case OpCode::axpby: return op_loop<OpCode::axpby>(op, d, x, y, m);
    case OpCode::mul: return op_loop<OpCode::mul>(op, d, x, y, m);
    case OpCode::div: return op_loop<OpCode::div>(op, d, x, y, m);
    case OpCode::sqrt: return op_loop<OpCode::sqrt>(op, d, x, y, m);
    case OpCode::add_scalar: return op_loop<OpCode::add_scalar>(op, d, x, y, m);
    case OpCode::scale: return op_loop<OpCode::scale>(op, d, x, y, m);
    case OpCode::div_scalar: return op_loop<OpCode::div_scalar>(op, d, x, y, m);
  }
}

// Batch norm's loops over one channel's plane of one image (n values), cloned for AVX-512 and
// AVX2 (picked at load by the CPU's features, not its model name, which a VM hides; the build
// itself is for any x86-64, where SSE's 4 floats a step bind these loops). Each clone gives
// bitwise the others' values (no contraction into FMAs).
#define PSLAB_CLONED [[gnu::target_clones("avx512f", "avx2", "default")]]
// s1 = Σ a[i], s2 = Σ a[i] b[i] (s1, s2 start at zero): in 16 float lanes (a double chain
// would run one value per add's latency), each lane over at most n / 16 values, then added in
// double. The lanes sum u = a - pa and u (b - pb), each from a pivot (a value of the plane), and
// the raw sums are made from them in double: a channel whose mean is far from zero against its
// spread (|mean| / std of 100 and more: raw pixels, an un-normalised input) would lose its
// variance to the float lanes' rounding of Σ x^2. Either pa = 0 (backward: a = dy) or a is b and
// pa = pb (forward).
PSLAB_CLONED void bn_plane_sums(const float* a, const float* b, int n, float pa, float pb, double& s1, double& s2) {
  constexpr int kLanes = 16;
  float l1[kLanes] = {}, l2[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float u = a[i + l] - pa;
      l1[l] += u, l2[l] += u * (b[i + l] - pb);
    }
  for (; i < n; ++i) {
    const float u = a[i] - pa;
    s1 += u, s2 += double(u) * (b[i] - pb);
  }
  for (int l = 0; l < kLanes; ++l) s1 += l1[l], s2 += l2[l];
  // Σ a b = Σ u v + pb Σ u + pa Σ v + n pa pb, and Σ v = Σ u where pa is not 0.
  s2 += (double(pa) + pb) * s1 + double(n) * pa * pb;
  s1 += double(n) * pa;
}
PSLAB_CLONED void bn_plane_forward(const float* x, int n, math::BnChannel s, float gamma, float beta, float* y) {
  for (int i = 0; i < n; ++i) y[i] = math::bn_forward_value(x[i], s, gamma, beta);
}
PSLAB_CLONED void bn_plane_backward(const float* dy, const float* x, int n, math::BnBackward k, float* dx) {
  for (int i = 0; i < n; ++i) dx[i] = math::bn_backward_value(dy[i], x[i], k);
}
// The same in NHWC: `rows` pixels of C channels each, a channel's coefficients in arrays (C).
// s1[c] = Σ a[r, c], s2[c] = Σ a[r, c] b[r, c] (s1, s2 start at zero): float sums over blocks
// of 16 rows (vectors along the channels), each block's added in double; from pivots as
// bn_plane_sums (pa, pb: C values each, pa null for zeros).
PSLAB_CLONED void bn_rows_sums(const float* a, const float* b, int rows, int C, const float* pa, const float* pb,
                               double* s1, double* s2) {
  constexpr int kChannels = 64, kRows = 16;
  for (int c0 = 0; c0 < C; c0 += kChannels) {
    const int n = std::min(kChannels, C - c0);
    float qa[kChannels] = {}, qb[kChannels];
    for (int c = 0; c < n; ++c) qa[c] = pa ? pa[c0 + c] : 0.0f, qb[c] = pb[c0 + c];
    for (int r0 = 0; r0 < rows; r0 += kRows) {
      float l1[kChannels] = {}, l2[kChannels] = {};
      for (int r = r0; r < std::min(rows, r0 + kRows); ++r) {
        const float *ar = a + std::size_t(r) * C + c0, *br = b + std::size_t(r) * C + c0;
        for (int c = 0; c < n; ++c) {
          const float u = ar[c] - qa[c];
          l1[c] += u, l2[c] += u * (br[c] - qb[c]);
        }
      }
      for (int c = 0; c < n; ++c) s1[c0 + c] += l1[c], s2[c0 + c] += l2[c];
    }
    for (int c = 0; c < n; ++c) {
      s2[c0 + c] += (double(qa[c]) + qb[c]) * s1[c0 + c] + double(rows) * qa[c] * qb[c];
      s1[c0 + c] += double(rows) * qa[c];
    }
  }
}
// y = gamma ((x - mean) invstd) + beta (math::bn_forward_value, channel by channel).
PSLAB_CLONED void bn_rows_forward(const float* x, int rows, int C, const float* mean, const float* invstd,
                                  const float* gamma, const float* beta, float* y) {
  for (int r = 0; r < rows; ++r, x += C, y += C)
    for (int c = 0; c < C; ++c) y[c] = gamma[c] * ((x[c] - mean[c]) * invstd[c]) + beta[c];
}
// dx = a dy + b x + c (math::bn_backward_value, channel by channel).
PSLAB_CLONED void bn_rows_backward(const float* dy, const float* x, int rows, int C, const float* ka, const float* kb,
                                   const float* kc, float* dx) {
  for (int r = 0; r < rows; ++r, dy += C, x += C, dx += C)
    for (int c = 0; c < C; ++c) dx[c] = ka[c] * dy[c] + kb[c] * x[c] + kc[c];
}
#undef PSLAB_CLONED

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, CpuConvolutions conv) {
    if (threads > 0) set_cpu_backend_threads(threads);
#ifdef PSLAB_HAVE_ONEDNN
    if (conv == CpuConvolutions::onednn) onednn_ = std::make_unique<OnednnConvolutions>();
#else
    (void)conv;
#endif
  }

  Device device() const override { return Device::cpu; }
  std::string describe() const override {
    return "cpu (" + std::string(openblas_get_config()) + ", " + std::to_string(openblas_get_num_threads()) +
           " BLAS threads, convolutions " + (onednn_ ? "on oneDNN, images in NHWC" : "by im2col") + ")";
  }
  ImageLayout image_layout() const override { return onednn_ ? ImageLayout::nhwc : ImageLayout::nchw; }

  void* allocate(std::size_t bytes) override {
    // 64-byte alignment: whole cache lines, and what AVX-512 loads like.
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* p) noexcept override { std::free(p); }
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void fill(float* x, std::size_t n, float value) override {
    for (std::size_t i = 0; i < n; ++i) x[i] = value;
  }
  void synchronize() override {}

  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    if (M == 0 || N == 0) return;
    if (openblas_get_num_threads() > 1) blas_threads_awake_ = true;  // (1 on a team member)
    cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), M, N, K, alpha, A, lda, B,
                ldb, beta, C, ldc);
  }
  // Long vectors on the threads that are awake: right after a GEMM OpenBLAS's own, still
  // spinning (its saxpy spreads over them; waking the team there would put three threads on
  // two cores: MLP step 0.93x), else the team (an OpenBLAS saxpy would wake its threads, which
  // then spin beside the team's and oneDNN's: ResNet-8 step 0.83x).
  void axpy(std::size_t n, float a, const float* x, float* y) override {
    if (blas_threads_awake_) return cblas_saxpy(blas_int(n), a, x, 1, y, 1);
    split_floats(n, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) y[i] += a * x[i];
    });
  }
  void scale(std::size_t n, float a, float* x) override {
    for (std::size_t i = 0; i < n; ++i) x[i] *= a;
  }
  double sum_squares(const float* x, std::size_t n) override {
    double s = 0.0;
    for (std::size_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
    return s;
  }

  void add_bias(float* y, const float* bias, int outer, int channels, int inner) override {
    if (inner == 1) {  // a Linear layer: add the bias vector to every row (vectorises)
      for (int o = 0; o < outer; ++o) {
        float* row = y + std::size_t(o) * channels;
        for (int c = 0; c < channels; ++c) row[c] += bias[c];
      }
      return;
    }
    for (int o = 0; o < outer; ++o)
      for (int c = 0; c < channels; ++c) {
        float* row = y + (std::size_t(o) * channels + c) * inner;
        const float b = bias[c];
        for (int i = 0; i < inner; ++i) row[i] += b;
      }
  }
  void bias_grad(const float* dy, int outer, int channels, int inner, float* db) override {
    for (int c = 0; c < channels; ++c) db[c] = 0.0f;
    if (inner == 1) {  // a Linear layer: sum the rows (vectorises)
      for (int o = 0; o < outer; ++o) {
        const float* row = dy + std::size_t(o) * channels;
        for (int c = 0; c < channels; ++c) db[c] += row[c];
      }
      return;
    }
    for (int o = 0; o < outer; ++o)
      for (int c = 0; c < channels; ++c) {
        const float* row = dy + (std::size_t(o) * channels + c) * inner;
        float s = 0.0f;
        for (int i = 0; i < inner; ++i) s += row[i];
        db[c] += s;
      }
  }
  void relu_forward(const float* x, float* y, std::size_t n) override {
    split_floats(n, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) y[i] = math::relu(x[i]);
    });
  }
  void relu_backward(const float* dy, const float* y, float* dx, std::size_t n) override {
    split_floats(n, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) dx[i] = math::relu_grad(dy[i], y[i]);
    });
  }

  // Image by image in memory order, every pass (channel by channel, each plane is a jump of an
  // image: the prefetcher starts over at every one; in NHWC pixel by pixel, vectors along the
  // channels), images split over the BLAS threads' team; a channel's sums add the images'
  // partial sums in image order (channel_sums): bitwise the same on any number of threads.
  void batch_norm_forward(const float* x, int B, int C, int HW, const float* gamma, const float* beta, bool training,
                          float momentum, float eps, float* running_mean, float* running_var, float* saved_mean,
                          float* saved_invstd, float* y) override {
    bn_channels_.resize(std::size_t(C));
    if (training) channel_sums(x, x, true, B, C, HW);
    for (int c = 0; c < C; ++c) {
      if (!training) {
        bn_channels_[std::size_t(c)] = math::bn_running_channel(running_mean[c], running_var[c], eps);
        continue;
      }
      const math::BnChannel s = math::bn_batch_channel(sums_[2 * std::size_t(c)], sums_[2 * std::size_t(c) + 1], double(B) * HW,
                                                       eps, momentum, running_mean + c, running_var + c);
      saved_mean[c] = s.mean, saved_invstd[c] = s.invstd, bn_channels_[std::size_t(c)] = s;
    }
    if (image_layout() == ImageLayout::nhwc) {
      float *mean = rows_coefficients(C, 2), *invstd = mean + C;
      for (int c = 0; c < C; ++c) mean[c] = bn_channels_[std::size_t(c)].mean, invstd[c] = bn_channels_[std::size_t(c)].invstd;
      return in_parallel(image_members(B), B, [&](int, int lo, int hi) {
        const std::size_t at = std::size_t(lo) * C * HW;
        bn_rows_forward(x + at, (hi - lo) * HW, C, mean, invstd, gamma, beta, y + at);
      });
    }
    in_parallel(image_members(B), B, [&](int, int lo, int hi) {
      for (std::size_t at = std::size_t(lo) * C * HW, b = std::size_t(lo); b < std::size_t(hi); ++b)
        for (int c = 0; c < C; ++c, at += std::size_t(HW)) bn_plane_forward(x + at, HW, bn_channels_[std::size_t(c)], gamma[c], beta[c], y + at);
    });
  }
  void batch_norm_backward(const float* x, const float* dy, int B, int C, int HW, const float* gamma,
                           const float* saved_mean, const float* saved_invstd, float* dgamma, float* dbeta,
                           float* dx) override {
    bn_backward_.resize(std::size_t(C));
    channel_sums(dy, x, false, B, C, HW);
    for (int c = 0; c < C; ++c) {
      const math::BnBackward k = math::bn_backward_channel(sums_[2 * std::size_t(c)], sums_[2 * std::size_t(c) + 1], double(B) * HW,
                                                           {saved_mean[c], saved_invstd[c]}, gamma[c]);
      dgamma[c] = k.dgamma, dbeta[c] = k.dbeta, bn_backward_[std::size_t(c)] = k;
    }
    if (!dx) return;
    if (image_layout() == ImageLayout::nhwc) {
      float *ka = rows_coefficients(C, 3), *kb = ka + C, *kc = kb + C;
      for (int c = 0; c < C; ++c) {
        const math::BnBackward& k = bn_backward_[std::size_t(c)];
        ka[c] = k.a, kb[c] = k.b, kc[c] = k.c;
      }
      return in_parallel(image_members(B), B, [&](int, int lo, int hi) {
        const std::size_t at = std::size_t(lo) * C * HW;
        bn_rows_backward(dy + at, x + at, (hi - lo) * HW, C, ka, kb, kc, dx + at);
      });
    }
    in_parallel(image_members(B), B, [&](int, int lo, int hi) {
      for (std::size_t at = std::size_t(lo) * C * HW, b = std::size_t(lo); b < std::size_t(hi); ++b)
        for (int c = 0; c < C; ++c, at += std::size_t(HW)) bn_plane_backward(dy + at, x + at, HW, bn_backward_[std::size_t(c)], dx + at);
    });
  }

  double softmax_xent(const float* logits, const std::int32_t* labels, int rows, int C,
                      float grad_scale, float* dlogits) override {
    int bad_rows = 0;  // (as the GPU's: a label outside [0, C) is refused, not read past its row)
    for (int r = 0; r < rows; ++r) bad_rows += labels[r] < 0 || labels[r] >= C;
    if (bad_rows != 0)
      throw std::invalid_argument("softmax_xent: " + std::to_string(bad_rows) + " of " + std::to_string(rows) +
                                  " labels lie outside [0, " + std::to_string(C) + ")");
    double loss = 0.0;
    for (int r = 0; r < rows; ++r)
      loss += math::softmax_xent_row(logits + std::size_t(r) * C, C, labels[r],
                                     dlogits + std::size_t(r) * C, grad_scale);
    return loss;
  }
  double mse(const float* y, const float* t, int rows, int C, float grad_scale,
             float* dy) override {
    double loss = 0.0;
    for (int r = 0; r < rows; ++r)
      loss += math::mse_row(y + std::size_t(r) * C, t + std::size_t(r) * C, C,
                            dy + std::size_t(r) * C, grad_scale);
    return loss;
  }
  long count_correct(const float* logits, const std::int32_t* labels, int rows,
                     int C) override {
    long n = 0;
    for (int r = 0; r < rows; ++r) n += math::argmax_row(logits + std::size_t(r) * C, C) == labels[r];
    return n;
  }

  // In blocks of kBlock elements, each op over the block in turn (the block's registers stay in
  // L1, and each op's loop vectorizes); the arithmetic is math::apply_op, as on the GPU.
  // Live scalars are read once, as the call begins.
  void run(const math::Program& p, float* const* arrays, std::size_t n) override {
    p.check_live();
    math::Op ops[math::Program::kMaxOps];
    for (int o = 0; o < p.n_ops; ++o) ops[o] = math::resolved(p.ops[o], p.live);
    constexpr std::size_t kBlock = 256;
    alignas(64) float temps[math::Program::kMaxRegisters][kBlock];
    float* reg[math::Program::kMaxRegisters];
    for (std::size_t lo = 0; lo < n; lo += kBlock) {
      const std::size_t m = std::min(kBlock, n - lo);
      for (int k = 0; k < math::Program::kMaxRegisters; ++k) reg[k] = k < p.arrays ? arrays[k] + lo : temps[k];
      for (int o = 0; o < p.n_ops; ++o) run_op(ops[o], reg, m);
    }
  }

  // im2col and col2im walk the column matrix in order, row (c, kh, kw) by row, with no
  // per-element index division: the same values as math::im2col_value / col2im_value (what
  // the GPU computes per element), bitwise; col2im adds each pixel's terms in the same order.
  void im2col(const float* x, const math::ConvGeometry& g, int B, float* cols) override {
    walk_columns(g, B, x, cols, [](float& col, const float* px) { col = *px; }, [](float& col) { col = 0.0f; });
  }
  void col2im(const float* cols, const math::ConvGeometry& g, int B, float* dx) override {
    std::fill(dx, dx + std::size_t(B) * g.C * g.H * g.W, 0.0f);
    walk_columns(g, B, dx, cols, [](const float& col, float* px) { *px += col; }, [](const float&) {});
  }
  void gather_rows(const void* src, const std::uint32_t* idx, std::size_t n, std::size_t row_bytes,
                   void* dst) override {
    const auto* s = static_cast<const std::byte*>(src);
    auto* d = static_cast<std::byte*>(dst);
    for (std::size_t k = 0; k < n; ++k) std::memcpy(d + k * row_bytes, s + std::size_t(idx[k]) * row_bytes, row_bytes);
  }
  void augment_images(const float* src, const std::uint32_t* idx, std::size_t n, int C, int H, int W, std::uint64_t seed,
                      std::uint64_t epoch, int pad, float* dst) override {
    const std::size_t image = std::size_t(C) * H * W;
    for (std::size_t k = 0; k < n; ++k) {
      const math::AugmentDraw d = math::augment_draw(seed, epoch, idx[k], pad);
      const float* img = src + k * image;
      float* out = dst + k * image;
      for (int c = 0; c < C; ++c)
        for (int y = 0; y < H; ++y)
          for (int x = 0; x < W; ++x) *out++ = math::augmented_pixel(img, c, y, x, H, W, d, pad);
    }
  }
  void swap_outer(const float* x, int A, int B, int N, float* y) override {
    for (int a = 0; a < A; ++a)
      for (int b = 0; b < B; ++b)
        std::memcpy(y + (std::size_t(b) * A + a) * N, x + (std::size_t(a) * B + b) * N, std::size_t(N) * sizeof(float));
  }
  // Each image's (rows, cols) transposed, images split over the team.
  void relayout_images(const float* x, int B, int C, int HW, ImageLayout to, float* y) override {
    const int rows = to == ImageLayout::nhwc ? C : HW, cols = to == ImageLayout::nhwc ? HW : C;
    const std::size_t image = std::size_t(C) * HW;
    in_parallel(image_members(B), B, [&](int, int lo, int hi) {
      for (std::size_t b = std::size_t(lo); b < std::size_t(hi); ++b)
        for (int r = 0; r < rows; ++r)
          for (int c = 0; c < cols; ++c) y[b * image + std::size_t(c) * rows + r] = x[b * image + std::size_t(r) * cols + c];
    });
  }
  // (The sum over the pixels in float, then scaled: as the NCHW GEMM against ones.)
  void mean_pool_nhwc(const float* x, int B, int C, int HW, float* y) override {
    const float scale = 1.0f / float(HW);
    for (std::size_t b = 0; b < std::size_t(B); ++b) {
      float* yb = y + b * C;
      std::fill_n(yb, C, 0.0f);
      for (const float *px = x + b * C * HW, *end = px + std::size_t(C) * HW; px != end; px += C)
        for (int c = 0; c < C; ++c) yb[c] += px[c];
      for (int c = 0; c < C; ++c) yb[c] *= scale;
    }
  }
  void mean_pool_nhwc_backward(const float* dy, int B, int C, int HW, float* dx) override {
    const float scale = 1.0f / float(HW);
    for (std::size_t b = 0; b < std::size_t(B); ++b)
      for (std::size_t r = 0; r < std::size_t(HW); ++r)
        for (int c = 0; c < C; ++c) dx[(b * HW + r) * C + c] = dy[b * C + c] * scale;
  }

  // With oneDNN, its kernels on NHWC images (onednn_conv.h), on as many threads; no scratch.
  // Otherwise image by image: one image's columns (C*KH*KW, OH*OW) stay in the cache between
  // im2col and its GEMMs, where the whole batch's (5 MB for the small CNN's second layer at batch
  // 64) would go through memory five times (1.08x the whole-batch step on 1 core; 2.4x for
  // ResNet-8's 16-channel 3x3 convolutions on 2 cores). With more BLAS threads the images are
  // split over a team of that many threads, each running its images' GEMMs on one BLAS thread: a
  // forward and an input gradient are bitwise those of one thread; dW adds the members' sums in
  // member order. scratch (conv_scratch_floats): the images' columns one after another (B blocks
  // of (K, N)), then (OC, B*N), of which the members beyond the first keep their dW sums.
  std::size_t conv_scratch_floats(const math::ConvGeometry& g, int OC, int B) override {
    return onednn_ ? 0 : im2col_scratch_floats(g, OC, B);
  }
  void conv_forward(const float* x, const float* W, const math::ConvGeometry& g, int OC, int B, float* y,
                    float* scratch) override {
    if (onednn_) blas_threads_awake_ = false;
    if (onednn_) return B > 0 ? onednn_->forward(x, W, g, OC, B, onednn_threads(g, OC, B), y) : void();
    const int K = g.C * g.KH * g.KW, N = g.OH() * g.OW();
    in_parallel(team_size(K, B, N), B, [&](int, int lo, int hi) {
      for (int b = lo; b < hi; ++b) {
        float* cols = scratch + std::size_t(b) * K * N;
        im2col(x + std::size_t(b) * g.C * g.H * g.W, g, 1, cols);
        gemm(Trans::no, Trans::no, OC, N, K, 1.0f, W, K, cols, N, 0.0f, y + std::size_t(b) * OC * N, N);
      }
    });
  }
  void conv_backward(const float* x, const float* W, const float* dy, const math::ConvGeometry& g, int OC, int B,
                     float* dW, float* dx, float* scratch) override {
    if (onednn_) blas_threads_awake_ = false;
    if (onednn_ && B > 0) return onednn_->backward(x, W, dy, g, OC, B, onednn_threads(g, OC, B), dW, dx);
    const int K = g.C * g.KH * g.KW, N = g.OH() * g.OW();
    const std::size_t dW_floats = std::size_t(OC) * K;
    float* sums = scratch + std::size_t(B) * K * N;  // members 1, 2, ...: their dW
    const int members = team_size(K, B, N);
    in_parallel(members, B, [&](int m, int lo, int hi) {
      float* dWm = m == 0 ? dW : sums + std::size_t(m - 1) * dW_floats;
      if (lo == hi) std::fill_n(dWm, dW_floats, 0.0f);
      for (int b = lo; b < hi; ++b) {
        float* cols = scratch + std::size_t(b) * K * N;
        const float* dyb = dy + std::size_t(b) * OC * N;
        gemm(Trans::no, Trans::yes, OC, K, N, 1.0f, dyb, N, cols, N, b == lo ? 0.0f : 1.0f, dWm, K);  // dW += dy_b cols_b^T
        if (dx) {  // W^T dy_b, into the image's columns (read for the last time above)
          gemm(Trans::yes, Trans::no, K, N, OC, 1.0f, W, K, dyb, N, 0.0f, cols, N);
          col2im(cols, g, 1, dx + std::size_t(b) * g.C * g.H * g.W);
        }
      }
    });
    for (int m = 1; m < members; ++m) axpy(dW_floats, 1.0f, sums + std::size_t(m - 1) * dW_floats, dW);
  }

 private:
  // Batch norm's per-call buffers (sized by the widest layer once: no allocation per step).
  std::vector<double> partials_, sums_;
  std::vector<math::BnChannel> bn_channels_;
  std::vector<math::BnBackward> bn_backward_;
  std::vector<float> bn_rows_;  // rows_coefficients
#ifdef PSLAB_HAVE_ONEDNN
  std::unique_ptr<OnednnConvolutions> onednn_;
#else
  struct NoOnednn {  // (never made: built without oneDNN)
    bool ready(const math::ConvGeometry&, int, int, int) { return false; }
    template <typename... A>
    void forward(A...) {}
    template <typename... A>
    void backward(A...) {}
  };
  std::unique_ptr<NoOnednn> onednn_;
#endif
  // Members to split a convolution's B images over: the BLAS threads, as many as the scratch
  // holds the dW sums of (OC*B*N floats beyond the columns: (members - 1) * K <= B*N).
  static int team_size(int K, int B, int N) {
    const int threads = std::max(1, openblas_get_num_threads());
    return std::clamp(std::min(threads, 1 + int(std::size_t(B) * N / std::size_t(std::max(K, 1)))), 1, threads);
  }
  // f(lo, hi) over pieces of [0, n), split over the team when n is long (each element's
  // arithmetic the same however it is split).
  template <typename F>
  void split_floats(std::size_t n, F f) {
    constexpr std::size_t kPiece = std::size_t(1) << 14;  // floats
    const int pieces = int((n + kPiece - 1) / kPiece);
    const int members = n < 4 * kPiece ? 1 : std::clamp(openblas_get_num_threads(), 1, pieces);
    in_parallel(members, pieces, [&](int, int lo, int hi) { f(std::size_t(lo) * kPiece, std::min(n, std::size_t(hi) * kPiece)); });
  }
  // OpenBLAS's thread count, which oneDNN runs on; throws, naming the shape, where oneDNN has no
  // kernel for it (never seen, odd strides and paddings included: make_cpu_backend(threads,
  // CpuConvolutions::im2col) would take it).
  int onednn_threads(const math::ConvGeometry& g, int OC, int B) {
    const int threads = openblas_get_num_threads();
    if (!onednn_->ready(g, OC, B, threads))
      throw std::runtime_error("oneDNN has no kernel but its reference one for the convolution " + std::to_string(g.C) + "x" +
                               std::to_string(g.H) + "x" + std::to_string(g.W) + " -> " + std::to_string(OC) + ", kernel " +
                               std::to_string(g.KH) + "x" + std::to_string(g.KW) + ", stride " + std::to_string(g.stride) +
                               ", pad " + std::to_string(g.pad) + ", at a batch of " + std::to_string(B) + " on " +
                               std::to_string(threads) + " threads (the CPU backend on im2col takes any shape)");
    return threads;
  }
  // The per-channel coefficients of NHWC batch norm: `arrays` arrays of C floats, one buffer.
  float* rows_coefficients(int C, int arrays) {
    bn_rows_.resize(std::size_t(C) * arrays);
    return bn_rows_.data();
  }
  static int image_members(int B) { return std::clamp(openblas_get_num_threads(), 1, std::max(B, 1)); }
  // sums_ (C, 2): Σ a and Σ a b over each channel of a batch (B, C, HW), each the sum in image
  // order of the images' own (partials_ (B, C, 2)); each image's summed from its first pixel's
  // values (bn_plane_sums's pivots; a's only where shift_a, when a is b).
  // In NHWC the partials are (B, 2, C).
  void channel_sums(const float* a, const float* b, bool shift_a, int B, int C, int HW) {
    partials_.resize(2 * std::size_t(B) * C);
    sums_.assign(2 * std::size_t(C), 0.0);
    if (image_layout() == ImageLayout::nhwc) {
      in_parallel(image_members(B), B, [&](int, int lo, int hi) {
        for (std::size_t i = std::size_t(lo); i < std::size_t(hi); ++i) {
          double* p = &partials_[2 * i * C];
          std::fill_n(p, 2 * std::size_t(C), 0.0);
          const float *ai = a + i * C * HW, *bi = b + i * C * HW;
          if (HW > 0) bn_rows_sums(ai, bi, HW, C, shift_a ? ai : nullptr, bi, p, p + C);
        }
      });
      for (std::size_t i = 0; i < std::size_t(B); ++i)
        for (std::size_t c = 0; c < std::size_t(C); ++c)
          sums_[2 * c] += partials_[2 * i * C + c], sums_[2 * c + 1] += partials_[(2 * i + 1) * C + c];
      return;
    }
    in_parallel(image_members(B), B, [&](int, int lo, int hi) {
      for (std::size_t i = std::size_t(lo) * C; i < std::size_t(hi) * C; ++i) {
        partials_[2 * i] = partials_[2 * i + 1] = 0.0;
        const float *ai = a + i * HW, *bi = b + i * HW;
        if (HW > 0) bn_plane_sums(ai, bi, HW, shift_a ? ai[0] : 0.0f, bi[0], partials_[2 * i], partials_[2 * i + 1]);
      }
    });
    for (std::size_t i = 0; i < std::size_t(B) * C; ++i) sums_[2 * (i % C)] += partials_[2 * i], sums_[2 * (i % C) + 1] += partials_[2 * i + 1];
  }
  // f(member, lo, hi) for member m of `members` and its items [lo, hi) of n (images or pieces);
  // with more than one member on a team of that size, each on one BLAS thread.
  template <typename F>
  void in_parallel(int members, int n, F f) {
    if (members == 1) return f(0, 0, n);
    blas_threads_awake_ = false;
    if (!team_ || team_->size() != members) team_ = std::make_unique<ThreadTeam>(members);
    const int threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
    try {
      struct Job {
        F& f;
        int members, n;
      } job{f, members, n};  // (one pointer captured: std::function stores it without allocating)
      team_->run([&job](int m) {
        job.f(m, int(std::int64_t(job.n) * m / job.members), int(std::int64_t(job.n) * (m + 1) / job.members));
      });
    } catch (...) {
      openblas_set_num_threads(threads);
      throw;
    }
    openblas_set_num_threads(threads);
  }

  std::unique_ptr<ThreadTeam> team_;  // in_parallel's (made on first use)
  bool blas_threads_awake_ = false;    // the last op on several threads was an OpenBLAS GEMM

  // Visits every entry of a batch's column matrix in memory order: inside(entry, the image
  // pixel it reads) or, in the zero padding, padding(entry). Out of line: inlined into
  // conv_forward's loop over images, its inner loop kept the stride on the stack (4% slower).
  template <typename Image, typename Cols, typename Inside, typename Padding>
  [[gnu::noinline]] static void walk_columns(const math::ConvGeometry& g, int B, Image* batch, Cols* cols, Inside inside, Padding padding) {
    const int OH = g.OH(), OW = g.OW(), s = g.stride;
    const std::size_t image = std::size_t(g.C) * g.H * g.W;
    for (int c = 0; c < g.C; ++c)
      for (int kh = 0; kh < g.KH; ++kh)
        for (int kw = 0; kw < g.KW; ++kw) {
          // Output columns [lo, hi) read inside the image: iw = ow * s - pad + kw in [0, W).
          const int lo = std::clamp((g.pad - kw + s - 1) / s, 0, OW);
          const int hi = std::clamp((g.W + g.pad - kw + s - 1) / s, lo, OW);
          for (int b = 0; b < B; ++b) {
            Image* img = batch + std::size_t(b) * image;
            for (int oh = 0; oh < OH; ++oh) {
              const int ih = oh * s - g.pad + kh;
              if (ih < 0 || ih >= g.H) {
                for (int ow = 0; ow < OW; ++ow) padding(*cols++);
                continue;
              }
              Image* px = img + (std::size_t(c) * g.H + ih) * g.W + (lo * s - g.pad + kw);
              for (int ow = 0; ow < lo; ++ow) padding(*cols++);
              if (s == 1) {  // (a unit stride of its own: this loop vectorises)
                for (int ow = lo; ow < hi; ++ow, ++px) inside(*cols++, px);
              } else {
                for (int ow = lo; ow < hi; ++ow, px += s) inside(*cols++, px);
              }
              for (int ow = hi; ow < OW; ++ow) padding(*cols++);
            }
          }
        }
  }
};

}  // namespace

void set_cpu_backend_threads(int threads) { openblas_set_num_threads(threads); }

std::string blas_kernels() { return openblas_get_corename(); }

namespace {
// OPENBLAS_CORETYPE for this CPU where OpenBLAS chose Prescott on one with AVX-512 or AVX2
// (null: OpenBLAS's choice stands).
const char* better_blas_kernels() {
  if (blas_kernels() != "Prescott") return nullptr;
  __builtin_cpu_init();  // (both tests ask the OS too: AVX state enabled)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "Haswell" : nullptr;
}
}  // namespace

void use_best_cpu_runtime(char** argv) {
  bool changed = false;
  if (!std::getenv("OPENBLAS_CORETYPE"))
    if (const char* best = better_blas_kernels()) setenv("OPENBLAS_CORETYPE", best, 1), changed = true;
#ifdef PSLAB_HAVE_ONEDNN
  if (!std::getenv("OMP_WAIT_POLICY")) setenv("OMP_WAIT_POLICY", "passive", 1), changed = true;
#endif
  if (!changed) return;
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "pslab: could not re-execute with OPENBLAS_CORETYPE=%s OMP_WAIT_POLICY=%s (%s); going on with "
               "OpenBLAS's %s kernels\n", std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "",
               std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "", std::strerror(errno), blas_kernels().c_str());
}

std::unique_ptr<Backend> make_cpu_backend(int threads, CpuConvolutions conv) {
  return std::make_unique<CpuBackend>(threads, conv);
}

}  // namespace pslab
