#include "comm/transport/auto/auto_transport.h"

#include <stdexcept>

#include "comm/transport/shm/shm_transport.h"
#include "comm/transport/zmq/zmq_transport.h"

namespace pslab::comm {
namespace {

class AutoTransport final : public Transport {
 public:
  AutoTransport() : shm_(make_shm_transport()), tcp_(make_zmq_transport("tcp")) {}
  std::string name() const override { return "auto"; }
  std::string address_scheme() const override { return "auto"; }
  // Tests and tools on one host: shm's.
  std::string local_address(const std::string& name) override { return shm_->local_address(name); }

  std::unique_ptr<Listener> listen(const std::string& address, const ListenOptions& opt) override {
    return for_address(address).listen(address, opt);
  }
  std::unique_ptr<Connections> connect(const std::vector<std::string>& addresses, const ConnectOptions& opt) override {
    if (addresses.empty()) return tcp_->connect(addresses, opt);
    Transport& t = for_address(addresses.front());
    for (const auto& a : addresses)
      if (&for_address(a) != &t)
        throw std::invalid_argument("cluster.transport = \"auto\": " + addresses.front() + " and " + a +
                                    " are of different kinds; one process talks over one (ipc:// on one host, "
                                    "tcp:// across hosts)");
    return t.connect(addresses, opt);
  }
  // Shared memory: lent by reference where the peer is on this host, ordinary memory to TCP.
  std::unique_ptr<PayloadMemory> payload_memory(std::size_t bytes) override { return shm_->payload_memory(bytes); }

 private:
  Transport& for_address(const std::string& address) {
    if (address.rfind("ipc://", 0) == 0) return *shm_;
    if (address.rfind("tcp://", 0) == 0) return *tcp_;
    throw std::invalid_argument("\"" + address + "\" is not an address of the auto transport (ipc:///PATH: shared "
                                "memory on one host; tcp://HOST:PORT: TCP)");
  }
  std::unique_ptr<Transport> shm_, tcp_;
};

}  // namespace

std::unique_ptr<Transport> make_auto_transport() { return std::make_unique<AutoTransport>(); }

}  // namespace pslab::comm
