// Collectives of an all-reduce group: all-reduce (sum) of a float32 buffer, broadcast and
// barrier, over the group's ranks. Three implementations mirror each other:
//   Gloo  CPU buffers, TCP transport (CPU workers): recursive doubling over Gloo's pairs for
//         power-of-two groups (small buffers; any size with 2 ranks), else gloo::allreduce
//         with options (ring)
//   shm   CPU buffers of ranks on one host: one shared segment, each rank sums a chunk
//         (collective_shm.cpp)
//   NCCL  GPU buffers on a CUDA stream, communicator from an ncclUniqueId that rank 0 makes
//         and the rendezvous hands to every rank (GPU workers; built with CUDA + NCCL)
// A fourth wraps any host collective for GPU buffers: copies through page-locked host memory
// (collective_staged.cpp), for GPU ranks that share a GPU. Which one runs follows the worker's
// device, cluster.collective and cluster.transport (make_collective). Every call has the group's
// timeout; on expiry the error names the ranks that did not arrive (asked of the
// coordinator) and the step.
//
// Threading: one thread per Collective.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "comm/half.h"
#include "comm/rendezvous.h"
#include "core/registry.h"

namespace pslab {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual std::string describe() const = 0;
  int rank() const { return rv_.rank(); }
  int size() const { return rv_.world(); }

  // data (n floats, on the collective's device) = the sum over ranks, on every rank.
  // `step` names the step in a timeout message.
  virtual void allreduce_sum(float* data, std::size_t n, long step) = 0;
  // The same sum with every value on the wire in 16 bits (cluster.codec = "f16" / "bf16" in
  // allreduce): each rank's values, times `scale`, rounded to `format`; partial sums taken in
  // float32 and rounded to `format` again where they travel (as NCCL does for its half types);
  // the sum divided by `scale` at the end. Every rank ends with bitwise the same data. `scale`
  // (a power of two) keeps small values such as a gradient averaged over a large batch out of
  // f16's subnormals. The default refuses, naming the collective.
  virtual void allreduce_sum_half(float* data, std::size_t n, HalfFormat format, float scale, long step);
  // Whether allreduce_sum_half works here (Gloo, shm and host-staged: yes; NCCL: not yet).
  virtual bool reduces_half() const { return false; }
  // A collective of device buffers that stages them through host memory: the host collective
  // it runs on (overlap reduces host buckets on it directly, as they land). nullptr otherwise.
  virtual Collective* host_side() { return nullptr; }
  // data (n floats) = root's data, on every rank.
  virtual void broadcast(float* data, std::size_t n, int root) = 0;
  virtual void barrier() = 0;

 protected:
  explicit Collective(RendezvousClient& rv) : rv_(rv) {}
  // The message of a failed (usually timed-out) collective: what, at which step, the cause,
  // and which ranks had not reported reaching that step.
  std::string timeout_message(const std::string& what, long step, const std::string& cause);
  RendezvousClient& rv_;
};

// Gloo over TCP; `host` is the address this rank's pairs listen on (e.g. 127.0.0.1).
std::unique_ptr<Collective> make_gloo_collective(RendezvousClient& rv, const std::string& host);
// NCCL on GPU `device`; throws when pslab was built without NCCL or no GPU is usable.
std::unique_ptr<Collective> make_nccl_collective(RendezvousClient& rv, int device);
bool nccl_built();
// Shared memory; every rank must be on one host (comm::shared_memory_domain()) and user.
std::unique_ptr<Collective> make_shm_collective(RendezvousClient& rv);
// The all-reduce of CPU buffers that goes with a transport, by its name (Transport::name()):
// "shm" the shm collective (an error names the ranks on other hosts), "auto" the shm collective
// when every rank is on one host and Gloo otherwise, "tcp" / "ipc" Gloo; a transport with no
// entry gets Gloo. The virtual cluster registers its own for its simulated transport (src/sim/).
struct HostCollective {
  virtual ~HostCollective() = default;
  virtual std::unique_ptr<Collective> make(RendezvousClient& rv, const std::string& host) const = 0;
};
Registry<HostCollective>& host_collective_registry();
// The host collective by `transport` (the transport's name, see host_collective_registry()).
// CPU backends: that host collective. CUDA backends by `collective` (cluster.collective): "nccl"
// NCCL on the backend's GPU; "gloo" the host collective through host memory; "auto" NCCL
// unless two ranks share a GPU (same host and PCI bus id), then through host memory, saying
// which ranks share which GPU in describe(). Every rank must call it with the same arguments
// (it asks each rank where it runs).
std::unique_ptr<Collective> make_collective(Backend& be, RendezvousClient& rv, const std::string& host,
                                            const std::string& transport, const std::string& collective);
// `host` (CPU buffers) wrapped for buffers on be's device; `why` is said in describe().
std::unique_ptr<Collective> make_host_staged_collective(RendezvousClient& rv, Backend& be,
                                                        std::unique_ptr<Collective> host, const std::string& why);
// Ranks that share a GPU, from where each rank runs (gpu_of_rank[r] = "host|PCI bus id"), e.g.
// "ranks 0, 1 on GPU 0000:17:00.0 of host-a"; empty when every rank has a GPU of its own.
std::string ranks_sharing_a_gpu(const std::vector<std::string>& gpu_of_rank);

}  // namespace pslab
