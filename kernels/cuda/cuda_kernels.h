// CUDA kernels of the CUDA backend, one per Backend op, each behind a host launcher.
//
// Every launcher: checks its preconditions (sizes >= 0, pointers non-null when there is work;
// std::invalid_argument otherwise), returns without launching when there is nothing to do,
// launches on `stream` (asynchronously: it does not wait for the kernel), and checks the
// launch (PSLAB_CUDA_CHECK_LAUNCH). All pointers are device pointers; sizes are element
// counts; arrays are row-major. The per-element / per-row arithmetic is the one of
// kernels/elementwise.h, so it matches the CPU backend's up to floating-point contraction (nvcc
// fuses a*b+c into FMA) and the last ulp of expf/logf/sqrtf.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "elementwise.h"

namespace pslab::cuda {

// Whether this build's kernels can run on the current device: cudaSuccess, or the error
// (e.g. cudaErrorNoKernelImageForDevice for a GPU older than the compiled architectures).
// Creates the device's context if needed; launches nothing.
cudaError_t probe_kernel_image();

// ---- elementwise ---------------------------------------------------------------------------

// x (n) = value
void launch_fill(float* x, std::size_t n, float value, cudaStream_t stream);
// y (n) += a * x (n)
void launch_axpy(std::size_t n, float a, const float* x, float* y, cudaStream_t stream);
// x (n) *= a
void launch_scale(std::size_t n, float a, float* x, cudaStream_t stream);
// y (n) = relu(x (n)); y may alias x
void launch_relu_forward(const float* x, float* y, std::size_t n, cudaStream_t stream);
// dx (n) = relu_grad(dy (n), y (n)) = dy where y > 0 else 0; dx may alias dy
void launch_relu_backward(const float* dy, const float* y, float* dx, std::size_t n,
                          cudaStream_t stream);

// Backend::batch_norm_forward / batch_norm_backward: one block per channel, sums in double.
void launch_batch_norm_forward(const float* x, int B, int C, int HW, const float* gamma, const float* beta,
                               bool training, float momentum, float eps, float* running_mean, float* running_var,
                               float* saved_mean, float* saved_invstd, float* y, cudaStream_t stream);
void launch_batch_norm_backward(const float* x, const float* dy, int B, int C, int HW, const float* gamma,
                                const float* saved_mean, const float* saved_invstd, float* dgamma, float* dbeta,
                                float* dx, cudaStream_t stream);

// ---- reductions ----------------------------------------------------------------------------

// Number of doubles launch_sum_squares_partials writes for n elements: one per block, in
// [1, 1024], a function of n alone (so the final sum is the same on every GPU).
int sum_squares_partial_count(std::size_t n);
// partials (sum_squares_partial_count(n)) = per-block sums of x[i]^2, accumulated in double;
// the caller adds them up in order. n == 0: nothing is launched and nothing written.
void launch_sum_squares_partials(const float* x, std::size_t n, double* partials,
                                 cudaStream_t stream);

// ---- layers --------------------------------------------------------------------------------

// y (outer, channels, inner) += bias (channels), broadcast over outer and inner
void launch_add_bias(float* y, const float* bias, int outer, int channels, int inner,
                     cudaStream_t stream);
// db (channels) = sum over outer and inner of dy (outer, channels, inner); one block per
// channel, float accumulation, fixed reduction tree (deterministic). outer * inner == 0
// writes db = 0 (as the CPU backend does).
void launch_bias_grad(const float* dy, int outer, int channels, int inner, float* db,
                      cudaStream_t stream);

// ---- losses (one thread per row) -----------------------------------------------------------

// logits (rows, C), labels (rows) -> dlogits (rows, C) = grad_scale * (softmax - onehot),
// row_loss (rows) = -log softmax[label] in nats (math::softmax_xent_row).
// A row whose label is outside [0, C) is not evaluated: its loss and gradient are NaN and
// *bad_labels (1 int, zeroed by the caller) is incremented. C >= 1 when rows > 0.
void launch_softmax_xent(const float* logits, const std::int32_t* labels, int rows, int C,
                         float grad_scale, float* dlogits, float* row_loss, int* bad_labels,
                         cudaStream_t stream);
// y, t (rows, C) -> dy (rows, C) = grad_scale * (y - t), row_loss (rows) = 0.5 |y - t|^2
// (math::mse_row)
void launch_mse(const float* y, const float* t, int rows, int C, float grad_scale, float* dy,
                float* row_loss, cudaStream_t stream);
// *correct (1 unsigned long long, zeroed by the caller) += number of rows r of logits
// (rows, C) with math::argmax_row(row r) == labels[r] (labels (rows))
void launch_count_correct(const float* logits, const std::int32_t* labels, int rows, int C,
                          unsigned long long* correct, cudaStream_t stream);

// ---- element-wise programs (math::Program) -------------------------------------------------

// The arrays of a program, by value into the kernel.
struct ProgramArrays {
  float* p[math::Program::kMaxRegisters];
};
// For i in [0, n): the program's ops on element i of `arrays` (math::apply_op), the arrays it
// marks as outputs written at the end.
// Live scalars (Program::live) are read as the kernel begins.
void launch_program(const math::Program& p, const ProgramArrays& arrays, std::size_t n, cudaStream_t stream);

// ---- scalars written in order with the work (Backend::write_scalars) -----------------------

// The values, by value into the kernel: the host's copy is free once the launch returns.
struct ScalarValues {
  static constexpr int kMax = 8;
  float v[kMax];
};
// dst[0, n) = values.v[0, n), n <= ScalarValues::kMax.
void launch_write_scalars(float* dst, const ScalarValues& values, int n, cudaStream_t stream);

// ---- convolution helpers, a whole batch per launch -----------------------------------------
// Geometry preconditions: C, H, W, pad >= 0; KH, KW, stride >= 1; OH, OW >= 0.

// x (B, C, H, W) -> cols (C*KH*KW, B*OH*OW), one thread per column-matrix element
// (math::im2col_batch_value)
void launch_im2col(const float* x, const math::ConvGeometry& g, int B, float* cols,
                   cudaStream_t stream);
// cols (C*KH*KW, B*OH*OW) -> dx (B, C, H, W) overwritten, one thread per image element
// gathering its contributions (math::col2im_value; no atomics, deterministic)
void launch_col2im(const float* cols, const math::ConvGeometry& g, int B, float* dx,
                   cudaStream_t stream);
// dst row k = src row idx[k], rows of row_bytes (a multiple of 4), one thread per 32-bit word
// (math::gather_source_word)
void launch_augment_images(const float* src, const std::uint32_t* idx, std::size_t n, int C, int H, int W, std::uint64_t seed,
                           std::uint64_t epoch, int pad, float* dst, cudaStream_t stream);
void launch_gather_rows(const void* src, const std::uint32_t* idx, std::size_t n, std::size_t row_bytes, void* dst,
                        cudaStream_t stream);
// y (B, A, N) = x (A, B, N), one thread per element
void launch_swap_outer(const float* x, int A, int B, int N, float* y, cudaStream_t stream);

// ---- GEMM helper ---------------------------------------------------------------------------

// C (M, N; row stride ldc) = beta * C, and = 0 when beta == 0 (C is then not read, as in
// BLAS). The GEMM of an empty inner dimension (K == 0), which cuBLAS need not accept.
void launch_scale_matrix(int M, int N, float beta, float* C, int ldc, cudaStream_t stream);

}  // namespace pslab::cuda
