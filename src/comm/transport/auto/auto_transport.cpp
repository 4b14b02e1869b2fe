#include "comm/transport/auto/auto_transport.h"

#include <stdexcept>

#include "comm/transport/auto/mixed.h"
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

  // ADDRESS, or ipc:///PATH+tcp://HOST:PORT: one listener on both (co-located peers connect to
  // the first, the others to the second).
  std::unique_ptr<Listener> listen(const std::string& address, const ListenOptions& opt) override {
    const auto plus = address.find('+');
    if (plus == std::string::npos) return for_address(address).listen(address, opt);
    const std::string a = address.substr(0, plus), b = address.substr(plus + 1);
    if (&for_address(a) == &for_address(b) || b.find('+') != std::string::npos)
      throw std::invalid_argument("\"" + address + "\": a listener of the auto transport on two addresses needs one of "
                                  "each kind, ipc:///PATH+tcp://HOST:PORT");
    std::vector<std::unique_ptr<Listener>> parts;
    parts.push_back(for_address(a).listen(a, opt));
    parts.push_back(for_address(b).listen(b, opt));
    return mixed_listener(address, std::move(parts));
  }
  // Each address by its kind: shm to ipc:// ones, TCP to tcp:// ones, both at once if need be.
  std::unique_ptr<Connections> connect(const std::vector<std::string>& addresses, const ConnectOptions& opt) override {
    std::vector<std::string> of_shm, of_tcp;
    std::vector<PartIndex> where;
    for (const auto& a : addresses) {
      auto& list = &for_address(a) == shm_.get() ? of_shm : of_tcp;
      where.push_back({&list == &of_shm ? 0u : 1u, list.size()});
      list.push_back(a);
    }
    if (of_tcp.empty()) return shm_->connect(addresses, opt);
    if (of_shm.empty()) return tcp_->connect(addresses, opt);
    std::vector<std::unique_ptr<Connections>> parts;
    parts.push_back(shm_->connect(of_shm, opt));
    parts.push_back(tcp_->connect(of_tcp, opt));
    return mixed_connections(addresses, std::move(parts), std::move(where));
  }
  void authenticate(const RunKey& key) override {
    shm_->authenticate(key);
    tcp_->authenticate(key);
  }
  long peers_refused() const override { return tcp_->peers_refused(); }
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
