// Elementwise math written once, called by both backends.
//
// Every function here is a scalar (or one-row) function marked PSLAB_HD so that the CPU
// backend calls it in plain loops and the CUDA backend calls it from one thread per element
// (or per row). The CPU tests therefore cover the formulas the GPU runs; not its rounding
// bit for bit: nvcc contracts a * b + c into one fused multiply-add where the CPU build
// (-ffp-contract=off) rounds twice, so GPU tests compare with a tolerance.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define PSLAB_HD __host__ __device__ __forceinline__
#else
#define PSLAB_HD inline
#endif

namespace pslab::math {

// ---- activations -------------------------------------------------------------------------

PSLAB_HD float relu(float x) { return x > 0.0f ? x : 0.0f; }

// Gradient of ReLU expressed through its output y = relu(x): dx = dy where y > 0.
PSLAB_HD float relu_grad(float dy, float y) { return y > 0.0f ? dy : 0.0f; }

// ---- losses ------------------------------------------------------------------------------

// Softmax cross-entropy of one row, numerically stable (max subtracted before exp).
//   z: (C) logits, label in [0, C), dz: (C) written with grad_scale * (softmax(z) - onehot).
// Returns the loss -log softmax(z)[label] in nats. grad_scale is 1/batch for a mean loss.
PSLAB_HD float softmax_xent_row(const float* z, int C, int label, float* dz, float grad_scale) {
  float zmax = z[0];
  for (int c = 1; c < C; ++c) zmax = z[c] > zmax ? z[c] : zmax;
  float denom = 0.0f;
  for (int c = 0; c < C; ++c) denom += expf(z[c] - zmax);
  const float log_denom = logf(denom);
  for (int c = 0; c < C; ++c) {
    const float p = expf(z[c] - zmax - log_denom);
    dz[c] = grad_scale * (p - (c == label ? 1.0f : 0.0f));
  }
  return log_denom - (z[label] - zmax);
}

// Index of the largest logit of one row (first one on ties).
PSLAB_HD int argmax_row(const float* z, int C) {
  int best = 0;
  for (int c = 1; c < C; ++c) best = z[c] > z[best] ? c : best;
  return best;
}

// Half squared error of one row: 0.5 * sum_c (y_c - t_c)^2; dy = grad_scale * (y - t).
PSLAB_HD float mse_row(const float* y, const float* t, int C, float* dy, float grad_scale) {
  float loss = 0.0f;
  for (int c = 0; c < C; ++c) {
    const float d = y[c] - t[c];
    loss += 0.5f * d * d;
    dy[c] = grad_scale * d;
  }
  return loss;
}

// ---- element-wise programs ---------------------------------------------------------------
// An element-wise update of several arrays at once, e.g. an optimizer's step, as a short
// program that both backends run (Backend::run): for every index i, its ops in order, over
// registers that are the arrays' element i ([0, arrays)) or temporaries (the rest). An op reads
// registers x and y and writes register dst:
//   axpby       dst = a x + b y
//   mul         dst = x y
//   div         dst = x / y
//   sqrt        dst = sqrt(x)
//   add_scalar  dst = x + a
//   scale       dst = a x
//   div_scalar  dst = x / a
// Arrays marked as outputs are written back (the CPU writes them in place as it goes, the GPU at
// the end of an element: so an output that aliases an input must not be read after it is
// written, e.g. w_out == w written by the last op).
// An op's scalars a and b are fixed when the program is written, or *live*: read from memory
// (Program::live, on the device that runs it) each time the program runs, so that a program
// recorded once in a step graph (Backend::begin_recording) runs with each step's learning rate.

enum class OpCode : std::uint8_t { axpby, mul, div, sqrt, add_scalar, scale, div_scalar };

// A scalar as written into a program: a value, or a live one (slot `slot` of Program::live).
struct Scalar {
  float value = 0.0f;
  int slot = -1;
  Scalar(float v) : value(v) {}  // NOLINT: a float is a fixed scalar
  static Scalar live(int slot) {
    Scalar s(0.0f);
    s.slot = slot;
    return s;
  }
};

struct Op {
  OpCode code;
  std::uint8_t dst, x, y;
  float a, b;
  std::int8_t live_a = -1, live_b = -1;  // -1: a (b) as written; else read from Program::live[live_a]
};

struct Program {
  static constexpr int kMaxOps = 16, kMaxRegisters = 12, kMaxLive = 4;
  Op ops[kMaxOps] = {};
  int n_ops = 0;
  int arrays = 0;        // registers [0, arrays) are the arrays
  unsigned outputs = 0;  // bit k: array k is written back (set by op() when it writes array k)
  // kMaxLive floats on the device that runs the program, read when it runs, where an op's
  // scalar is live (null: none is).
  const float* live = nullptr;
  // Adds an op (on the host); throws std::logic_error past kMaxOps or kMaxRegisters, or for a
  // live slot outside [0, kMaxLive).
  Program& op(OpCode code, int dst, int x, int y = 0, Scalar a = 0.0f, Scalar b = 0.0f);
  // Throws std::logic_error where an op reads a live scalar and `live` is null (the backends
  // check before they run it).
  void check_live() const;
};

// The op with its live scalars read from `live` (Program::live, or a copy of it).
PSLAB_HD Op resolved(Op o, const float* live) {
  if (o.live_a >= 0) o.a = live[o.live_a];
  if (o.live_b >= 0) o.b = live[o.live_b];
  return o;
}

PSLAB_HD float apply_op(const Op& o, float x, float y) {
  switch (o.code) {
    case OpCode::axpby: return o.a * x + o.b * y;
    case OpCode::mul: return x * y;
    case OpCode::div: return x / y;
    case OpCode::sqrt: return sqrtf(x);
    case OpCode::add_scalar: return x + o.a;
    case OpCode::scale: return o.a * x;
    case OpCode::div_scalar: return x / o.a;
  }
  return 0.0f;
}

// ---- gathering a batch's rows -------------------------------------------------------------
// Word i of a gather of rows idx[0..n) of `words_per_row` 32-bit words each (a sample's
// features, its label or its targets): the word it copies from the source.
PSLAB_HD unsigned long gather_source_word(const unsigned int* idx, unsigned long words_per_row, unsigned long i) {
  return static_cast<unsigned long>(idx[i / words_per_row]) * words_per_row + i % words_per_row;
}

// ---- data augmentation: random crop with zero padding, horizontal flip ----------------------
// A training image's draw depends on (seed, epoch, its sample index) alone, so the same sample
// in the same epoch is augmented alike whichever worker draws it, on either backend.
struct AugmentDraw {
  int dx, dy;  // the crop window's offset in the padded image, each in [0, 2 pad]
  bool flip;
};

PSLAB_HD std::uint64_t mix64(std::uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

PSLAB_HD AugmentDraw augment_draw(std::uint64_t seed, std::uint64_t epoch, std::uint32_t sample, int pad) {
  const std::uint64_t h = mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ mix64(epoch * 0x100000001b3ull + sample + 1));
  const std::uint64_t span = std::uint64_t(2 * pad + 1);
  return AugmentDraw{int(h % span), int((h >> 20) % span), ((h >> 40) & 1u) != 0};
}

// Pixel (c, y, x) of the augmented image of `img` (C, H, W): the image flipped left-right when
// d.flip, padded by `pad` zeros on every side, and cut at (d.dy, d.dx) back to H x W.
PSLAB_HD float augmented_pixel(const float* img, int c, int y, int x, int H, int W, AugmentDraw d, int pad) {
  const int sy = y + d.dy - pad, sx = (d.flip ? W - 1 - x : x) + d.dx - pad;
  return (sy < 0 || sy >= H || sx < 0 || sx >= W) ? 0.0f : img[(long(c) * H + sy) * W + sx];
}

// ---- a bias's gradient on a GPU (one block per channel) -----------------------------------

// Thread t of a block of T that sums channel c of dy (outer, channels, inner): the channel's
// elements t, t + T, t + 2T, ... in (o, i) order, added in that order in float. Loads go kUnroll
// at a time, each group issued before any is added: a block per channel reads only as fast as
// its loads in flight allow. The (o, i) of each element is carried from the last (no division in
// the loop). The block then adds its threads' sums by a fixed tree (kernels/cuda): the same sum
// on every run.
template <int kUnroll>
PSLAB_HD float bias_grad_thread_sum(const float* dy, int outer, int channels, int inner, int c, int t, int T) {
  if (outer <= 0 || inner <= 0) return 0.0f;
  const unsigned long long per_channel = (unsigned long long)outer * (unsigned long long)inner;
  const int step_o = T / inner, step_i = T % inner;  // a stride of T elements: rows, then columns
  int o = t / inner, i = t % inner;
  unsigned long long j = (unsigned long long)t;
  float acc = 0.0f;
  while (j < per_channel) {
    float v[kUnroll];
    int n = 0;
    for (; n < kUnroll && j < per_channel; ++n) {
      v[n] = dy[((unsigned long long)o * (unsigned long long)channels + (unsigned long long)c) * (unsigned long long)inner +
                (unsigned long long)i];
      o += step_o, i += step_i, j += (unsigned long long)T;
      if (i >= inner) i -= inner, ++o;
    }
    for (int k = 0; k < n; ++k) acc += v[k];
  }
  return acc;
}

// ---- batch normalisation ----------------------------------------------------------------
// Per channel c of x (B, C, HW), over its N = B*HW values. Both backends sum a channel in
// double (the CPU in order, the GPU in a tree), then call these per channel and per element.

// The normalisation of one channel: xhat = (x - mean) * invstd; y = gamma * xhat + beta.
struct BnChannel {
  float mean, invstd;
};

// Training: the batch's statistics from a channel's sum and sum of squares over n values
// (biased variance, as normalisation uses); the running statistics move by `momentum` toward
// the batch's mean and unbiased variance (n / (n - 1), as PyTorch and cuDNN keep them).
PSLAB_HD BnChannel bn_batch_channel(double sum, double sumsq, double n, float eps, float momentum, float* running_mean,
                                    float* running_var) {
  const double mean = sum / n;
  double var = sumsq / n - mean * mean;
  var = var > 0.0 ? var : 0.0;
  const double unbiased = n > 1.0 ? var * n / (n - 1.0) : var;
  *running_mean = float((1.0 - momentum) * *running_mean + momentum * mean);
  *running_var = float((1.0 - momentum) * *running_var + momentum * unbiased);
  return BnChannel{float(mean), float(1.0 / sqrt(var + eps))};
}

// Inference: the running statistics.
PSLAB_HD BnChannel bn_running_channel(float running_mean, float running_var, float eps) {
  return BnChannel{running_mean, float(1.0 / sqrt(double(running_var) + eps))};
}

PSLAB_HD float bn_forward_value(float x, BnChannel s, float gamma, float beta) {
  return gamma * ((x - s.mean) * s.invstd) + beta;
}

// Backward of one channel from its sums over n values: sum_dy = Σ dy (= dbeta) and sum_dy_x =
// Σ dy x; dgamma = Σ dy xhat. dx = gamma invstd (dy - dbeta / n - xhat dgamma / n), written as
// dx = a dy + b x + c with the three coefficients of BnBackward.
struct BnBackward {
  float dgamma, dbeta;
  float a, b, c;
};
PSLAB_HD BnBackward bn_backward_channel(double sum_dy, double sum_dy_x, double n, BnChannel s, float gamma) {
  const double dgamma = s.invstd * (sum_dy_x - double(s.mean) * sum_dy);
  const double k = double(gamma) * s.invstd;
  const double b = -k * s.invstd * dgamma / n;  // on x: xhat dgamma / n = (x - mean) invstd dgamma / n
  const double c = -k * sum_dy / n - b * s.mean;
  return BnBackward{float(dgamma), float(sum_dy), float(k), float(b), float(c)};
}

PSLAB_HD float bn_backward_value(float dy, float x, const BnBackward& k) { return k.a * dy + k.b * x + k.c; }

// ---- convolution index math (im2col) ------------------------------------------------------
// Image layout (C, H, W) row-major; a batch (B, C, H, W). Column matrix of a batch: (C*KH*KW,
// B*OH*OW) row-major, column b*OH*OW + n being output pixel n of image b, so that one GEMM
// covers the whole batch.

struct ConvGeometry {
  int C, H, W;      // input channels, height, width
  int KH, KW;       // kernel size
  int stride, pad;  // same for both axes
  // Output size; 0 when the kernel does not fit (division would round -1 / stride up to 0).
  PSLAB_HD int OH() const { return H + 2 * pad < KH ? 0 : (H + 2 * pad - KH) / stride + 1; }
  PSLAB_HD int OW() const { return W + 2 * pad < KW ? 0 : (W + 2 * pad - KW) / stride + 1; }
};

// Value of column-matrix element (row, col) read from image x; 0 in the zero padding.
PSLAB_HD float im2col_value(const float* x, const ConvGeometry& g, int row, int col) {
  const int kw = row % g.KW;
  const int kh = (row / g.KW) % g.KH;
  const int c = row / (g.KW * g.KH);
  const int ow = col % g.OW();
  const int oh = col / g.OW();
  const int ih = oh * g.stride - g.pad + kh;
  const int iw = ow * g.stride - g.pad + kw;
  if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) return 0.0f;
  return x[(c * g.H + ih) * g.W + iw];
}

// Element (row, col) of a batch's column matrix, read from the batch x (B, C, H, W).
PSLAB_HD float im2col_batch_value(const float* x, const ConvGeometry& g, int row, int col) {
  const int N = g.OH() * g.OW();
  return im2col_value(x + static_cast<long>(col / N) * g.C * g.H * g.W, g, row, col % N);
}

// Gradient w.r.t. image element (c, ih, iw): the sum of all column entries that read it, from
// the image's column matrix `cols` whose rows are `ld` floats apart (OH*OW for one image;
// B*OH*OW for image b of a batch, with cols advanced by b*OH*OW).
PSLAB_HD float col2im_value(const float* cols, const ConvGeometry& g, int c, int ih, int iw, int ld) {
  const int OH = g.OH(), OW = g.OW();
  float sum = 0.0f;
  for (int kh = 0; kh < g.KH; ++kh) {
    const int oh_num = ih + g.pad - kh;
    if (oh_num < 0 || oh_num % g.stride != 0) continue;
    const int oh = oh_num / g.stride;
    if (oh >= OH) continue;
    for (int kw = 0; kw < g.KW; ++kw) {
      const int ow_num = iw + g.pad - kw;
      if (ow_num < 0 || ow_num % g.stride != 0) continue;
      const int ow = ow_num / g.stride;
      if (ow >= OW) continue;
      const int row = (c * g.KH + kh) * g.KW + kw;
      sum += cols[static_cast<long>(row) * ld + oh * OW + ow];
    }
  }
  return sum;
}

}  // namespace pslab::math
