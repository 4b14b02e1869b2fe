// CUDA backend: cuBLAS for matrix products, the kernels of cuda_kernels.cu (which call the
// functions of kernels/elementwise.h) for the rest. Mirrors kernels/cpu/cpu_backend.cpp op for op.
//
// All work is queued on one stream owned by the backend (the cuBLAS handle is bound to it).
// Ops that return a host value (losses, count_correct, sum_squares) and copy_to_host /
// copy_from_host wait for that stream; the others return as soon as the work is queued.
// Step graphs (Backend::begin_recording): CUDA stream capture of that stream, in thread-local
// mode; while it records, the ops that would wait, copy to or from the host, or allocate throw
// (not_while_recording), and a graph remembers the buffers it was recorded on, so that a replay
// after one of them moved is refused rather than run on freed memory.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cudnn.h"

namespace pslab {
namespace {

// ---- RAII owners -----------------------------------------------------------------------------
// Their destructors run where exceptions must not escape: failures are reported on stderr.

void report_cleanup_error(const char* what, const char* detail) noexcept {
  std::fprintf(stderr, "pslab cuda backend: %s failed: %s\n", what, detail);
}

class Stream {
 public:
  Stream() {
    // Non-blocking: no implicit order with the legacy default stream (nothing here uses it; every
    // copy goes through a backend stream), which a stream being captured as a step graph must not
    // have: a legacy-stream call anywhere in the process would break the capture.
    PSLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
  }
  ~Stream() {
    if (const cudaError_t e = cudaStreamDestroy(s_); e != cudaSuccess)
      report_cleanup_error("cudaStreamDestroy", cudaGetErrorString(e));
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream) {
    const cublasStatus_t st = cublasCreate(&h_);
    if (st != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error(std::string("no usable CUDA GPU: cublasCreate failed: ") +
                               cublasGetStatusString(st));
    try {
      PSLAB_CUBLAS_CHECK(cublasSetStream(h_, stream));
      // Plain FP32 GEMMs (no TF32 tensor-core rounding), as on the CPU. This is cuBLAS's
      // default; set explicitly so that the intent is visible.
      PSLAB_CUBLAS_CHECK(cublasSetMathMode(h_, CUBLAS_DEFAULT_MATH));
      PSLAB_CUBLAS_CHECK(cublasSetPointerMode(h_, CUBLAS_POINTER_MODE_HOST));
    } catch (...) {
      cublasDestroy(h_);
      throw;
    }
  }
  ~CublasHandle() {
    if (const cublasStatus_t st = cublasDestroy(h_); st != CUBLAS_STATUS_SUCCESS)
      report_cleanup_error("cublasDestroy", cublasGetStatusString(st));
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

// A CUDA event without timing: marks a point in the stream to wait for.
class Event {
 public:
  Event() { PSLAB_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  ~Event() {
    if (const cudaError_t e = cudaEventDestroy(e_); e != cudaSuccess) {
      (void)cudaGetLastError();
      report_cleanup_error("cudaEventDestroy", cudaGetErrorString(e));
    }
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_{};
};

// Device scratch for reductions (per-row losses, partial sums, counters). Grows to the
// largest size asked for and is then reused: no allocation per call once grown. Growing frees
// the old block first; cudaFree waits for the device, so no queued kernel still uses it.
class Scratch {
 public:
  Scratch() = default;
  ~Scratch() { release(); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  std::size_t capacity() const { return cap_; }
  const void* data() const { return p_; }
  void* get(std::size_t bytes) {
    if (bytes > cap_) {
      const std::size_t want = std::max(bytes, 2 * cap_);
      release();
      PSLAB_CUDA_CHECK(cudaMalloc(&p_, want));
      cap_ = want;
    }
    return p_;
  }

 private:
  void release() noexcept {
    if (!p_) return;
    if (const cudaError_t e = cudaFree(p_); e != cudaSuccess) {
      (void)cudaGetLastError();
      report_cleanup_error("cudaFree (scratch)", cudaGetErrorString(e));
    }
    p_ = nullptr;
    cap_ = 0;
  }
  void* p_ = nullptr;
  std::size_t cap_ = 0;
};

// Device setup failures mean that this GPU cannot be used: say so, with CUDA's reason.
void usable_or_throw(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  throw std::runtime_error(std::string("no usable CUDA GPU: ") + cudaGetErrorString(e) + " (" +
                           what + " returned " + cudaGetErrorName(e) + ")");
}

cublasOperation_t cublas_op(Trans t) { return t == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

// Bytes of scratch before the per-row losses: a counter, padded to keep the floats aligned.
constexpr std::size_t kCounterBytes = 16;

// cuBLAS's workspace, the backend's own: what a recorded GEMM uses at every replay (cuBLAS
// recommends 32 MiB on Hopper; less limits the algorithms it may choose).
constexpr std::size_t kCublasWorkspaceBytes = std::size_t(32) << 20;

// The device memory a recording used besides the caller's buffers: a replay needs it where it was
// (null: the recording did not use it, and it may move).
struct Buffers {
  const void* scratch = nullptr;
  const void* loss_dev = nullptr;
  const void* loss_host = nullptr;
  const void* cudnn_workspace = nullptr;
  bool tf32 = false;
  // Whether a graph recorded on `this` may replay on `now`.
  bool still(const Buffers& now) const {
    auto same = [](const void* used, const void* at) { return !used || used == at; };
    return same(scratch, now.scratch) && same(loss_dev, now.loss_dev) && same(loss_host, now.loss_host) &&
           same(cudnn_workspace, now.cudnn_workspace) && tf32 == now.tf32;
  }
};

// An instantiated CUDA graph, and the deferred loss its replay leaves pending (the graph
// records the backend's loss_ready_ event once that loss landed).
class CudaGraph final : public Backend::Graph {
 public:
  CudaGraph(cudaGraphExec_t exec, Buffers used, int loss_rows, int loss_C)
      : exec_(exec), used_(used), loss_rows_(loss_rows), loss_C_(loss_C) {}
  ~CudaGraph() override {
    if (const cudaError_t e = cudaGraphExecDestroy(exec_); e != cudaSuccess) {
      (void)cudaGetLastError();
      report_cleanup_error("cudaGraphExecDestroy", cudaGetErrorString(e));
    }
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  cudaGraphExec_t exec() const { return exec_; }
  const Buffers& used() const { return used_; }
  int loss_rows() const { return loss_rows_; }
  int loss_C() const { return loss_C_; }

 private:
  cudaGraphExec_t exec_;
  Buffers used_;
  int loss_rows_, loss_C_;  // the deferred loss it computes (rows 0: none)
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device_index) : device_(device_index) {
    const std::string use_cudnn = cudnn_setting();  // (refused before anything is allocated)
    cudaDeviceProp prop{};
    usable_or_throw(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
    usable_or_throw(cudaSetDevice(device_), "cudaSetDevice");
    // Creates the context and checks that the kernels were compiled for this GPU, so that an
    // unusable device is reported here rather than at the first launch.
    if (const cudaError_t e = cuda::probe_kernel_image(); e != cudaSuccess)
      throw std::runtime_error(
          std::string("no usable CUDA GPU: ") + cudaGetErrorString(e) + " (device " +
          std::to_string(device_) + " is " + prop.name + ", cc " + std::to_string(prop.major) +
          "." + std::to_string(prop.minor) +
          "; check CMAKE_CUDA_ARCHITECTURES of this build)");
    stream_ = std::make_unique<Stream>();
    cublas_ = std::make_unique<CublasHandle>(stream_->get());
    PSLAB_CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
    PSLAB_CUBLAS_CHECK(cublasSetWorkspace(cublas_->get(), cublas_workspace_, kCublasWorkspaceBytes));
    if (use_cudnn == "off")
      no_cudnn_ = "PSLAB_CUDNN=off";
    else
      cudnn_ = cuda::Cudnn::open(stream_->get(),
                                 use_cudnn == "timed" ? cuda::ConvAlgorithms::timed : cuda::ConvAlgorithms::heuristic,
                                 &no_cudnn_);
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f GiB",
                  double(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
    describe_ = "cuda:" + std::to_string(device_) + " (" + prop.name + ", cc " +
                std::to_string(prop.major) + "." + std::to_string(prop.minor) + ", " + mem +
                ")";
  }
  ~CudaBackend() override {
    // Let queued work finish before the stream, handle and scratch go away.
    if (const cudaError_t e = cudaStreamSynchronize(stream_->get()); e != cudaSuccess)
      report_cleanup_error("cudaStreamSynchronize", cudaGetErrorString(e));
    loss_branch_.reset();  // (its copy into loss_host_ landed)
    deallocate_host(loss_host_);
    deallocate(cublas_workspace_);  // (the handle makes no more calls that use it)
  }

  Device device() const override { return Device::cuda; }
  ImageLayout image_layout() const override { return ImageLayout::nchw; }  // cuDNN's and im2col's
  int gpu() const override { return device_; }
  std::string gpu_bus_id() const override {
    char id[32] = {};
    PSLAB_CUDA_CHECK(cudaDeviceGetPCIBusId(id, int(sizeof id), device_));
    return id;
  }
  std::string describe() const override {
    return describe_ + (tf32_ ? ", TF32 GEMMs" : "") +
           (cudnn_ ? ", " + cudnn_->describe() : ", convolutions by im2col (no cuDNN: " + no_cudnn_ + ")");
  }
  void allow_tf32(bool on) override {
    activate();
    PSLAB_CUBLAS_CHECK(cublasSetMathMode(cublas_->get(), on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    if (cudnn_) cudnn_->allow_tf32(on);
    tf32_ = on;
  }

  // ---- memory ----
  void* allocate(std::size_t bytes) override {
    if (bytes == 0) return nullptr;
    not_while_recording("allocate");
    activate();
    void* p = nullptr;
    try {
      PSLAB_CUDA_CHECK(cudaMalloc(&p, bytes));
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(std::string(e.what()) + " [allocating " + std::to_string(bytes) +
                               " bytes on " + describe_ + "]");
    }
    return p;
  }
  void deallocate(void* p) noexcept override {
    if (!p) return;
    // cudaFree waits for the device, so work still queued on p completes first.
    if (cudaSetDevice(device_) != cudaSuccess) (void)cudaGetLastError();
    if (const cudaError_t e = cudaFree(p); e != cudaSuccess) {
      (void)cudaGetLastError();
      report_cleanup_error("cudaFree", cudaGetErrorString(e));
    }
  }
  void* allocate_host(std::size_t bytes) override {
    if (bytes == 0) return nullptr;
    not_while_recording("allocate_host");
    activate();
    void* p = nullptr;
    PSLAB_CUDA_CHECK(cudaMallocHost(&p, bytes));
    return p;
  }
  void deallocate_host(void* p) noexcept override {
    if (!p) return;
    if (const cudaError_t e = cudaFreeHost(p); e != cudaSuccess) {
      (void)cudaGetLastError();
      report_cleanup_error("cudaFreeHost", cudaGetErrorString(e));
    }
  }
  // Synchronous, like the CPU backend: on return the host buffer may be reused (it may be
  // pinned, where an unsynchronized async copy would still be reading it).
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) override {
    if (bytes == 0) return;
    not_while_recording("copy_from_host");
    activate();
    PSLAB_CUDA_CHECK(
        cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_->get()));
    PSLAB_CUDA_CHECK(cudaStreamSynchronize(stream_->get()));
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    not_while_recording("copy_to_host");
    activate();
    PSLAB_CUDA_CHECK(
        cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_->get()));
    PSLAB_CUDA_CHECK(cudaStreamSynchronize(stream_->get()));
  }
  // In order with the work: the values travel in a one-block kernel's arguments.
  void write_scalars(float* dst, const float* values, int n) override {
    not_while_recording("write_scalars");
    static_assert(cuda::ScalarValues::kMax == kMaxScalarWrite);
    if (n < 0 || n > kMaxScalarWrite) throw std::logic_error("CudaBackend::write_scalars: more than 8 scalars");
    activate();
    cuda::ScalarValues v{};
    std::copy(values, values + n, v.v);
    cuda::launch_write_scalars(dst, v, n, stream_->get());
  }
  // Device to device, queued on the stream. Overlapping ranges are allowed, as with the CPU
  // backend's memmove: cudaMemcpy's result is undefined for them, so they go through the
  // scratch buffer.
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    activate();
    const auto d = reinterpret_cast<std::uintptr_t>(dst);
    const auto s = reinterpret_cast<std::uintptr_t>(src);
    if (d < s + bytes && s < d + bytes) {
      void* tmp = scratch(bytes);
      PSLAB_CUDA_CHECK(
          cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, stream_->get()));
      src = tmp;
    }
    PSLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_->get()));
  }
  void fill(float* x, std::size_t n, float value) override {
    activate();
    cuda::launch_fill(x, n, value, stream_->get());
  }
  void synchronize() override {
    not_while_recording("synchronize");
    activate();
    PSLAB_CUDA_CHECK(cudaStreamSynchronize(stream_->get()));
    if (lane_) PSLAB_CUDA_CHECK(cudaStreamSynchronize(lane_->stream.get()));
    if (loss_branch_) PSLAB_CUDA_CHECK(cudaStreamSynchronize(loss_branch_->stream.get()));
  }

  // ---- copies beside the compute: the copy lane (a second stream, so the copy engine) ----
  // Each copy first waits (on the device) for the work queued on the compute stream so far, then
  // records its ticket's event on the lane; copies on one stream land in order.
  Ticket download_async(void* host_dst, const void* src, std::size_t bytes) override {
    return queue_copy(host_dst, src, bytes, cudaMemcpyDeviceToHost);
  }
  Ticket upload_async(void* dst, const void* host_src, std::size_t bytes) override {
    last_upload_ = queue_copy(dst, host_src, bytes, cudaMemcpyHostToDevice);
    return last_upload_;
  }
  bool register_host(void* p, std::size_t bytes) override {
    if (!p || bytes == 0) return true;
    not_while_recording("register_host");
    activate();
    const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e == cudaSuccess) return true;
    (void)cudaGetLastError();  // not sticky: the memory is used unregistered
    std::fprintf(stderr, "pslab cuda backend: cudaHostRegister of %zu bytes failed (%s): copies to and from it are staged\n",
                 bytes, cudaGetErrorString(e));
    return false;
  }
  void unregister_host(void* p) noexcept override {
    if (!p) return;
    if (const cudaError_t e = cudaHostUnregister(p); e != cudaSuccess) {
      (void)cudaGetLastError();
      report_cleanup_error("cudaHostUnregister", cudaGetErrorString(e));
    }
  }
  bool landed(Ticket t, bool wait) override {
    if (t <= landed_) return true;
    not_while_recording("landed");
    if (t > tickets_) throw std::logic_error("CudaBackend::landed: ticket " + std::to_string(t) + " was never given (last " +
                                             std::to_string(tickets_) + ")");
    activate();
    // Not landed yet, so ticket t still owns its slot (a slot is reused only after it landed).
    const cudaEvent_t done = lane_->slots[t % CopyLane::kSlots].done.get();
    const cudaError_t e = wait ? cudaEventSynchronize(done) : cudaEventQuery(done);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    PSLAB_CUDA_CHECK(e);
    landed_ = t;
    return true;
  }
  void upload_fence() override {
    if (last_upload_ <= fenced_) return;
    not_while_recording("upload_fence");
    fenced_ = last_upload_;
    if (last_upload_ <= landed_) return;
    activate();
    PSLAB_CUDA_CHECK(cudaStreamWaitEvent(stream_->get(), lane_->slots[last_upload_ % CopyLane::kSlots].done.get(), 0));
  }

  // ---- linear algebra ----
  // Row-major C (M,N) is column-major C^T (N,M) with the same ldc, and likewise for A and B;
  // so compute C^T = alpha * op(B)^T op(A)^T + beta * C^T: cuBLAS gets B first, then A, with
  // M and N swapped and the transpose flags unchanged.
  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    if (M < 0 || N < 0 || K < 0)
      throw std::invalid_argument("gemm: M, N, K must be >= 0 (got " + std::to_string(M) +
                                  ", " + std::to_string(N) + ", " + std::to_string(K) + ")");
    if (M == 0 || N == 0) return;
    activate();
    if (K == 0) {  // C = beta * C, as BLAS defines it (and OpenBLAS does)
      cuda::launch_scale_matrix(M, N, beta, C, ldc, stream_->get());
      return;
    }
    PSLAB_CUBLAS_CHECK(cublasSgemm(cublas_->get(), cublas_op(tb), cublas_op(ta), N, M, K,
                                   &alpha, B, ldb, A, lda, &beta, C, ldc));
  }
  void axpy(std::size_t n, float a, const float* x, float* y) override {
    activate();
    cuda::launch_axpy(n, a, x, y, stream_->get());
  }
  void scale(std::size_t n, float a, float* x) override {
    activate();
    cuda::launch_scale(n, a, x, stream_->get());
  }
  // Per-block double partials on the device, added in block order on the host: deterministic
  // (the partition depends on n alone). The CPU adds the squares in index order instead.
  double sum_squares(const float* x, std::size_t n) override {
    if (n == 0) return 0.0;
    activate();
    const int parts = cuda::sum_squares_partial_count(n);
    not_while_recording("sum_squares");
    auto* partials = static_cast<double*>(scratch(std::size_t(parts) * sizeof(double)));
    cuda::launch_sum_squares_partials(x, n, partials, stream_->get());
    host_doubles_.resize(std::size_t(parts));
    copy_to_host(host_doubles_.data(), partials, std::size_t(parts) * sizeof(double));
    double s = 0.0;
    for (const double p : host_doubles_) s += p;
    return s;
  }

  // ---- layers ----
  void add_bias(float* y, const float* bias, int outer, int channels, int inner) override {
    activate();
    cuda::launch_add_bias(y, bias, outer, channels, inner, stream_->get());
  }
  void bias_grad(const float* dy, int outer, int channels, int inner, float* db) override {
    activate();
    cuda::launch_bias_grad(dy, outer, channels, inner, db, stream_->get());
  }
  void relu_forward(const float* x, float* y, std::size_t n) override {
    activate();
    cuda::launch_relu_forward(x, y, n, stream_->get());
  }
  void relu_backward(const float* dy, const float* y, float* dx, std::size_t n) override {
    activate();
    cuda::launch_relu_backward(dy, y, dx, n, stream_->get());
  }
  void batch_norm_forward(const float* x, int B, int C, int HW, const float* gamma, const float* beta, bool training,
                          float momentum, float eps, float* running_mean, float* running_var, float* saved_mean,
                          float* saved_invstd, float* y) override {
    activate();
    if (cudnn_ && cuda::Cudnn::runs_batch_norm(eps, B, HW))
      return cudnn_->batch_norm_forward(x, B, C, HW, gamma, beta, training, momentum, eps, running_mean, running_var,
                                        saved_mean, saved_invstd, y);
    cuda::launch_batch_norm_forward(x, B, C, HW, gamma, beta, training, momentum, eps, running_mean, running_var,
                                    saved_mean, saved_invstd, y, stream_->get());
  }
  void batch_norm_backward(const float* x, const float* dy, int B, int C, int HW, const float* gamma,
                           const float* saved_mean, const float* saved_invstd, float* dgamma, float* dbeta,
                           float* dx) override {
    activate();
    if (cudnn_ && cuda::Cudnn::runs_batch_norm_backward(B, HW, dy, dx))
      return cudnn_->batch_norm_backward(x, dy, B, C, HW, gamma, saved_mean, saved_invstd, dgamma, dbeta, dx);
    cuda::launch_batch_norm_backward(x, dy, B, C, HW, gamma, saved_mean, saved_invstd, dgamma, dbeta, dx,
                                     stream_->get());
  }

  // ---- losses ----
  // Per-row losses (float, from math::*_row) are copied to the host and added in row order
  // in double: the same summation as the CPU backend's.
  double softmax_xent(const float* logits, const std::int32_t* labels, int rows, int C,
                      float grad_scale, float* dlogits) override {
    if (rows < 0 || C < 0)
      throw std::invalid_argument("softmax_xent: rows and C must be >= 0");
    if (rows == 0) return 0.0;
    not_while_recording("softmax_xent");
    activate();
    const std::size_t bytes = kCounterBytes + std::size_t(rows) * sizeof(float);
    auto* base = static_cast<unsigned char*>(scratch(bytes));
    auto* bad = reinterpret_cast<int*>(base);
    auto* row_loss = reinterpret_cast<float*>(base + kCounterBytes);
    PSLAB_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), stream_->get()));
    cuda::launch_softmax_xent(logits, labels, rows, C, grad_scale, dlogits, row_loss, bad,
                              stream_->get());
    host_bytes_.resize(bytes);
    copy_to_host(host_bytes_.data(), base, bytes);
    int bad_rows = 0;
    std::memcpy(&bad_rows, host_bytes_.data(), sizeof bad_rows);
    if (bad_rows != 0)
      throw std::invalid_argument("softmax_xent: " + std::to_string(bad_rows) + " of " +
                                  std::to_string(rows) + " labels lie outside [0, " +
                                  std::to_string(C) + ")");
    return sum_row_losses(host_bytes_.data() + kCounterBytes, rows);
  }
  double mse(const float* y, const float* t, int rows, int C, float grad_scale,
             float* dy) override {
    if (rows < 0 || C < 0) throw std::invalid_argument("mse: rows and C must be >= 0");
    if (rows == 0) return 0.0;
    not_while_recording("mse");
    activate();
    const std::size_t bytes = std::size_t(rows) * sizeof(float);
    auto* row_loss = static_cast<float*>(scratch(bytes));
    cuda::launch_mse(y, t, rows, C, grad_scale, dy, row_loss, stream_->get());
    host_bytes_.resize(bytes);
    copy_to_host(host_bytes_.data(), row_loss, bytes);
    return sum_row_losses(host_bytes_.data(), rows);
  }
  // Deferred: the per-row losses (and the bad-label count) go to buffers of their own, on the
  // device and page-locked on the host, copied asynchronously behind the loss kernel; an
  // event marks the copy, so take_loss() waits for it and not for the work queued after.
  void softmax_xent_deferred(const float* logits, const std::int32_t* labels, int rows, int C, float grad_scale,
                             float* dlogits) override {
    auto* base = begin_deferred_loss("softmax_xent", rows, C);
    if (!base) return;
    cuda::launch_softmax_xent(logits, labels, rows, C, grad_scale, dlogits,
                              reinterpret_cast<float*>(base + kCounterBytes), reinterpret_cast<int*>(base), stream_->get());
    copy_loss_back(base, kCounterBytes + std::size_t(rows) * sizeof(float));
    pending_ = {rows, C};  // (only once all of it is queued: a throw above leaves nothing pending)
  }
  void mse_deferred(const float* y, const float* t, int rows, int C, float grad_scale, float* dy) override {
    auto* base = begin_deferred_loss("mse", rows, C);  // its bad-label count stays 0
    if (!base) return;
    cuda::launch_mse(y, t, rows, C, grad_scale, dy, reinterpret_cast<float*>(base + kCounterBytes), stream_->get());
    copy_loss_back(base, kCounterBytes + std::size_t(rows) * sizeof(float));
    pending_ = {rows, C};
  }
  double take_loss() override {
    if (pending_.rows == 0) return 0.0;
    not_while_recording("take_loss");
    if (!loss_ready_) throw std::logic_error("CudaBackend::take_loss: a loss pending that was never queued");
    PSLAB_CUDA_CHECK(cudaEventSynchronize(loss_ready_->get()));
    int bad_rows = 0;
    std::memcpy(&bad_rows, loss_host_, sizeof bad_rows);
    const int rows = pending_.rows;
    pending_.rows = 0;
    if (bad_rows != 0)
      throw std::invalid_argument("softmax_xent: " + std::to_string(bad_rows) + " of " + std::to_string(rows) +
                                  " labels lie outside [0, " + std::to_string(pending_.C) + ")");
    return sum_row_losses(static_cast<unsigned char*>(loss_host_) + kCounterBytes, rows);
  }
  long count_correct(const float* logits, const std::int32_t* labels, int rows,
                     int C) override {
    if (rows < 0 || C < 0) throw std::invalid_argument("count_correct: rows and C must be >= 0");
    if (rows == 0) return 0;
    not_while_recording("count_correct");
    activate();
    auto* counter = static_cast<unsigned long long*>(scratch(sizeof(unsigned long long)));
    PSLAB_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof *counter, stream_->get()));
    cuda::launch_count_correct(logits, labels, rows, C, counter, stream_->get());
    unsigned long long n = 0;
    copy_to_host(&n, counter, sizeof n);
    return static_cast<long>(n);
  }

  // ---- step graphs ----
  bool records_graphs() const override { return true; }
  void begin_recording() override {
    not_while_recording("begin_recording");
    activate();
    if (pending_.rows) throw std::logic_error("CudaBackend::begin_recording with a deferred loss not taken");
    PSLAB_CUDA_CHECK(cudaStreamBeginCapture(stream_->get(), cudaStreamCaptureModeThreadLocal));
    recording_ = true, recorded_scratch_ = recorded_cudnn_ = false;
  }
  std::unique_ptr<Graph> end_recording(std::string* why) override {
    if (!recording_) throw std::logic_error("CudaBackend::end_recording without begin_recording");
    recording_ = false;
    const Pending loss = pending_;
    pending_ = {};  // (recorded, not computed: a replay leaves it pending)
    cudaError_t joined = cudaSuccess;
    if (loss_branch_open_) {  // the loss's branch joins the compute stream: a capture ends with every fork joined
      loss_branch_open_ = false;
      joined = cudaEventRecord(loss_branch_->join.get(), loss_branch_->stream.get());
      if (joined == cudaSuccess) joined = cudaStreamWaitEvent(stream_->get(), loss_branch_->join.get(), 0);
    }
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(stream_->get(), &graph);
    if (e == cudaSuccess && joined != cudaSuccess) e = joined;  // (the graph, if any, is destroyed below)
    cudaGraphExec_t exec = nullptr;
    if (e == cudaSuccess) {
      e = cudaGraphInstantiate(&exec, graph, 0);
      if (const cudaError_t d = cudaGraphDestroy(graph); d != cudaSuccess && e == cudaSuccess) e = d;
    } else if (graph) {
      (void)cudaGraphDestroy(graph);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      if (exec) (void)cudaGraphExecDestroy(exec);
      if (why) *why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
      return nullptr;
    }
    Buffers used = buffers_now();
    if (!recorded_scratch_) used.scratch = nullptr;
    if (!recorded_cudnn_) used.cudnn_workspace = nullptr;
    return std::make_unique<CudaGraph>(exec, used, loss.rows, loss.C);
  }
  bool replay(Graph& g) override {
    not_while_recording("replay");
    auto& graph = dynamic_cast<CudaGraph&>(g);
    if (!graph.used().still(buffers_now())) return false;
    if (pending_.rows) throw std::logic_error("CudaBackend::replay with a deferred loss not taken");
    activate();
    // A loss copied outside a recording (one never taken) has left loss_dev_ and loss_host_,
    // which the graph writes again.
    if (loss_copy_queued_) PSLAB_CUDA_CHECK(cudaStreamWaitEvent(stream_->get(), loss_ready_->get(), 0));
    loss_copy_queued_ = false;
    PSLAB_CUDA_CHECK(cudaGraphLaunch(graph.exec(), stream_->get()));
    pending_ = {graph.loss_rows(), graph.loss_C()};  // (its loss_ready_ is an event node of the graph)
    return true;
  }

  // ---- element-wise programs ----
  void run(const math::Program& p, float* const* arrays, std::size_t n) override {
    activate();
    cuda::ProgramArrays a{};
    for (int k = 0; k < p.arrays && k < math::Program::kMaxRegisters; ++k) a.p[k] = arrays[k];
    cuda::launch_program(p, a, n, stream_->get());
  }

  // ---- convolution helpers ----
  void im2col(const float* x, const math::ConvGeometry& g, int B, float* cols) override {
    activate();
    cuda::launch_im2col(x, g, B, cols, stream_->get());
  }
  void col2im(const float* cols, const math::ConvGeometry& g, int B, float* dx) override {
    activate();
    cuda::launch_col2im(cols, g, B, dx, stream_->get());
  }
  void gather_rows(const void* src, const std::uint32_t* idx, std::size_t n, std::size_t row_bytes,
                   void* dst) override {
    activate();
    cuda::launch_gather_rows(src, idx, n, row_bytes, dst, stream_->get());
  }
  void augment_images(const float* src, const std::uint32_t* idx, std::size_t n, int C, int H, int W, std::uint64_t seed,
                      std::uint64_t epoch, int pad, float* dst) override {
    activate();
    cuda::launch_augment_images(src, idx, n, C, H, W, seed, epoch, pad, dst, stream_->get());
  }
  void swap_outer(const float* x, int A, int B, int N, float* y) override {
    activate();
    cuda::launch_swap_outer(x, A, B, N, y, stream_->get());
  }

  // Convolutions on cuDNN where it loaded (cudnn.h: its workspace is its own, so no scratch),
  // else Backend's im2col and cuBLAS.
  std::size_t conv_scratch_floats(const math::ConvGeometry& g, int OC, int B) override {
    return cudnn_ ? 0 : im2col_scratch_floats(g, OC, B);
  }
  void conv_forward(const float* x, const float* W, const math::ConvGeometry& g, int OC, int B, float* y,
                    float* scratch) override {
    activate();
    if (cudnn_) return B > 0 ? cudnn_for(g, OC, B).conv_forward(x, W, g, OC, B, y) : void();  // (an empty batch: nothing to write)
    Backend::conv_forward(x, W, g, OC, B, y, scratch);
  }
  void conv_backward(const float* x, const float* W, const float* dy, const math::ConvGeometry& g, int OC, int B,
                     float* dW, float* dx, float* scratch) override {
    activate();
    if (cudnn_ && B > 0) return cudnn_for(g, OC, B).conv_backward(x, W, dy, g, OC, B, dW, dx);
    Backend::conv_backward(x, W, dy, g, OC, B, dW, dx, scratch);
  }

 private:
  // The CUDA device is per host thread: make this backend's device current when the calling
  // thread has another one (cheap when it already is).
  void activate() const {
    int current = -1;
    PSLAB_CUDA_CHECK(cudaGetDevice(&current));
    if (current != device_) PSLAB_CUDA_CHECK(cudaSetDevice(device_));
  }

  // A copy on the lane after the compute queued so far; its ticket.
  Ticket queue_copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
    not_while_recording(kind == cudaMemcpyDeviceToHost ? "download_async" : "upload_async");
    activate();
    if (!lane_) lane_ = std::make_unique<CopyLane>();
    const Ticket t = tickets_ + 1;
    if (t > CopyLane::kSlots) landed(t - CopyLane::kSlots, /*wait*/ true);  // the slot's last copy
    CopyLane::Slot& slot = lane_->slots[t % CopyLane::kSlots];
    PSLAB_CUDA_CHECK(cudaEventRecord(slot.queued.get(), stream_->get()));
    PSLAB_CUDA_CHECK(cudaStreamWaitEvent(lane_->stream.get(), slot.queued.get(), 0));
    if (bytes) PSLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, lane_->stream.get()));
    PSLAB_CUDA_CHECK(cudaEventRecord(slot.done.get(), lane_->stream.get()));
    tickets_ = t;
    return t;
  }

  static double sum_row_losses(const unsigned char* bytes, int rows) {
    double loss = 0.0;
    for (int r = 0; r < rows; ++r) {
      float v;
      std::memcpy(&v, bytes + std::size_t(r) * sizeof(float), sizeof v);
      loss += v;
    }
    return loss;
  }

  // The deferred loss's device buffer, (bad-label count = 0, rows per-row losses); nullptr for
  // an empty batch (nothing to compute).
  unsigned char* begin_deferred_loss(const char* what, int rows, int C) {
    if (rows < 0 || C < 0) throw std::invalid_argument(std::string(what) + ": rows and C must be >= 0");
    pending_ = {};  // (a loss not taken is replaced; the caller sets the new one once it is queued)
    if (rows == 0) return nullptr;
    activate();
    const std::size_t bytes = kCounterBytes + std::size_t(rows) * sizeof(float);
    if (recording_ && bytes > loss_dev_.capacity()) not_while_recording("a deferred loss larger than any before it");
    if (recording_ && loss_branch_open_)  // (its copy would still read the buffer this one writes)
      throw std::logic_error("CudaBackend: a second deferred loss in one step graph");
    auto* base = static_cast<unsigned char*>(loss_dev_.get(bytes));
    // The last loss's copy (on the loss branch) has read the buffer before it is written again:
    // waited for where it was queued outside a recording (loss_ready_ then marks it; one a graph
    // made ended with its graph, and a recording starts with the last loss taken).
    if (loss_copy_queued_ && !recording_) PSLAB_CUDA_CHECK(cudaStreamWaitEvent(stream_->get(), loss_ready_->get(), 0));
    PSLAB_CUDA_CHECK(cudaMemsetAsync(base, 0, sizeof(int), stream_->get()));
    return base;
  }
  void copy_loss_back(const void* dev, std::size_t bytes) {
    if (bytes > loss_host_bytes_) {
      if (recording_) not_while_recording("a deferred loss larger than any before it");
      deallocate_host(loss_host_);
      loss_host_ = nullptr;
      loss_host_bytes_ = 0;
      loss_host_ = allocate_host(bytes);
      loss_host_bytes_ = bytes;
    }
    if (!loss_ready_) loss_ready_ = std::make_unique<Event>();
    if (!loss_branch_) loss_branch_ = std::make_unique<LossBranch>();
    // The loss leaves on a branch forked from the compute stream after the loss kernel, so that
    // backward goes on without waiting for the copy; loss_ready_ once it landed (take_loss()
    // waits for forward and the loss alone). Recording: the branch is part of the graph, joined
    // at its end (end_recording), and loss_ready_ an event node that each replay records.
    PSLAB_CUDA_CHECK(cudaEventRecord(loss_branch_->fork.get(), stream_->get()));
    PSLAB_CUDA_CHECK(cudaStreamWaitEvent(loss_branch_->stream.get(), loss_branch_->fork.get(), 0));
    loss_branch_open_ = loss_branch_open_ || recording_;  // (joined, so end_recording joins it back)
    PSLAB_CUDA_CHECK(cudaMemcpyAsync(loss_host_, dev, bytes, cudaMemcpyDeviceToHost, loss_branch_->stream.get()));
    PSLAB_CUDA_CHECK(cudaEventRecordWithFlags(loss_ready_->get(), loss_branch_->stream.get(),
                                              recording_ ? cudaEventRecordExternal : cudaEventRecordDefault));
    loss_copy_queued_ = !recording_;
  }

  // Device scratch of at least `bytes`, which a recording may use but not grow.
  void* scratch(std::size_t bytes) {
    if (recording_ && bytes > scratch_.capacity()) not_while_recording("growing the backend's scratch");
    recorded_scratch_ |= recording_;
    return scratch_.get(bytes);
  }
  // cuDNN for a convolution of this shape: while recording only with its plan made (making one allocates).
  // PSLAB_CUDNN: unset or empty, "heuristic", "timed" (cuda/cudnn.h: how algorithms are chosen), "off".
  static std::string cudnn_setting() {
    const char* v = std::getenv("PSLAB_CUDNN");
    const std::string use = v && *v ? v : "heuristic";
    if (use != "heuristic" && use != "timed" && use != "off")
      throw std::invalid_argument("PSLAB_CUDNN is \"" + use + "\": \"heuristic\" (the default), \"timed\" or \"off\"");
    return use;
  }
  cuda::Cudnn& cudnn_for(const math::ConvGeometry& g, int OC, int B) {
    if (recording_ && !cudnn_->planned(g, OC, B)) not_while_recording("a convolution of a shape not run before");
    recorded_cudnn_ |= recording_;
    return *cudnn_;
  }
  void not_while_recording(const char* what) const {
    if (recording_)
      throw std::logic_error(std::string("CudaBackend: ") + what +
                             " cannot be recorded in a step graph (it waits, copies to or from the host, or allocates)");
  }
  Buffers buffers_now() const {
    return Buffers{scratch_.data(), loss_dev_.data(), loss_host_, cudnn_ ? cudnn_->workspace() : nullptr, tf32_};
  }

  int device_;
  std::string describe_;
  bool tf32_ = false;
  bool recording_ = false;  // between begin_recording() and end_recording()
  bool recorded_scratch_ = false, recorded_cudnn_ = false;  // what the recording used (Buffers)
  void* cublas_workspace_ = nullptr;  // kCublasWorkspaceBytes, cuBLAS's (cublasSetWorkspace)
  struct Pending {
    int rows = 0, C = 0;
  } pending_;                  // the deferred loss not yet taken
  void* loss_host_ = nullptr;  // page-locked: its (bad-label count, per-row losses)
  std::size_t loss_host_bytes_ = 0;
  // Declaration order = reverse destruction order: scratch, then handle, then stream.
  std::unique_ptr<Stream> stream_;
  // The copy lane, made on first use: its stream and a ring of events, slot t % kSlots for
  // ticket t (queued: the compute stream's point the copy waits for; done: the copy landed).
  struct CopyLane {
    static constexpr Ticket kSlots = 256;
    struct Slot {
      Event queued, done;
    };
    Stream stream;
    std::unique_ptr<Slot[]> slots = std::make_unique<Slot[]>(kSlots);
    ~CopyLane() {
      if (const cudaError_t e = cudaStreamSynchronize(stream.get()); e != cudaSuccess)
        report_cleanup_error("cudaStreamSynchronize (copy lane)", cudaGetErrorString(e));
    }
  };
  std::unique_ptr<CopyLane> lane_;
  Ticket landed_ = 0;       // every copy up to this ticket has landed
  Ticket last_upload_ = 0;  // the last upload queued, and the last that upload_fence() covered
  Ticket fenced_ = 0;
  std::unique_ptr<CublasHandle> cublas_;
  std::unique_ptr<cuda::Cudnn> cudnn_;  // null: no cuDNN, for the reason in no_cudnn_
  std::string no_cudnn_;
  Scratch scratch_;
  Scratch loss_dev_;  // the deferred loss's, apart from scratch_ (which backward reuses)
  std::unique_ptr<Event> loss_ready_;
  // The deferred loss's way to the host, beside the compute (made on first use): its stream, the
  // compute stream's point it forks from and, in a recording, the point it joins back at.
  struct LossBranch {
    Stream stream;
    Event fork, join;
    ~LossBranch() {
      if (const cudaError_t e = cudaStreamSynchronize(stream.get()); e != cudaSuccess)
        report_cleanup_error("cudaStreamSynchronize (loss branch)", cudaGetErrorString(e));
    }
  };
  std::unique_ptr<LossBranch> loss_branch_;
  bool loss_branch_open_ = false;  // recording: forked, not yet joined
  bool loss_copy_queued_ = false;  // the last loss copy was queued outside a recording
  // Host staging for reduction results; grows like the scratch and is reused.
  std::vector<unsigned char> host_bytes_;
  std::vector<double> host_doubles_;
};

}  // namespace

// The plugin's entry points (kernels/cuda_plugin.h; backend.cpp finds them by name).
extern "C" int pslab_cuda_device_count(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
    (void)cudaGetLastError();
    if (why) *why = std::string("no CUDA GPU here: ") + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")";
    return 0;
  }
  usable_or_throw(e, "cudaGetDeviceCount");
  if (count == 0 && why) *why = "no CUDA GPU here: cudaGetDeviceCount found no device";
  return count;
}

// Owned by the caller (a std::unique_ptr<Backend> there).
extern "C" Backend* pslab_cuda_backend(int gpu_slot) {
  int count = 0;
  usable_or_throw(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count == 0)
    throw std::runtime_error("no usable CUDA GPU: cudaGetDeviceCount found no device");
  if (gpu_slot < 0) throw std::invalid_argument("GPU slot " + std::to_string(gpu_slot) + " < 0");
  return new CudaBackend(gpu_slot % count);
}

}  // namespace pslab
