// The transports pslab knows: cluster.transport -> transport. Adding one: its folder beside
// zmq/ (the same interface, comm/transport/transport.h), a line here, the launcher's
// endpoints for it (experiments/launcher/placement.py), its tests and a README line.
#include "comm/transport/transport.h"
#include "comm/transport/auto/auto_transport.h"
#include "comm/transport/shm/shm_transport.h"
#include "comm/transport/zmq/zmq_transport.h"

namespace pslab::comm {

Registry<Transport>& transport_registry() {
  static Registry<Transport> r("transport", {
      {"tcp", "tcp", "ZeroMQ over TCP, tcp://HOST:PORT: processes on any hosts", false,
       [](const std::string&) { return make_zmq_transport("tcp"); }},
      {"ipc", "ipc", "ZeroMQ over Unix sockets, ipc:///PATH: every process on one host", false,
       [](const std::string&) { return make_zmq_transport("ipc"); }},
      {"shm", "shm", "headers over Unix sockets, payloads through shared memory, ipc:///PATH: every process on one host",
       false, [](const std::string&) { return make_shm_transport(); }},
      {"auto", "auto", "shm where the launcher puts every process on one host, tcp otherwise", false,
       [](const std::string&) { return make_auto_transport(); }},
  });
  return r;
}

}  // namespace pslab::comm
