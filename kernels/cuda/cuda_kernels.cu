// CUDA kernels of the CUDA backend. Each kernel applies the kernels/elementwise.h function of its
// element or row; grid-stride loops over 64-bit indices, so any n fits a capped grid.
#include "cuda/cuda_kernels.h"

#include <math_constants.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda/cuda_check.h"

namespace pslab::cuda {
namespace {

constexpr int kThreads = 256;         // threads per block of the elementwise kernels
constexpr int kRowThreads = 128;      // threads per block of the one-thread-per-row kernels
constexpr std::size_t kMaxBlocks = 65536;  // grid cap; grid-stride loops cover the rest
constexpr int kMaxPartials = 1024;    // most blocks (= partial sums) of sum_squares

void require(bool ok, const char* launcher, const char* what) {
  if (!ok) throw std::invalid_argument(std::string(launcher) + ": " + what);
}

unsigned grid_for(std::size_t n, int threads) {
  const std::size_t blocks = (n + std::size_t(threads) - 1) / std::size_t(threads);
  return static_cast<unsigned>(std::min(blocks, kMaxBlocks));
}

__device__ __forceinline__ std::size_t global_index() {
  return std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_stride() {
  return std::size_t(blockDim.x) * gridDim.x;
}

// ---- elementwise ---------------------------------------------------------------------------

__global__ void fill_kernel(float* x, std::size_t n, float value) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) x[i] = value;
}

__global__ void axpy_kernel(std::size_t n, float a, const float* x, float* y) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) y[i] += a * x[i];
}

__global__ void scale_kernel(std::size_t n, float a, float* x) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) x[i] *= a;
}

__global__ void relu_forward_kernel(const float* x, float* y, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) y[i] = math::relu(x[i]);
}

__global__ void relu_backward_kernel(const float* dy, const float* y, float* dx,
                                     std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride())
    dx[i] = math::relu_grad(dy[i], y[i]);
}

// ---- batch normalisation: one block per channel ---------------------------------------------

// Sums a block's per-thread doubles in a fixed shared-memory tree; every thread gets the total.
// blockDim.x == kThreads.
__device__ double block_sum(double v, double* s) {
  s[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
    __syncthreads();
  }
  const double total = s[0];
  __syncthreads();  // (s is reused by the next call)
  return total;
}

// Channel blockIdx.x of x (B, C, HW): statistics (training: the batch's; else the running
// ones), then y. Thread t visits elements t, t + kThreads, ... of the channel's B*HW.
__global__ void batch_norm_forward_kernel(const float* x, int B, int C, int HW, const float* gamma, const float* beta,
                                          bool training, float momentum, float eps, float* running_mean,
                                          float* running_var, float* saved_mean, float* saved_invstd, float* y) {
  __shared__ double s[kThreads];
  __shared__ math::BnChannel stats;
  const int c = blockIdx.x;
  const long n = long(B) * HW;
  if (training) {
    double sum = 0.0, sumsq = 0.0;
    for (long k = threadIdx.x; k < n; k += kThreads) {
      const double v = x[((k / HW) * C + c) * HW + k % HW];
      sum += v, sumsq += v * v;
    }
    sum = block_sum(sum, s);
    sumsq = block_sum(sumsq, s);
    if (threadIdx.x == 0) {
      stats = math::bn_batch_channel(sum, sumsq, double(n), eps, momentum, running_mean + c, running_var + c);
      saved_mean[c] = stats.mean, saved_invstd[c] = stats.invstd;
    }
  } else if (threadIdx.x == 0) {
    stats = math::bn_running_channel(running_mean[c], running_var[c], eps);
  }
  __syncthreads();
  const math::BnChannel st = stats;
  const float g = gamma[c], b = beta[c];
  for (long k = threadIdx.x; k < n; k += kThreads) {
    const long at = ((k / HW) * C + c) * HW + k % HW;
    y[at] = math::bn_forward_value(x[at], st, g, b);
  }
}

__global__ void batch_norm_backward_kernel(const float* x, const float* dy, int B, int C, int HW, const float* gamma,
                                           const float* saved_mean, const float* saved_invstd, float* dgamma,
                                           float* dbeta, float* dx) {
  __shared__ double s[kThreads];
  __shared__ math::BnBackward coef;
  const int c = blockIdx.x;
  const long n = long(B) * HW;
  double sum_dy = 0.0, sum_dy_x = 0.0;
  for (long k = threadIdx.x; k < n; k += kThreads) {
    const long at = ((k / HW) * C + c) * HW + k % HW;
    sum_dy += dy[at], sum_dy_x += double(dy[at]) * x[at];
  }
  sum_dy = block_sum(sum_dy, s);
  sum_dy_x = block_sum(sum_dy_x, s);
  if (threadIdx.x == 0) {
    coef = math::bn_backward_channel(sum_dy, sum_dy_x, double(n), {saved_mean[c], saved_invstd[c]}, gamma[c]);
    dgamma[c] = coef.dgamma, dbeta[c] = coef.dbeta;
  }
  __syncthreads();
  if (!dx) return;
  const math::BnBackward ck = coef;
  for (long k = threadIdx.x; k < n; k += kThreads) {
    const long at = ((k / HW) * C + c) * HW + k % HW;
    dx[at] = math::bn_backward_value(dy[at], x[at], ck);
  }
}

// ---- reductions ----------------------------------------------------------------------------

// One partial per block: each thread sums its grid-stride elements in double, then a fixed
// shared-memory tree adds the block's threads. blockDim.x == kThreads (a power of two).
__global__ void sum_squares_kernel(const float* x, std::size_t n, double* partials) {
  __shared__ double s[kThreads];
  double acc = 0.0;
  for (std::size_t i = global_index(); i < n; i += grid_stride()) {
    const double v = x[i];
    acc += v * v;
  }
  s[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = s[0];
}

// ---- layers --------------------------------------------------------------------------------

__global__ void add_bias_kernel(float* y, const float* bias, std::size_t n, int channels,
                                int inner) {
  for (std::size_t i = global_index(); i < n; i += grid_stride())
    y[i] += bias[(i / std::size_t(inner)) % std::size_t(channels)];
}

// Block c sums channel c: thread t its share (math::bias_grad_thread_sum: elements t, t + T, ...
// in float, 8 loads in flight), then a fixed tree adds the threads. T = 1024: a convolution's
// channel holds batch x H x W values (800K at batch 4096 on 14x14), and one block per channel
// reads them only as fast as its loads in flight allow.
constexpr int kBiasGradThreads = 1024;
__global__ void __launch_bounds__(kBiasGradThreads) bias_grad_kernel(const float* dy, int outer, int channels, int inner,
                                                                     float* db) {
  __shared__ float s[kBiasGradThreads];
  const int c = blockIdx.x;
  s[threadIdx.x] = math::bias_grad_thread_sum<8>(dy, outer, channels, inner, c, int(threadIdx.x), kBiasGradThreads);
  __syncthreads();
  for (unsigned half = kBiasGradThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[c] = s[0];
}

// ---- losses --------------------------------------------------------------------------------

__global__ void softmax_xent_kernel(const float* logits, const std::int32_t* labels, int rows,
                                    int C, float grad_scale, float* dlogits, float* row_loss,
                                    int* bad_labels) {
  for (std::size_t r = global_index(); r < std::size_t(rows); r += grid_stride()) {
    const float* z = logits + r * std::size_t(C);
    float* dz = dlogits + r * std::size_t(C);
    const int label = labels[r];
    if (label < 0 || label >= C) {  // would read z[label] out of bounds: flag the row
      atomicAdd(bad_labels, 1);
      for (int c = 0; c < C; ++c) dz[c] = CUDART_NAN_F;
      row_loss[r] = CUDART_NAN_F;
      continue;
    }
    row_loss[r] = math::softmax_xent_row(z, C, label, dz, grad_scale);
  }
}

__global__ void mse_kernel(const float* y, const float* t, int rows, int C, float grad_scale,
                           float* dy, float* row_loss) {
  for (std::size_t r = global_index(); r < std::size_t(rows); r += grid_stride()) {
    const std::size_t off = r * std::size_t(C);
    row_loss[r] = math::mse_row(y + off, t + off, C, dy + off, grad_scale);
  }
}

// The loop's trip count is the same for all threads of a block (base is block-uniform), so
// every thread reaches __syncthreads_count, which counts the block's correct rows; one atomic
// per block and iteration adds them (integer addition: the total is exact in any order).
__global__ void count_correct_kernel(const float* logits, const std::int32_t* labels, int rows,
                                     int C, unsigned long long* correct) {
  const std::size_t stride = grid_stride();
  for (std::size_t base = std::size_t(blockIdx.x) * blockDim.x; base < std::size_t(rows);
       base += stride) {
    const std::size_t r = base + threadIdx.x;
    int hit = 0;
    if (r < std::size_t(rows))
      hit = math::argmax_row(logits + r * std::size_t(C), C) == labels[r];
    const int block_hits = __syncthreads_count(hit);
    if (threadIdx.x == 0 && block_hits > 0)
      atomicAdd(correct, static_cast<unsigned long long>(block_hits));
  }
}

// ---- element-wise programs ------------------------------------------------------------------

// Live scalars are read once per block, into shared memory, as the kernel begins.
__global__ void program_kernel(const math::Program p, const ProgramArrays a, std::size_t n) {
  __shared__ float live[math::Program::kMaxLive];
  if (p.live && threadIdx.x < math::Program::kMaxLive) live[threadIdx.x] = p.live[threadIdx.x];
  __syncthreads();
  for (std::size_t i = global_index(); i < n; i += grid_stride()) {
    float r[math::Program::kMaxRegisters];
    for (int k = 0; k < p.arrays; ++k) r[k] = a.p[k][i];
    for (int o = 0; o < p.n_ops; ++o) {
      const math::Op op = math::resolved(p.ops[o], live);
      r[op.dst] = math::apply_op(op, r[op.x], r[op.y]);
    }
    for (int k = 0; k < p.arrays; ++k)
      if (p.outputs >> k & 1u) a.p[k][i] = r[k];
  }
}

// ---- convolution helpers -------------------------------------------------------------------

// One thread per element of the batch's column matrix (rows, ncols = B*OH*OW).
__global__ void im2col_kernel(const float* x, const math::ConvGeometry g, float* cols,
                              std::size_t n, int ncols) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) {
    const int row = static_cast<int>(i / std::size_t(ncols));
    const int col = static_cast<int>(i % std::size_t(ncols));
    cols[i] = math::im2col_batch_value(x, g, row, col);
  }
}

// One thread per element of dx (B, C, H, W).
__global__ void col2im_kernel(const float* cols, const math::ConvGeometry g, int B, float* dx,
                              std::size_t n) {
  const int npix = g.OH() * g.OW();
  for (std::size_t i = global_index(); i < n; i += grid_stride()) {
    const int w = static_cast<int>(i % std::size_t(g.W));
    const int h = static_cast<int>((i / std::size_t(g.W)) % std::size_t(g.H));
    const int c = static_cast<int>((i / (std::size_t(g.W) * std::size_t(g.H))) % std::size_t(g.C));
    const int b = static_cast<int>(i / (std::size_t(g.W) * std::size_t(g.H) * std::size_t(g.C)));
    dx[i] = math::col2im_value(cols + std::size_t(b) * npix, g, c, h, w, B * npix);
  }
}

// One thread per 32-bit word of dst (math::gather_source_word).
__global__ void gather_rows_kernel(const std::uint32_t* src, const std::uint32_t* idx, unsigned long words_per_row,
                                   std::uint32_t* dst, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride())
    dst[i] = src[math::gather_source_word(reinterpret_cast<const unsigned int*>(idx), words_per_row, i)];
}

// dst (n, C, H, W): src's images augmented; one thread per element of dst.
__global__ void augment_images_kernel(const float* src, const std::uint32_t* idx, int C, int H, int W, std::uint64_t seed,
                                      std::uint64_t epoch, int pad, float* dst, std::size_t total) {
  const std::size_t image = std::size_t(C) * std::size_t(H) * std::size_t(W);
  for (std::size_t i = global_index(); i < total; i += grid_stride()) {
    const std::size_t k = i / image, r = i % image;
    const int c = int(r / (std::size_t(H) * std::size_t(W))), y = int(r / std::size_t(W) % std::size_t(H)), x = int(r % std::size_t(W));
    dst[i] = math::augmented_pixel(src + k * image, c, y, x, H, W, math::augment_draw(seed, epoch, idx[k], pad), pad);
  }
}

// y (B, A, N) = x (A, B, N); one thread per element of y.
__global__ void swap_outer_kernel(const float* x, int A, int B, int N, float* y, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) {
    const std::size_t k = i % std::size_t(N);
    const std::size_t a = (i / std::size_t(N)) % std::size_t(A);
    const std::size_t b = i / (std::size_t(N) * std::size_t(A));
    y[i] = x[(a * std::size_t(B) + b) * std::size_t(N) + k];
  }
}

// ---- GEMM helper ---------------------------------------------------------------------------

__global__ void scale_matrix_kernel(int M, int N, float beta, float* C, int ldc) {
  const std::size_t n = std::size_t(M) * std::size_t(N);
  for (std::size_t i = global_index(); i < n; i += grid_stride()) {
    float& c = C[(i / std::size_t(N)) * std::size_t(ldc) + i % std::size_t(N)];
    c = beta == 0.0f ? 0.0f : beta * c;
  }
}

void check_geometry(const math::ConvGeometry& g, const char* launcher) {
  require(g.C >= 0 && g.H >= 0 && g.W >= 0, launcher, "C, H, W must be >= 0");
  require(g.KH >= 1 && g.KW >= 1, launcher, "KH, KW must be >= 1");
  require(g.stride >= 1, launcher, "stride must be >= 1");
  require(g.pad >= 0, launcher, "pad must be >= 0");
  require(g.OH() >= 0 && g.OW() >= 0, launcher,
          "the kernel does not fit the padded image (OH or OW < 0)");
}

}  // namespace

// ---- launchers -----------------------------------------------------------------------------

cudaError_t probe_kernel_image() {
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, fill_kernel);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

void launch_fill(float* x, std::size_t n, float value, cudaStream_t stream) {
  if (n == 0) return;
  require(x != nullptr, "launch_fill", "x is null");
  fill_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, value);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_axpy(std::size_t n, float a, const float* x, float* y, cudaStream_t stream) {
  if (n == 0) return;
  require(x != nullptr && y != nullptr, "launch_axpy", "x or y is null");
  axpy_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(n, a, x, y);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_scale(std::size_t n, float a, float* x, cudaStream_t stream) {
  if (n == 0) return;
  require(x != nullptr, "launch_scale", "x is null");
  scale_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(n, a, x);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_relu_forward(const float* x, float* y, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  require(x != nullptr && y != nullptr, "launch_relu_forward", "x or y is null");
  relu_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_relu_backward(const float* dy, const float* y, float* dx, std::size_t n,
                          cudaStream_t stream) {
  if (n == 0) return;
  require(dy != nullptr && y != nullptr && dx != nullptr, "launch_relu_backward",
          "dy, y or dx is null");
  relu_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dy, y, dx, n);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_batch_norm_forward(const float* x, int B, int C, int HW, const float* gamma, const float* beta,
                               bool training, float momentum, float eps, float* running_mean, float* running_var,
                               float* saved_mean, float* saved_invstd, float* y, cudaStream_t stream) {
  if (C == 0 || B == 0) return;
  require(x && gamma && beta && running_mean && running_var && y && (!training || (saved_mean && saved_invstd)),
          "launch_batch_norm_forward", "a buffer is null");
  batch_norm_forward_kernel<<<C, kThreads, 0, stream>>>(x, B, C, HW, gamma, beta, training, momentum, eps, running_mean,
                                                        running_var, saved_mean, saved_invstd, y);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_batch_norm_backward(const float* x, const float* dy, int B, int C, int HW, const float* gamma,
                                const float* saved_mean, const float* saved_invstd, float* dgamma, float* dbeta,
                                float* dx, cudaStream_t stream) {
  if (C == 0) return;
  require(x && dy && gamma && saved_mean && saved_invstd && dgamma && dbeta, "launch_batch_norm_backward",
          "a buffer is null");
  batch_norm_backward_kernel<<<C, kThreads, 0, stream>>>(x, dy, B, C, HW, gamma, saved_mean, saved_invstd, dgamma,
                                                         dbeta, dx);
  PSLAB_CUDA_CHECK_LAUNCH();
}

int sum_squares_partial_count(std::size_t n) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(std::clamp<std::size_t>(blocks, 1, kMaxPartials));
}

void launch_sum_squares_partials(const float* x, std::size_t n, double* partials,
                                 cudaStream_t stream) {
  if (n == 0) return;
  require(x != nullptr && partials != nullptr, "launch_sum_squares_partials",
          "x or partials is null");
  const int blocks = sum_squares_partial_count(n);
  sum_squares_kernel<<<blocks, kThreads, 0, stream>>>(x, n, partials);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_add_bias(float* y, const float* bias, int outer, int channels, int inner,
                     cudaStream_t stream) {
  require(outer >= 0 && channels >= 0 && inner >= 0, "launch_add_bias",
          "outer, channels, inner must be >= 0");
  const std::size_t n = std::size_t(outer) * std::size_t(channels) * std::size_t(inner);
  if (n == 0) return;
  require(y != nullptr && bias != nullptr, "launch_add_bias", "y or bias is null");
  add_bias_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(y, bias, n, channels, inner);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_bias_grad(const float* dy, int outer, int channels, int inner, float* db,
                      cudaStream_t stream) {
  require(outer >= 0 && channels >= 0 && inner >= 0, "launch_bias_grad",
          "outer, channels, inner must be >= 0");
  if (channels == 0) return;  // outer * inner == 0 still launches: db is written with zeros
  require(db != nullptr, "launch_bias_grad", "db is null");
  require(dy != nullptr || std::size_t(outer) * std::size_t(inner) == 0, "launch_bias_grad",
          "dy is null");
  bias_grad_kernel<<<static_cast<unsigned>(channels), kBiasGradThreads, 0, stream>>>(dy, outer, channels, inner, db);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_softmax_xent(const float* logits, const std::int32_t* labels, int rows, int C,
                         float grad_scale, float* dlogits, float* row_loss, int* bad_labels,
                         cudaStream_t stream) {
  require(rows >= 0 && C >= 0, "launch_softmax_xent", "rows and C must be >= 0");
  if (rows == 0) return;
  require(C >= 1, "launch_softmax_xent", "C must be >= 1 when rows > 0");
  require(logits != nullptr && labels != nullptr && dlogits != nullptr &&
              row_loss != nullptr && bad_labels != nullptr,
          "launch_softmax_xent", "a pointer is null");
  softmax_xent_kernel<<<grid_for(std::size_t(rows), kRowThreads), kRowThreads, 0, stream>>>(
      logits, labels, rows, C, grad_scale, dlogits, row_loss, bad_labels);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_mse(const float* y, const float* t, int rows, int C, float grad_scale, float* dy,
                float* row_loss, cudaStream_t stream) {
  require(rows >= 0 && C >= 0, "launch_mse", "rows and C must be >= 0");
  if (rows == 0) return;
  require(row_loss != nullptr && (C == 0 || (y != nullptr && t != nullptr && dy != nullptr)),
          "launch_mse", "a pointer is null");
  mse_kernel<<<grid_for(std::size_t(rows), kRowThreads), kRowThreads, 0, stream>>>(
      y, t, rows, C, grad_scale, dy, row_loss);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_count_correct(const float* logits, const std::int32_t* labels, int rows, int C,
                          unsigned long long* correct, cudaStream_t stream) {
  require(rows >= 0 && C >= 0, "launch_count_correct", "rows and C must be >= 0");
  if (rows == 0) return;
  require(labels != nullptr && correct != nullptr && (C == 0 || logits != nullptr),
          "launch_count_correct", "a pointer is null");
  count_correct_kernel<<<grid_for(std::size_t(rows), kRowThreads), kRowThreads, 0, stream>>>(
      logits, labels, rows, C, correct);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_program(const math::Program& p, const ProgramArrays& arrays, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  require(p.arrays >= 0 && p.arrays <= math::Program::kMaxRegisters && p.n_ops >= 0 && p.n_ops <= math::Program::kMaxOps,
          "launch_program", "a program out of bounds");
  for (int k = 0; k < p.arrays; ++k) require(arrays.p[k] != nullptr, "launch_program", "an array is null");
  for (int o = 0; o < p.n_ops; ++o) {
    const math::Op& op = p.ops[o];
    require(op.dst < math::Program::kMaxRegisters && op.x < math::Program::kMaxRegisters &&
                op.y < math::Program::kMaxRegisters, "launch_program", "an op names a register out of bounds");
    require(op.live_a < math::Program::kMaxLive && op.live_b < math::Program::kMaxLive, "launch_program",
            "an op names a live scalar out of bounds");
    require(p.live || (op.live_a < 0 && op.live_b < 0), "launch_program", "an op reads a live scalar, but live is null");
  }
  static_assert(kThreads >= math::Program::kMaxLive, "a block reads the live scalars with one thread each");
  program_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(p, arrays, n);
  PSLAB_CUDA_CHECK_LAUNCH();
}

// ---- scalars written in order with the work ----------------------------------------------

__global__ void write_scalars_kernel(float* dst, const ScalarValues v, int n) {
  if (int(threadIdx.x) < n) dst[threadIdx.x] = v.v[threadIdx.x];
}

void launch_write_scalars(float* dst, const ScalarValues& values, int n, cudaStream_t stream) {
  require(n >= 0 && n <= ScalarValues::kMax, "launch_write_scalars", "more scalars than ScalarValues holds");
  if (n == 0) return;
  require(dst != nullptr, "launch_write_scalars", "dst is null");
  write_scalars_kernel<<<1, ScalarValues::kMax, 0, stream>>>(dst, values, n);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_im2col(const float* x, const math::ConvGeometry& g, int B, float* cols,
                   cudaStream_t stream) {
  check_geometry(g, "launch_im2col");
  require(B >= 0, "launch_im2col", "B must be >= 0");
  const std::size_t rows = std::size_t(g.C) * std::size_t(g.KH) * std::size_t(g.KW);
  const int ncols = B * g.OH() * g.OW();
  const std::size_t n = rows * std::size_t(ncols);
  if (n == 0) return;
  require(cols != nullptr && (x != nullptr || std::size_t(g.H) * std::size_t(g.W) == 0),
          "launch_im2col", "x or cols is null");
  im2col_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, g, cols, n, ncols);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_col2im(const float* cols, const math::ConvGeometry& g, int B, float* dx,
                   cudaStream_t stream) {
  check_geometry(g, "launch_col2im");
  require(B >= 0, "launch_col2im", "B must be >= 0");
  const std::size_t n = std::size_t(B) * std::size_t(g.C) * std::size_t(g.H) * std::size_t(g.W);
  if (n == 0) return;
  require(dx != nullptr && (cols != nullptr || g.OH() * g.OW() == 0), "launch_col2im",
          "cols or dx is null");
  col2im_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(cols, g, B, dx, n);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_gather_rows(const void* src, const std::uint32_t* idx, std::size_t n, std::size_t row_bytes, void* dst,
                        cudaStream_t stream) {
  require(row_bytes % 4 == 0, "launch_gather_rows", "row_bytes must be a multiple of 4");
  const std::size_t words = n * (row_bytes / 4);
  if (words == 0) return;
  require(src != nullptr && idx != nullptr && dst != nullptr, "launch_gather_rows", "src, idx or dst is null");
  gather_rows_kernel<<<grid_for(words, kThreads), kThreads, 0, stream>>>(
      static_cast<const std::uint32_t*>(src), idx, row_bytes / 4, static_cast<std::uint32_t*>(dst), words);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_augment_images(const float* src, const std::uint32_t* idx, std::size_t n, int C, int H, int W, std::uint64_t seed,
                           std::uint64_t epoch, int pad, float* dst, cudaStream_t stream) {
  require(C > 0 && H > 0 && W > 0 && pad >= 0, "launch_augment_images", "C, H, W must be > 0 and pad >= 0");
  const std::size_t total = n * std::size_t(C) * std::size_t(H) * std::size_t(W);
  if (total == 0) return;
  require(src != nullptr && idx != nullptr && dst != nullptr && src != dst, "launch_augment_images",
          "src, idx or dst is null, or dst is src");
  augment_images_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(src, idx, C, H, W, seed, epoch, pad, dst, total);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_swap_outer(const float* x, int A, int B, int N, float* y, cudaStream_t stream) {
  require(A >= 0 && B >= 0 && N >= 0, "launch_swap_outer", "A, B and N must be >= 0");
  const std::size_t n = std::size_t(A) * std::size_t(B) * std::size_t(N);
  if (n == 0) return;
  require(x != nullptr && y != nullptr, "launch_swap_outer", "x or y is null");
  swap_outer_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, A, B, N, y, n);
  PSLAB_CUDA_CHECK_LAUNCH();
}

void launch_scale_matrix(int M, int N, float beta, float* C, int ldc, cudaStream_t stream) {
  require(M >= 0 && N >= 0, "launch_scale_matrix", "M and N must be >= 0");
  const std::size_t n = std::size_t(M) * std::size_t(N);
  if (n == 0) return;
  require(ldc >= N, "launch_scale_matrix", "ldc must be >= N");
  require(C != nullptr, "launch_scale_matrix", "C is null");
  scale_matrix_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(M, N, beta, C, ldc);
  PSLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace pslab::cuda
