// The transports pslab knows: cluster.transport -> transport. Adding one: its folder beside
// zmq/ (the same interface, comm/transport/transport.h), a line here, the launcher's
// endpoints for it (experiments/launcher/placement.py), its tests and a line in docs/clusters.md.
#include "comm/transport/transport.h"
#include "comm/transport/auto/auto_transport.h"
#include "comm/transport/shm/shm_transport.h"
#include "comm/transport/zmq/zmq_transport.h"

#include <cstring>
#include <new>
#include <stdexcept>

namespace pslab::comm {

namespace {
class HeapPayloadMemory final : public PayloadMemory {
 public:
  explicit HeapPayloadMemory(std::size_t bytes)
      : size_(bytes), data_(static_cast<std::byte*>(::operator new[]((bytes + 63) / 64 * 64, std::align_val_t(64)))) {
    std::memset(data_, 0, size_);
  }
  ~HeapPayloadMemory() override { ::operator delete[](data_, std::align_val_t(64)); }
  void* data() const override { return data_; }
  std::size_t size() const override { return size_; }

 private:
  std::size_t size_;
  std::byte* data_;
};
}  // namespace

void Transport::authenticate(const RunKey&) {
  throw std::invalid_argument("cluster.transport = \"" + name() + "\" cannot authenticate its peers; use tcp, ipc, shm "
                              "or auto, or cluster.auth = \"none\"");
}

std::unique_ptr<PayloadMemory> Transport::payload_memory(std::size_t bytes) {
  return std::make_unique<HeapPayloadMemory>(bytes);
}

Registry<Transport>& transport_registry() {
  static Registry<Transport> r("transport", {
      {"tcp", "tcp", "ZeroMQ over TCP, tcp://HOST:PORT: processes on any hosts", false,
       [](const std::string&) { return make_zmq_transport("tcp"); }},
      {"ipc", "ipc", "ZeroMQ over Unix sockets, ipc:///PATH: every process on one host", false,
       [](const std::string&) { return make_zmq_transport("ipc"); }},
      {"shm", "shm", "headers over Unix sockets, payloads through shared memory (gradients and θ lent, not copied), "
                     "ipc:///PATH: every process on one host; all-reduce in shared memory",
       false, [](const std::string&) { return make_shm_transport(); }},
      {"auto", "auto", "per pair of processes: shm between two on one host, tcp between hosts (a server of a run "
                       "over several hosts listens on both; all-reduce: shared memory when every rank is on one "
                       "host, else Gloo)", false,
       [](const std::string&) { return make_auto_transport(); }},
  });
  return r;
}

}  // namespace pslab::comm
