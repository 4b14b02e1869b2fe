// The compute backend interface: everything training needs, on one device.
//
// Two implementations mirror each other: CpuBackend (OpenBLAS cblas_sgemm + loops over the
// functions of kernels/elementwise.h) and CudaBackend (cuBLAS + .cu kernels calling the same
// functions). All pointers passed to a backend live on that backend's device; sizes are
// element counts; matrices are row-major.
//
// Threading: a Backend instance is used by one thread at a time (the CUDA backend owns one
// stream and one cuBLAS handle). Errors: every failing library call throws std::runtime_error
// naming file:line, the expression and the library's error string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "elementwise.h"

namespace pslab {

enum class Device { cpu, cuda };

enum class Trans { no, yes };

// How a backend holds a batch of images (B images of C channels of H x W pixels) between
// layers: (B, C, H, W) or (B, H, W, C) (Backend::image_layout).
enum class ImageLayout { nchw, nhwc };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  // The CUDA device this backend computes on (-1: none).
  virtual int gpu() const { return -1; }
  // The GPU's PCI bus id ("0000:17:00.0"): the same for every process on that GPU, whatever
  // CUDA_VISIBLE_DEVICES each was given. Empty on the CPU.
  virtual std::string gpu_bus_id() const { return {}; }
  // Human-readable description, e.g. "cpu (OpenBLAS 0.3.21, 2 threads)".
  virtual std::string describe() const = 0;
  // Whether GEMMs may round their inputs to TF32 on tensor cores (train.tf32; CUDA only, off
  // by default): faster on Ampere and newer, with a 10-bit mantissa in the products.
  virtual void allow_tf32(bool on) {
    if (on) throw std::invalid_argument("TF32 is a CUDA option: " + describe() + " computes in float32");
  }

  // ---- memory (bytes) ----
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p) noexcept = 0;
  virtual void copy_from_host(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  // Host memory that copies to and from this device are fastest with (CUDA: page-locked, so a
  // copy is one DMA without staging; CPU: ordinary). Allocate once, outside the step loop.
  virtual void* allocate_host(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return p;
  }
  virtual void deallocate_host(void* p) noexcept { std::free(p); }
  // ---- copies beside the compute (a GPU's copy engine; the CPU copies at once) ----
  // A Ticket names one queued copy. Tickets count up from 1 per backend, and copies land in the
  // order they were queued: a copy that landed means every earlier one did too.
  using Ticket = std::uint64_t;
  // Queues a copy to host_dst (allocate_host memory) of what the work queued so far leaves at
  // src; returns at once. The host may read host_dst once landed() says so.
  virtual Ticket download_async(void* host_dst, const void* src, std::size_t bytes) {
    if (host_dst != src) copy_to_host(host_dst, src, bytes);
    return ++tickets_;
  }
  // Queues a copy of host_src (allocate_host memory, left unchanged until it landed) to dst;
  // returns at once. Work queued after the next upload_fence() sees it.
  virtual Ticket upload_async(void* dst, const void* host_src, std::size_t bytes) {
    if (dst != host_src) copy_from_host(dst, host_src, bytes);
    return ++tickets_;
  }
  // Makes host memory someone else allocated (a transport's shared memory) as fast to copy to
  // and from as allocate_host's (CUDA: page-locks it, so that async copies stay async). False
  // when the device refused (the memory still works, slower). Undo with unregister_host().
  virtual bool register_host(void* /*p*/, std::size_t /*bytes*/) { return true; }
  virtual void unregister_host(void* /*p*/) noexcept {}
  // Whether copy `t` (and so every earlier one) has landed; with wait, waits until it has.
  virtual bool landed(Ticket /*t*/, bool /*wait*/) { return true; }
  // Work queued from now on waits for every upload queued so far (on the device: the host does
  // not wait).
  virtual void upload_fence() {}

  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void fill(float* x, std::size_t n, float value) = 0;
  // dst[0, n) = values[0, n) (n <= kMaxScalarWrite; dst on the device), in order with the work
  // queued: work queued later reads them, work queued before does not; `values` is free at once
  // (CUDA: they travel in a kernel's arguments). A step graph's live scalars (math::Program::live)
  // are written so, outside the recording (which would keep the values it was recorded with).
  static constexpr int kMaxScalarWrite = 8;
  virtual void write_scalars(float* dst, const float* values, int n) {
    if (n < 0 || n > kMaxScalarWrite) throw std::logic_error("Backend::write_scalars: more than 8 scalars");
    copy_from_host(dst, values, std::size_t(n) * sizeof(float));
  }
  // Waits until all queued work is done (no-op on the CPU).
  virtual void synchronize() = 0;
  // dst row k = src row idx[k] for k < n; rows of `row_bytes` bytes (a multiple of 4: floats or
  // int32); idx (n) and both buffers on the device. Gathers a batch from a resident data set.
  virtual void gather_rows(const void* src, const std::uint32_t* idx, std::size_t n, std::size_t row_bytes,
                           void* dst) = 0;
  // dst (n, C, H, W) = src's images augmented (math::augmented_pixel, the draw of each from
  // (seed, epoch, idx[k]): math::augment_draw); idx (n) on the device; dst does not alias src.
  virtual void augment_images(const float* src, const std::uint32_t* idx, std::size_t n, int C, int H, int W,
                              std::uint64_t seed, std::uint64_t epoch, int pad, float* dst) = 0;

  // ---- linear algebra ----
  // C (M,N) = alpha * op(A) * op(B) + beta * C; op(A) is (M,K), op(B) is (K,N); row-major,
  // lda/ldb/ldc are the row strides of A, B, C as stored.
  virtual void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                    int lda, const float* B, int ldb, float beta, float* C, int ldc) = 0;
  // y = y + a * x
  virtual void axpy(std::size_t n, float a, const float* x, float* y) = 0;
  // x = a * x
  virtual void scale(std::size_t n, float a, float* x) = 0;
  // sum of x[i]^2, accumulated in double, returned to the host
  virtual double sum_squares(const float* x, std::size_t n) = 0;

  // ---- layers ----
  // y (outer, channels, inner) += bias (channels), broadcast over outer and inner.
  // A Linear layer uses inner = 1; a convolution uses inner = OH*OW.
  virtual void add_bias(float* y, const float* bias, int outer, int channels, int inner) = 0;
  // db (channels) = sum of dy (outer, channels, inner) over outer and inner.
  virtual void bias_grad(const float* dy, int outer, int channels, int inner, float* db) = 0;
  virtual void relu_forward(const float* x, float* y, std::size_t n) = 0;
  // dx = dy where y > 0 else 0 (y is the forward output); dx may alias dy.
  virtual void relu_backward(const float* dy, const float* y, float* dx, std::size_t n) = 0;
  // Batch normalisation of x (B, C, HW) (in image_layout()), each channel over its B*HW values (math::bn_*):
  // y = gamma (x - mean) invstd + beta. training: the batch's mean and invstd into saved_mean
  // and saved_invstd (C), and the running statistics (C) moved by `momentum` toward the batch's;
  // otherwise (inference) the running statistics normalise, and saved_* are not written.
  virtual void batch_norm_forward(const float* x, int B, int C, int HW, const float* gamma, const float* beta,
                                  bool training, float momentum, float eps, float* running_mean, float* running_var,
                                  float* saved_mean, float* saved_invstd, float* y) = 0;
  // The gradients of a training forward: dgamma, dbeta (C) overwritten; dx (B, C, HW) unless null
  // (image_layout(), as x and dy).
  virtual void batch_norm_backward(const float* x, const float* dy, int B, int C, int HW, const float* gamma,
                                   const float* saved_mean, const float* saved_invstd, float* dgamma, float* dbeta,
                                   float* dx) = 0;

  // ---- losses: return the loss summed over rows (host value, double) ----
  // logits (rows, C), labels (rows) in [0, C); dlogits (rows, C) = grad_scale * (p - onehot).
  virtual double softmax_xent(const float* logits, const std::int32_t* labels, int rows, int C,
                              float grad_scale, float* dlogits) = 0;
  // y, t (rows, C); loss 0.5 * |y - t|^2 per row; dy = grad_scale * (y - t).
  virtual double mse(const float* y, const float* t, int rows, int C, float grad_scale,
                     float* dy) = 0;
  // The same two losses without waiting for the device (a training step: backward is queued
  // before the loss is read): queue it, then take_loss() returns the summed loss (and reports
  // bad labels), waiting only for the loss itself. One loss pending at a time. By default
  // (the CPU) computed at once.
  virtual void softmax_xent_deferred(const float* logits, const std::int32_t* labels, int rows, int C,
                                     float grad_scale, float* dlogits) {
    pending_loss_ = softmax_xent(logits, labels, rows, C, grad_scale, dlogits);
  }
  virtual void mse_deferred(const float* y, const float* t, int rows, int C, float grad_scale, float* dy) {
    pending_loss_ = mse(y, t, rows, C, grad_scale, dy);
  }
  virtual double take_loss() { return pending_loss_; }
  // Number of rows whose argmax equals the label.
  virtual long count_correct(const float* logits, const std::int32_t* labels, int rows,
                             int C) = 0;

  // ---- step graphs (CUDA graphs; train.cuda_graphs) ----
  // Work recorded once and replayed with one launch: a GPU step's many small kernels cost one
  // launch instead of one each. Between begin_recording() and end_recording() the queued work is
  // recorded, not run; only work that stays on the device may be queued then (no op that returns
  // a host value or waits, no copy to or from the host but the deferred loss's, no allocation):
  // such an op throws std::logic_error naming itself. A replay reads and writes the same device
  // memory as the recorded work did, with the values it holds at the time.
  class Graph {
   public:
    virtual ~Graph() = default;
  };
  // Whether this backend records graphs (the CPU does not: it runs work as it is queued).
  virtual bool records_graphs() const { return false; }
  virtual void begin_recording() { throw std::logic_error(describe() + " records no graphs"); }
  // The work queued since begin_recording(), ready to replay; null, with why, where the device
  // could not record it (the backend is then as before begin_recording(), nothing having run).
  virtual std::unique_ptr<Graph> end_recording(std::string* /*why*/) {
    throw std::logic_error(describe() + " records no graphs");
  }
  // Queues the recorded work (a deferred loss it computed is then pending: take_loss()). False,
  // with nothing queued, where memory it uses was reallocated since (a buffer that grew): record
  // it again.
  virtual bool replay(Graph& /*g*/) { throw std::logic_error(describe() + " records no graphs"); }

  // ---- element-wise programs (kernels/elementwise.h: math::Program) ----
  // Runs `p` for every index in [0, n) over `arrays` (p.arrays pointers to n floats each, on this
  // device), writing the arrays it marks as outputs: an optimizer's step, composed of the
  // program's ops (core/optimizers/), with no backend method of its own.
  virtual void run(const math::Program& p, float* const* arrays, std::size_t n) = 0;

  // ---- convolution helpers, a whole batch per call ----
  // x (B,C,H,W) -> cols (C*KH*KW, B*OH*OW), column b*OH*OW + n = output pixel n of image b
  virtual void im2col(const float* x, const math::ConvGeometry& g, int B, float* cols) = 0;
  // cols (C*KH*KW, B*OH*OW) -> dx (B,C,H,W), overwriting dx with the summed contributions
  virtual void col2im(const float* cols, const math::ConvGeometry& g, int B, float* dx) = 0;
  // y (B, A, N) = x (A, B, N): the two outer dimensions swapped (y must not overlap x). A
  // convolution's GEMM gives (OC, B, N); its layers pass (B, OC, N).
  virtual void swap_outer(const float* x, int A, int B, int N, float* y) = 0;

  // ---- image layout ----
  // How this backend holds images between layers: (B, C, H, W) (nchw: the CUDA backend, and the
  // CPU one on im2col) or (B, H, W, C) (nhwc: the CPU backend on oneDNN, whose kernels run on it,
  // so that no convolution reorders its activations). The convolution, batch-norm and mean-pool
  // ops take and give images in this layout. A model's input arrives in NCHW and is relaid once
  // (core/model.cpp), and a Linear layer reads an image in NCHW order, relaying it first, so θ
  // means the same on every backend (core/layers.h).
  virtual ImageLayout image_layout() const = 0;
  // y = the B images of x (C channels of HW pixels) in layout `to`, x being in the other one; y
  // must not overlap x. By default one swap_outer per image (kernels/conv.cpp).
  virtual void relayout_images(const float* x, int B, int C, int HW, ImageLayout to, float* y);
  // An NHWC backend's mean pool: y (B, C) = each image's mean over its HW pixels, channel by
  // channel; its gradient dx (B, HW, C) = dy (B, C) / HW at every pixel. By default refused (an
  // NCHW backend's is a GEMM against ones: core/layers.h, GlobalAvgPool).
  virtual void mean_pool_nhwc(const float* x, int B, int C, int HW, float* y);
  virtual void mean_pool_nhwc_backward(const float* dy, int B, int C, int HW, float* dx);

  // ---- convolution layers, a whole batch per call (kernels/conv.cpp) ----
  // y (B, OC, OH*OW) = W (OC, C*KH*KW) applied to every image of x (B, C, H, W); no bias. x, y
  // (and below dy, dx) in image_layout(); W (OIHW) always as written.
  // scratch: conv_scratch_floats(g, OC, B) floats; forward may leave in it what conv_backward
  // reads (im2col: the batch's columns), which then overwrites it.
  // By default im2col of the whole batch, one GEMM and a swap of the outer dimensions (a
  // constant number of launches); the CPU backend overrides it (oneDNN, or im2col image by
  // image), the CUDA backend with cuDNN where it can load it (kernels/cuda/cudnn.h).
  virtual void conv_forward(const float* x, const float* W, const math::ConvGeometry& g, int OC, int B, float* y,
                            float* scratch);
  // dW (OC, C*KH*KW) = the weight gradient summed over the batch (overwritten; zero when B = 0);
  // dx (B, C, H, W) = the input gradient, unless dx is null. x: forward's input, unchanged since;
  // dy (B, OC, OH*OW). The default is NCHW's.
  virtual void conv_backward(const float* x, const float* W, const float* dy, const math::ConvGeometry& g, int OC,
                             int B, float* dW, float* dx, float* scratch);
  // The scratch both need on this backend for a batch of B (or fewer). By default, im2col's: the
  // batch's columns (C*KH*KW, B*OH*OW) and the GEMM's output (OC, B*OH*OW).
  virtual std::size_t conv_scratch_floats(const math::ConvGeometry& g, int OC, int B) {
    return im2col_scratch_floats(g, OC, B);
  }
  static std::size_t im2col_scratch_floats(const math::ConvGeometry& g, int OC, int B) {
    const std::size_t K = std::size_t(g.C) * g.KH * g.KW, N = std::size_t(g.OH()) * g.OW();
    return N * (K + std::size_t(OC)) * std::size_t(B);
  }

 protected:
  double pending_loss_ = 0.0;  // the default *_deferred and take_loss
  Ticket tickets_ = 0;         // the default *_async: the last ticket given
};

// How the CPU backend convolves: on oneDNN (kernels/cpu/onednn_conv.h), its images in NHWC,
// where pslab was built with it; else (or asked for: tests, benchmarks) by im2col and
// OpenBLAS's GEMMs, its images in NCHW.
enum class CpuConvolutions { onednn, im2col };
// The CPU backend. OpenBLAS has one thread count per process: threads > 0 sets it (the
// process's training role decides, at its start); 0 leaves it as it is (a parameter server
// created in a worker's process must not change the worker's setting). oneDNN's convolutions
// run on as many threads as OpenBLAS has at the call.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0, CpuConvolutions conv = CpuConvolutions::onednn);
// Sets OpenBLAS's thread count for this process.
void set_cpu_backend_threads(int threads);
// Settings the CPU libraries read only when they load, so called first thing in main(): where
// one is missing, re-executes this program with it and the same arguments (the process keeps
// its pid); otherwise returns. A user's own setting is always kept.
//   OPENBLAS_CORETYPE=SkylakeX (Haswell) where OpenBLAS chose its SSE3 "Prescott" kernels on a
//     CPU with AVX-512 (AVX2) it does not know by model (a VM's "Intel Xeon Processor"): 2.5x
//     slower than the kernels such a CPU runs.
//   OMP_WAIT_POLICY=passive (built with oneDNN): oneDNN's OpenMP threads sleep between
//     convolutions instead of spinning on the cores that OpenBLAS's and the backend's own
//     threads run the other ops on (ResNet-20 on 2 cores: 1.17x the step's speed).
void use_best_cpu_runtime(char** argv);
// The kernels OpenBLAS uses in this process ("SkylakeX", "Haswell", "Prescott", ...).
std::string blas_kernels();
// The CUDA backend on GPU `gpu_slot` mod the number of visible GPUs, so that processes that
// count their slots 0, 1, 2, ... on one host spread over its GPUs; throws if pslab was built
// without CUDA or no GPU is usable (the message says which).
std::unique_ptr<Backend> make_cuda_backend(int gpu_slot = 0);
// How many CUDA GPUs this process sees. 0 when there are none to use: pslab built without
// CUDA, no driver, or no device; then `why` (if given) says which. Any other CUDA error (a
// driver that is there but fails) throws: a GPU may be present, so it is not "no GPU".
int cuda_device_count(std::string* why = nullptr);
std::unique_ptr<Backend> make_backend(Device d, int cpu_threads = 0, int gpu_slot = 0);

// Owning array of n elements of T that a backend allocated: on its device (DeviceBuffer), or
// in the host memory it copies fastest to and from (HostBuffer: page-locked for CUDA).
// Move-only; freed on destruction.
template <typename T, bool kHost>
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(Backend& be, std::size_t n)
      : be_(&be), n_(n), p_(n ? static_cast<T*>(kHost ? be.allocate_host(n * sizeof(T)) : be.allocate(n * sizeof(T))) : nullptr) {}
  BackendBuffer(BackendBuffer&& o) noexcept
      : be_(std::exchange(o.be_, nullptr)), n_(std::exchange(o.n_, 0)),
        p_(std::exchange(o.p_, nullptr)) {}
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    if (this != &o) {
      release();
      be_ = std::exchange(o.be_, nullptr);
      n_ = std::exchange(o.n_, 0);
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  ~BackendBuffer() { release(); }

  T* data() { return p_; }
  const T* data() const { return p_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }
  bool empty() const { return n_ == 0; }

 private:
  void release() noexcept {
    if (p_) kHost ? be_->deallocate_host(p_) : be_->deallocate(p_);
    p_ = nullptr;
  }
  Backend* be_ = nullptr;
  std::size_t n_ = 0;
  T* p_ = nullptr;
};
template <typename T>
using DeviceBuffer = BackendBuffer<T, false>;
template <typename T>
using HostBuffer = BackendBuffer<T, true>;

}  // namespace pslab
