// The NCCL collective: GPU buffers, its own CUDA stream, a communicator built from the
// ncclUniqueId that rank 0 publishes through the rendezvous. Compiled only when CMake found
// CUDA and NCCL (PSLAB_HAVE_NCCL).
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

#include "collective.h"

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
    if (e != cudaSuccess || count <= device)
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
    PSLAB_CUDA_RT_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    PSLAB_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size(), id, rank(), &config));
    wait_comm("NCCL communicator init", -1);
  }
  ~NcclCollective() override {
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  std::string describe() const override {
    return "nccl " + std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + " (" + std::to_string(size()) +
           " ranks, GPU " + std::to_string(device_) + ")";
  }
  void allreduce_sum(float* data, std::size_t n, long step) override {
    if (n == 0) return;
    PSLAB_NCCL_CHECK(ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm_, stream_));
    wait_stream("all-reduce", step);
  }
  void broadcast(float* data, std::size_t n, int root) override {
    if (n == 0) return;
    PSLAB_NCCL_CHECK(ncclBroadcast(data, data, n, ncclFloat, root, comm_, stream_));
    wait_stream("broadcast", -1);
  }
  void barrier() override {
    float* one = nullptr;
    PSLAB_CUDA_RT_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&one), sizeof(float), stream_));
    PSLAB_CUDA_RT_CHECK(cudaMemsetAsync(one, 0, sizeof(float), stream_));
    PSLAB_NCCL_CHECK(ncclAllReduce(one, one, 1, ncclFloat, ncclSum, comm_, stream_));
    wait_stream("barrier", -1);
    PSLAB_CUDA_RT_CHECK(cudaFreeAsync(one, stream_));
    PSLAB_CUDA_RT_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  // Polls until the communicator has no operation in progress, or aborts it at the deadline.
  void wait_comm(const std::string& what, long step) {
    const auto deadline = Clock::now() + rv_.timeout();
    ncclResult_t state = ncclInProgress;
    while (true) {
      PSLAB_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state == ncclSuccess) return;
      if (Clock::now() > deadline) abort_with(what, step, "no progress");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // Polls the stream (NCCL kernels) and NCCL's async error against the deadline.
  void wait_stream(const std::string& what, long step) {
    wait_comm(what, step);
    const auto deadline = Clock::now() + rv_.timeout();
    while (true) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) PSLAB_CUDA_RT_CHECK(e);
      ncclResult_t state = ncclSuccess;
      PSLAB_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state != ncclSuccess && state != ncclInProgress)
        throw std::runtime_error(what + ": NCCL error: " + ncclGetErrorString(state));
      if (Clock::now() > deadline) abort_with(what, step, "the NCCL kernel did not complete");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  [[noreturn]] void abort_with(const std::string& what, long step, const std::string& cause) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    throw std::runtime_error(timeout_message(what, step, cause));
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool nccl_built() { return true; }

std::unique_ptr<Collective> make_nccl_collective(RendezvousClient& rv, int device) {
  return std::make_unique<NcclCollective>(rv, device);
}

}  // namespace pslab
