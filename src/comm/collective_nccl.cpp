// The NCCL collective: GPU buffers, its own CUDA stream, a communicator built from the
// ncclUniqueId that rank 0 publishes through the rendezvous. The plugin libpslab_nccl.so, built
// only when CMake found CUDA and NCCL (PSLAB_HAVE_NCCL).
//
// NCCL's blocking calls have no timeout, so the communicator is non-blocking and every wait
// polls (NCCL's async error, the stream) against the group's deadline; on expiry the
// communicator is aborted and the error names the ranks that did not arrive.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "comm/collective.h"

#define PSLAB_NCCL_CHECK(expr)                                                                \
  do {                                                                                        \
    const ncclResult_t r_ = (expr);                                                           \
    if (r_ != ncclSuccess && r_ != ncclInProgress)                                            \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + \
                               #expr + ": " + ncclGetErrorString(r_));                        \
  } while (0)

#define PSLAB_CUDA_RT_CHECK(expr)                                                             \
  do {                                                                                        \
    const cudaError_t e_ = (expr);                                                            \
    if (e_ != cudaSuccess)                                                                    \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + \
                               #expr + ": " + cudaGetErrorString(e_));                        \
  } while (0)

namespace pslab {
namespace {

using Clock = std::chrono::steady_clock;

class NcclCollective final : public Collective {
 public:
  NcclCollective(RendezvousClient& rv, int device) : Collective(rv), device_(device) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || device < 0 || count <= device)
      throw std::runtime_error(std::string("NCCL: no usable CUDA GPU: ") +
                               (e != cudaSuccess ? cudaGetErrorString(e) : "device index out of range"));
    PSLAB_CUDA_RT_CHECK(cudaSetDevice(device_));
    ncclUniqueId id;
    if (rank() == 0) {
      PSLAB_NCCL_CHECK(ncclGetUniqueId(&id));
      rv.set("nccl/id", std::vector<char>(id.internal, id.internal + sizeof id.internal));
    } else {
      const std::vector<char> v = rv.get("nccl/id");
      if (v.size() != sizeof id.internal) throw std::runtime_error("NCCL: the published unique id has the wrong size");
      std::memcpy(id.internal, v.data(), v.size());
    }
    try {
      PSLAB_CUDA_RT_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      PSLAB_CUDA_RT_CHECK(cudaMalloc(reinterpret_cast<void**>(&one_), sizeof(float)));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t r = ncclCommInitRankConfig(&comm_, size(), id, rank(), &config);
      if (r != ncclSuccess && r != ncclInProgress) {
        comm_ = nullptr;  // no communicator to wait for or abort
        throw std::runtime_error(timeout_message("NCCL communicator init", -1, ncclGetErrorString(r)));
      }
      wait_comm("NCCL communicator init", -1, deadline());
    } catch (...) {
      release(/*healthy=*/false);
      throw;
    }
  }
  ~NcclCollective() override { release(/*healthy=*/true); }
  std::string describe() const override {
    return "nccl " + std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + " (" + std::to_string(size()) +
           " ranks, GPU " + std::to_string(device_) + ")";
  }
  // The caller's stream must have finished writing `data` (the worker synchronizes its
  // backend first); returns once NCCL's kernel is done with it.
  void allreduce_sum(float* data, std::size_t n, long step) override {
    if (n == 0) return;
    check(ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm_, stream_), "all-reduce", step);
    wait_stream("all-reduce", step);
  }
  void broadcast(float* data, std::size_t n, int root) override {
    if (n == 0) return;
    check(ncclBroadcast(data, data, n, ncclFloat, root, comm_, stream_), "broadcast", -1);
    wait_stream("broadcast", -1);
  }
  void barrier() override {
    cuda(cudaMemsetAsync(one_, 0, sizeof(float), stream_), "barrier", -1);
    check(ncclAllReduce(one_, one_, 1, ncclFloat, ncclSum, comm_, stream_), "barrier", -1);
    wait_stream("barrier", -1);
  }

 private:
  Clock::time_point deadline() const { return Clock::now() + rv_.timeout(); }

  // After any NCCL or CUDA error the communicator is unusable: abort it (which also stops
  // its kernels) and throw, naming the ranks that did not arrive.
  [[noreturn]] void fail(const std::string& what, long step, const std::string& cause) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw std::runtime_error(timeout_message(what, step, cause));
  }
  void check(ncclResult_t r, const std::string& what, long step) {
    if (r != ncclSuccess && r != ncclInProgress) fail(what, step, std::string("NCCL error: ") + ncclGetErrorString(r));
  }
  void cuda(cudaError_t e, const std::string& what, long step) {
    if (e != cudaSuccess) fail(what, step, std::string("CUDA error: ") + cudaGetErrorString(e));
  }
  // Polls until the communicator has no operation in progress; fails on its async error or
  // at the deadline.
  void wait_comm(const std::string& what, long step, Clock::time_point until) {
    while (true) {
      ncclResult_t state = ncclInProgress;
      check(ncclCommGetAsyncError(comm_, &state), what, step);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(what, step, std::string("NCCL error: ") + ncclGetErrorString(state));
      if (Clock::now() > until) fail(what, step, "no progress");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // Polls the stream (NCCL's kernel) and NCCL's async error; one deadline for both.
  void wait_stream(const std::string& what, long step) {
    const auto until = deadline();
    wait_comm(what, step, until);
    while (true) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) cuda(e, what, step);
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &state), what, step);
      if (state != ncclSuccess && state != ncclInProgress)
        fail(what, step, std::string("NCCL error: ") + ncclGetErrorString(state));
      if (Clock::now() > until) fail(what, step, "the NCCL kernel did not complete");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  // Frees everything; a healthy communicator is finalized (bounded by the timeout) and
  // destroyed, any other aborted, so that a dead peer cannot hang the destructor.
  void release(bool healthy) noexcept {
    if (comm_) {
      cudaSetDevice(device_);
      bool done = false;
      const ncclResult_t f = healthy ? ncclCommFinalize(comm_) : ncclInvalidUsage;
      if (f == ncclSuccess || f == ncclInProgress) {
        const auto until = deadline();
        ncclResult_t state = ncclInProgress;
        while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress && Clock::now() < until)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        done = state == ncclSuccess;
      }
      if (done) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    if (one_) cudaFree(one_);
    if (stream_) cudaStreamDestroy(stream_);
    one_ = nullptr;
    stream_ = nullptr;
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  float* one_ = nullptr;  // the barrier's one float
};

}  // namespace

// The NCCL plugin's entry point (kernels/cuda_plugin.h; collective.cpp finds it by name). Owned
// by the caller (a std::unique_ptr<Collective> there).
extern "C" Collective* pslab_nccl_collective(RendezvousClient* rv, int device) {
  return new NcclCollective(*rv, device);
}

}  // namespace pslab
