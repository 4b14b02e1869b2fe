// cuDNN loaded at run time for the CUDA backend (cudnn.h). Host code only: the calls queue
// cuDNN's kernels on the backend's stream.
#include "cuda/cudnn.h"

#include <cudnn.h>
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace pslab::cuda {
namespace {

// The entry points pslab calls, looked up by name in libcudnn.so.9.
#define PSLAB_CUDNN_ENTRY_POINTS(X)                                                                       \
  X(cudnnGetVersion) X(cudnnGetErrorString) X(cudnnCreate) X(cudnnDestroy) X(cudnnSetStream)              \
  X(cudnnCreateTensorDescriptor) X(cudnnSetTensor4dDescriptor) X(cudnnDestroyTensorDescriptor)            \
  X(cudnnCreateFilterDescriptor) X(cudnnSetFilter4dDescriptor) X(cudnnDestroyFilterDescriptor)            \
  X(cudnnCreateConvolutionDescriptor) X(cudnnSetConvolution2dDescriptor) X(cudnnSetConvolutionMathType)   \
  X(cudnnDestroyConvolutionDescriptor) X(cudnnGetConvolutionForwardAlgorithm_v7)                         \
  X(cudnnGetConvolutionBackwardDataAlgorithm_v7) X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)         \
  X(cudnnGetConvolutionForwardWorkspaceSize) X(cudnnGetConvolutionBackwardDataWorkspaceSize)              \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize) X(cudnnFindConvolutionForwardAlgorithm)                \
  X(cudnnFindConvolutionBackwardDataAlgorithm) X(cudnnFindConvolutionBackwardFilterAlgorithm)             \
  X(cudnnConvolutionForward) X(cudnnConvolutionBackwardData) X(cudnnConvolutionBackwardFilter)            \
  X(cudnnBatchNormalizationForwardTraining) X(cudnnBatchNormalizationForwardInference)                    \
  X(cudnnBatchNormalizationBackward)

// Each field has the type of the function it holds.
struct Api {
#define PSLAB_CUDNN_FIELD(f) decltype(&::f) f = nullptr;
  PSLAB_CUDNN_ENTRY_POINTS(PSLAB_CUDNN_FIELD)
#undef PSLAB_CUDNN_FIELD
  std::size_t version = 0;  // cudnnGetVersion(): major * 10000 + minor * 100 + patch
};

// Loaded once per process, and kept loaded; null (and why) where it cannot be.
const Api* load_api(std::string* why) {
  static Api api;
  static std::string failure;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      failure = std::string("cannot load libcudnn.so.9 (") + dlerror() +
                "); put the folder that holds it on LD_LIBRARY_PATH (with Python's nvidia-cudnn package: python3 -c "
                "\"import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], 'lib'))\")";
      return;
    }
#define PSLAB_CUDNN_LOAD(f)                                               \
  api.f = reinterpret_cast<decltype(api.f)>(dlsym(lib, #f));              \
  if (!api.f) {                                                           \
    failure = "libcudnn.so.9 has no entry point " #f;                     \
    return;                                                               \
  }
    PSLAB_CUDNN_ENTRY_POINTS(PSLAB_CUDNN_LOAD)
#undef PSLAB_CUDNN_LOAD
    api.version = api.cudnnGetVersion();
    if (api.version / 10000 != CUDNN_MAJOR)
      failure = "libcudnn.so.9 says it is version " + std::to_string(api.version) + ", not " +
                std::to_string(CUDNN_MAJOR) + ".x";
  });
  if (!failure.empty()) {
    if (why) *why = failure;
    return nullptr;
  }
  return &api;
}

std::string version_string(std::size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

[[noreturn]] void throw_cudnn_error(const Api& api, cudnnStatus_t st, const char* expr, int line) {
  throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                           api.cudnnGetErrorString(st) + " (cuDNN status " + std::to_string(int(st)) + ")");
}

// For a call through `api` (in scope): throws with cuDNN's reason and the call's text.
#define PSLAB_CUDNN_CHECK(expr)                                         \
  do {                                                                  \
    const cudnnStatus_t pslab_cudnn_st_ = (expr);                       \
    if (pslab_cudnn_st_ != CUDNN_STATUS_SUCCESS) throw_cudnn_error(api, pslab_cudnn_st_, #expr, __LINE__); \
  } while (0)

// Among cuDNN's ranking of algorithms (the fastest measured, or its heuristic's best guess,
// first), the first that it supports, in an allowed math type, with a workspace of at most
// kMaxWorkspace; deterministic ones first. Null if none.
constexpr std::size_t kMaxWorkspace = std::size_t(1) << 30;
template <typename Perf>
const Perf* choose(const Perf* perf, int n, bool tf32) {
  const Perf* fallback = nullptr;
  for (int i = 0; i < n; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > kMaxWorkspace) continue;
    // FP32 in FMAs, or with TF32 also on tensor cores; never a conversion to half precision
    // (CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION).
    if (p.mathType != CUDNN_FMA_MATH && (!tf32 || (p.mathType != CUDNN_DEFAULT_MATH && p.mathType != CUDNN_TENSOR_OP_MATH)))
      continue;
    if (p.determinism == CUDNN_DETERMINISTIC) return &p;
    if (!fallback) fallback = &p;
  }
  static std::once_flag said;  // (a bitwise comparison of two runs then fails: said once)
  if (fallback)
    std::call_once(said, [] {
      std::fprintf(stderr, "cuDNN: no deterministic algorithm fits a convolution pass (workspace, math type): a "
                   "non-deterministic one runs, and two runs of one seed may differ in their last bits\n");
    });
  return fallback;
}

// One convolution shape: its descriptors, and the algorithm (with its math type on its own
// convolution descriptor) of each pass.
struct ConvPlan {
  enum Pass { forward, backward_data, backward_filter };
  explicit ConvPlan(const Api& a) : api(a) {}
  ~ConvPlan() {
    if (x) api.cudnnDestroyTensorDescriptor(x);
    if (y) api.cudnnDestroyTensorDescriptor(y);
    if (w) api.cudnnDestroyFilterDescriptor(w);
    for (cudnnConvolutionDescriptor_t c : conv)
      if (c) api.cudnnDestroyConvolutionDescriptor(c);
  }
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;

  const Api& api;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;  // (B, C, H, W), (B, OC, OH, OW)
  cudnnFilterDescriptor_t w = nullptr;               // (OC, C, KH, KW)
  std::array<cudnnConvolutionDescriptor_t, 3> conv{};
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  std::size_t workspace = 0;  // bytes: the largest of the three algorithms'
};

// One batch-norm shape: x (B, C, HW, 1) and the per-channel parameters (1, C, 1, 1).
struct BnShape {
  explicit BnShape(const Api& a) : api(a) {}
  ~BnShape() {
    if (x) api.cudnnDestroyTensorDescriptor(x);
    if (param) api.cudnnDestroyTensorDescriptor(param);
  }
  BnShape(const BnShape&) = delete;
  BnShape& operator=(const BnShape&) = delete;
  const Api& api;
  cudnnTensorDescriptor_t x = nullptr, param = nullptr;
};


// The algorithms (and math types) of one convolution shape's three passes.
struct Choice {
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnMathType_t fwd_math;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnMathType_t bwd_data_math;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  cudnnMathType_t bwd_filter_math;
};
using ChoiceKey = std::array<int, 12>;  // the plan's key, then tf32, timed and the device

// The choices made in this process, one per shape: every backend in a process computes a shape's
// sums alike (two measurements of the candidates may rank close ones differently).
struct Choices {
  std::mutex mutex;
  std::map<ChoiceKey, Choice> by_shape;
};
Choices& process_choices() {
  static Choices made;
  return made;
}
}  // namespace

struct Cudnn::Impl {
  Impl(const Api& a, cudaStream_t s) : api(a), stream(s) {}
  ~Impl() {
    plans.clear(), bn.clear();
    if (workspace) cudaFree(workspace);
    if (handle) api.cudnnDestroy(handle);
  }

  ConvPlan& plan(const math::ConvGeometry& g, int OC, int B);
  std::unique_ptr<ConvPlan> make_plan(const math::ConvGeometry& g, int OC, int B);
  Choice choice(const math::ConvGeometry& g, int OC, int B, const ConvPlan& p, const std::string& shape);
  BnShape& bn_shape(int B, int C, int HW);
  void grow_workspace(std::size_t bytes);
  std::string first_convolution();

  const Api& api;
  cudaStream_t stream;
  cudnnHandle_t handle = nullptr;
  bool tf32 = false;
  bool timed = false;  // algorithms by cuDNN's measurement (cudnnFind*), else its heuristic (cudnnGet*_v7)
  std::map<std::array<int, 9>, std::unique_ptr<ConvPlan>> plans;  // key: C, H, W, KH, KW, stride, pad, OC, B
  std::map<std::array<int, 3>, std::unique_ptr<BnShape>> bn;      // key: B, C, HW
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

static std::array<int, 9> plan_key(const math::ConvGeometry& g, int OC, int B) {
  return {g.C, g.H, g.W, g.KH, g.KW, g.stride, g.pad, OC, B};
}

ConvPlan& Cudnn::Impl::plan(const math::ConvGeometry& g, int OC, int B) {
  const std::array<int, 9> key = plan_key(g, OC, B);
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_plan(g, OC, B)).first;
  return *it->second;
}

std::unique_ptr<ConvPlan> Cudnn::Impl::make_plan(const math::ConvGeometry& g, int OC, int B) {
  auto p = std::make_unique<ConvPlan>(api);
  PSLAB_CUDNN_CHECK(api.cudnnCreateTensorDescriptor(&p->x));
  PSLAB_CUDNN_CHECK(api.cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, g.C, g.H, g.W));
  PSLAB_CUDNN_CHECK(api.cudnnCreateTensorDescriptor(&p->y));
  PSLAB_CUDNN_CHECK(api.cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, OC, g.OH(), g.OW()));
  PSLAB_CUDNN_CHECK(api.cudnnCreateFilterDescriptor(&p->w));
  PSLAB_CUDNN_CHECK(api.cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, OC, g.C, g.KH, g.KW));
  for (cudnnConvolutionDescriptor_t& c : p->conv) {
    PSLAB_CUDNN_CHECK(api.cudnnCreateConvolutionDescriptor(&c));
    PSLAB_CUDNN_CHECK(api.cudnnSetConvolution2dDescriptor(c, g.pad, g.pad, g.stride, g.stride, 1, 1,
                                                          CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    PSLAB_CUDNN_CHECK(api.cudnnSetConvolutionMathType(c, tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
  }
  const std::string shape = "C " + std::to_string(g.C) + ", " + std::to_string(g.H) + "x" + std::to_string(g.W) +
                            ", k " + std::to_string(g.KH) + "x" + std::to_string(g.KW) + ", stride " +
                            std::to_string(g.stride) + ", pad " + std::to_string(g.pad) + ", OC " +
                            std::to_string(OC) + ", batch " + std::to_string(B);
  const Choice c = choice(g, OC, B, *p, shape);
  p->fwd = c.fwd, p->bwd_data = c.bwd_data, p->bwd_filter = c.bwd_filter;
  PSLAB_CUDNN_CHECK(api.cudnnSetConvolutionMathType(p->conv[ConvPlan::forward], c.fwd_math));
  PSLAB_CUDNN_CHECK(api.cudnnSetConvolutionMathType(p->conv[ConvPlan::backward_data], c.bwd_data_math));
  PSLAB_CUDNN_CHECK(api.cudnnSetConvolutionMathType(p->conv[ConvPlan::backward_filter], c.bwd_filter_math));
  std::size_t bytes[3] = {};
  PSLAB_CUDNN_CHECK(api.cudnnGetConvolutionForwardWorkspaceSize(handle, p->x, p->w, p->conv[ConvPlan::forward], p->y,
                                                                p->fwd, &bytes[0]));
  PSLAB_CUDNN_CHECK(api.cudnnGetConvolutionBackwardDataWorkspaceSize(
      handle, p->w, p->y, p->conv[ConvPlan::backward_data], p->x, p->bwd_data, &bytes[1]));
  PSLAB_CUDNN_CHECK(api.cudnnGetConvolutionBackwardFilterWorkspaceSize(
      handle, p->x, p->y, p->conv[ConvPlan::backward_filter], p->w, p->bwd_filter, &bytes[2]));
  p->workspace = std::max({bytes[0], bytes[1], bytes[2]});
  grow_workspace(p->workspace);
  return p;
}

// The three passes' algorithms for a plan whose descriptors are made: the process's earlier
// choice for this shape, else cuDNN's ranking (measured by running each candidate, or its
// heuristic: `timed`) filtered by choose().
Choice Cudnn::Impl::choice(const math::ConvGeometry& g, int OC, int B, const ConvPlan& p, const std::string& shape) {
  const std::array<int, 9> k = plan_key(g, OC, B);
  ChoiceKey key{};
  std::copy(k.begin(), k.end(), key.begin());
  key[9] = tf32, key[10] = timed;
  if (const cudaError_t e = cudaGetDevice(&key[11]); e != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string("cudaGetDevice failed: ") + cudaGetErrorString(e));
  }
  Choices& made = process_choices();
  std::lock_guard<std::mutex> lock(made.mutex);
  if (auto it = made.by_shape.find(key); it != made.by_shape.end()) return it->second;
  auto none = [&](const char* pass) {
    return std::runtime_error(std::string("cuDNN has no usable ") + pass + " algorithm for the convolution " + shape +
                              (tf32 ? "" : " in plain FP32"));
  };
  Choice c{};
  int n = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  PSLAB_CUDNN_CHECK((timed ? api.cudnnFindConvolutionForwardAlgorithm : api.cudnnGetConvolutionForwardAlgorithm_v7)(
      handle, p.x, p.w, p.conv[ConvPlan::forward], p.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, fwd));
  const auto* f = choose(fwd, n, tf32);
  if (!f) throw none("forward");
  c.fwd = f->algo, c.fwd_math = f->mathType;
  cudnnConvolutionBwdDataAlgoPerf_t bd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  PSLAB_CUDNN_CHECK(
      (timed ? api.cudnnFindConvolutionBackwardDataAlgorithm : api.cudnnGetConvolutionBackwardDataAlgorithm_v7)(
          handle, p.w, p.y, p.conv[ConvPlan::backward_data], p.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, bd));
  const auto* d = choose(bd, n, tf32);
  if (!d) throw none("backward-data");
  c.bwd_data = d->algo, c.bwd_data_math = d->mathType;
  cudnnConvolutionBwdFilterAlgoPerf_t bf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  PSLAB_CUDNN_CHECK(
      (timed ? api.cudnnFindConvolutionBackwardFilterAlgorithm : api.cudnnGetConvolutionBackwardFilterAlgorithm_v7)(
          handle, p.x, p.y, p.conv[ConvPlan::backward_filter], p.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, bf));
  const auto* w = choose(bf, n, tf32);
  if (!w) throw none("backward-filter");
  c.bwd_filter = w->algo, c.bwd_filter_math = w->mathType;
  return made.by_shape.emplace(key, c).first->second;
}

void Cudnn::Impl::grow_workspace(std::size_t bytes) {
  if (bytes <= workspace_bytes) return;
  if (workspace) {
    // cudaFree waits for the device: no queued convolution still uses the old block.
    if (const cudaError_t e = cudaFree(workspace); e != cudaSuccess) {
      (void)cudaGetLastError();
      throw std::runtime_error(std::string("cudaFree (cuDNN workspace) failed: ") + cudaGetErrorString(e));
    }
    workspace = nullptr, workspace_bytes = 0;
  }
  if (const cudaError_t e = cudaMalloc(&workspace, bytes); e != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error("cudaMalloc of " + std::to_string(bytes) + " bytes (cuDNN workspace) failed: " +
                             cudaGetErrorString(e));
  }
  workspace_bytes = bytes;
}

BnShape& Cudnn::Impl::bn_shape(int B, int C, int HW) {
  const std::array<int, 3> key{B, C, HW};
  auto it = bn.find(key);
  if (it != bn.end()) return *it->second;
  auto s = std::make_unique<BnShape>(api);
  PSLAB_CUDNN_CHECK(api.cudnnCreateTensorDescriptor(&s->x));
  PSLAB_CUDNN_CHECK(api.cudnnSetTensor4dDescriptor(s->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, C, HW, 1));
  PSLAB_CUDNN_CHECK(api.cudnnCreateTensorDescriptor(&s->param));
  PSLAB_CUDNN_CHECK(api.cudnnSetTensor4dDescriptor(s->param, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, C, 1, 1));
  return *bn.emplace(key, std::move(s)).first->second;
}

std::unique_ptr<Cudnn> Cudnn::open(cudaStream_t stream, ConvAlgorithms ranking, std::string* why) {
  const Api* api = load_api(why);
  if (!api) return nullptr;
  auto impl = std::make_unique<Impl>(*api, stream);
  impl->timed = ranking == ConvAlgorithms::timed;
  if (const cudnnStatus_t st = api->cudnnCreate(&impl->handle); st != CUDNN_STATUS_SUCCESS) {
    impl->handle = nullptr;
    if (why) *why = std::string("cudnnCreate failed: ") + api->cudnnGetErrorString(st);
    return nullptr;
  }
  if (const cudnnStatus_t st = api->cudnnSetStream(impl->handle, stream); st != CUDNN_STATUS_SUCCESS) {
    if (why) *why = std::string("cudnnSetStream failed: ") + api->cudnnGetErrorString(st);
    return nullptr;
  }
  if (const std::string failed = impl->first_convolution(); !failed.empty()) {
    if (why) *why = "cuDNN " + version_string(api->version) + " loaded, but a first test convolution failed: " + failed;
    return nullptr;
  }
  return std::unique_ptr<Cudnn>(new Cudnn(std::move(impl)));
}

// A 3x3 convolution, padding 1, of a 4x4 image of ones with a filter of ones: each output pixel
// counts the image's pixels around it (4 at a corner, 6 on an edge, 9 inside). It runs cuDNN's
// kernels once, so that a library built for another CUDA than this process's fails here (and the
// backend convolves by im2col, saying why) rather than at a run's first convolution. "": it worked.
std::string Cudnn::Impl::first_convolution() {
  const math::ConvGeometry g{1, 4, 4, 3, 3, 1, 1};
  float* dev = nullptr;  // x (16), W (9), y (16)
  if (const cudaError_t e = cudaMalloc(&dev, 41 * sizeof(float)); e != cudaSuccess)
    return (void)cudaGetLastError(), std::string("cudaMalloc: ") + cudaGetErrorString(e);
  std::string failed;
  try {
    std::vector<float> host(41, 1.0f);
    auto cuda = [](cudaError_t e, const char* what) {
      if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
    };
    cuda(cudaMemcpyAsync(dev, host.data(), 25 * sizeof(float), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    const ConvPlan& p = plan(g, 1, 1);
    const float one = 1.0f, zero = 0.0f;
    PSLAB_CUDNN_CHECK(api.cudnnConvolutionForward(handle, &one, p.x, dev, p.w, dev + 16, p.conv[ConvPlan::forward], p.fwd,
                                                  workspace, p.workspace, &zero, p.y, dev + 25));
    cuda(cudaMemcpyAsync(host.data() + 25, dev + 25, 16 * sizeof(float), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    for (int i = 0; i < 16 && failed.empty(); ++i) {
      const int r = i / 4, c = i % 4;
      const float want = float(((r == 0 || r == 3) ? 2 : 3) * ((c == 0 || c == 3) ? 2 : 3));
      if (host[std::size_t(25 + i)] != want)
        failed = "pixel " + std::to_string(i) + " is " + std::to_string(host[std::size_t(25 + i)]) + ", not " +
                 std::to_string(want);
    }
  } catch (const std::exception& e) {
    (void)cudaGetLastError();
    failed = e.what();
  }
  plans.clear();
  if (const cudaError_t e = cudaFree(dev); e != cudaSuccess && failed.empty()) failed = std::string("cudaFree: ") + cudaGetErrorString(e);
  return failed;
}

Cudnn::Cudnn(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Cudnn::~Cudnn() = default;

std::string Cudnn::describe() const {
  return "cuDNN " + version_string(impl_->api.version) + (impl_->timed ? " (algorithms timed)" : " (algorithms by heuristic)");
}
const void* Cudnn::workspace() const { return impl_->workspace; }
bool Cudnn::planned(const math::ConvGeometry& g, int OC, int B) const { return impl_->plans.count(plan_key(g, OC, B)) > 0; }

void Cudnn::allow_tf32(bool on) {
  if (on == impl_->tf32) return;
  impl_->tf32 = on;
  impl_->plans.clear();  // measured again, in the math types now allowed
}

void Cudnn::conv_forward(const float* x, const float* W, const math::ConvGeometry& g, int OC, int B, float* y) {
  const Api& api = impl_->api;
  const ConvPlan& p = impl_->plan(g, OC, B);
  const float one = 1.0f, zero = 0.0f;
  PSLAB_CUDNN_CHECK(api.cudnnConvolutionForward(impl_->handle, &one, p.x, x, p.w, W, p.conv[ConvPlan::forward], p.fwd,
                                                impl_->workspace, p.workspace, &zero, p.y, y));
}

void Cudnn::conv_backward(const float* x, const float* W, const float* dy, const math::ConvGeometry& g, int OC, int B,
                          float* dW, float* dx) {
  const Api& api = impl_->api;
  const ConvPlan& p = impl_->plan(g, OC, B);
  const float one = 1.0f, zero = 0.0f;
  PSLAB_CUDNN_CHECK(api.cudnnConvolutionBackwardFilter(impl_->handle, &one, p.x, x, p.y, dy,
                                                       p.conv[ConvPlan::backward_filter], p.bwd_filter,
                                                       impl_->workspace, p.workspace, &zero, p.w, dW));
  if (!dx) return;
  PSLAB_CUDNN_CHECK(api.cudnnConvolutionBackwardData(impl_->handle, &one, p.w, W, p.y, dy,
                                                     p.conv[ConvPlan::backward_data], p.bwd_data, impl_->workspace,
                                                     p.workspace, &zero, p.x, dx));
}

void Cudnn::batch_norm_forward(const float* x, int B, int C, int HW, const float* gamma, const float* beta,
                               bool training, float momentum, float eps, float* running_mean, float* running_var,
                               float* saved_mean, float* saved_invstd, float* y) {
  const Api& api = impl_->api;
  const BnShape& s = impl_->bn_shape(B, C, HW);
  const float one = 1.0f, zero = 0.0f;
  if (training) {
    PSLAB_CUDNN_CHECK(api.cudnnBatchNormalizationForwardTraining(
        impl_->handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, s.x, x, s.x, y, s.param, gamma, beta, double(momentum),
        running_mean, running_var, double(eps), saved_mean, saved_invstd));
  } else {
    PSLAB_CUDNN_CHECK(api.cudnnBatchNormalizationForwardInference(impl_->handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero,
                                                                  s.x, x, s.x, y, s.param, gamma, beta, running_mean,
                                                                  running_var, double(eps)));
  }
}

void Cudnn::batch_norm_backward(const float* x, const float* dy, int B, int C, int HW, const float* gamma,
                                const float* saved_mean, const float* saved_invstd, float* dgamma, float* dbeta,
                                float* dx) {
  const Api& api = impl_->api;
  const BnShape& s = impl_->bn_shape(B, C, HW);
  const float one = 1.0f, zero = 0.0f;
  // eps: cuDNN's minimum, unused with the saved statistics given.
  PSLAB_CUDNN_CHECK(api.cudnnBatchNormalizationBackward(impl_->handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one,
                                                        &zero, s.x, x, s.x, dy, s.x, dx, s.param, gamma, dgamma, dbeta,
                                                        1e-5, saved_mean, saved_invstd));
}

}  // namespace pslab::cuda

// The plugin's probe of cuDNN (tests): its version (major * 10000 + minor * 100 + patch) where
// libcudnn.so.9 loads with every entry point pslab calls, else 0 and why. Needs no GPU.
extern "C" std::size_t pslab_cudnn_version(std::string* why) {
  const pslab::cuda::Api* api = pslab::cuda::load_api(why);
  return api ? api->version : 0;
}
