// Headers of the shm transport: Unix sequenced-packet sockets (AF_UNIX, SOCK_SEQPACKET) at
// ipc:///PATH, one packet per message, read by the receiving thread itself. ZeroMQ's ipc
// sockets hand every message through an I/O thread on each side (four thread hops per round
// trip); here there are none (a 120-byte round trip: ~22 us against ~100 us on the build VM).
//
// A packet: [u32 header bytes][u32 1 if a payload follows][header][payload]. A packet that is
// too short, says more than it holds, or is cut off (larger than the receive buffer) arrives
// malformed. Connections connect in the background: a send waits (until its deadline) for the
// listener to exist, and reconnects after it went away.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/transport/transport.h"

namespace pslab::comm {

// `address`: ipc:///PATH (a stale socket file at PATH is replaced).
std::unique_ptr<Listener> listen_unix_packets(const std::string& address, const ListenOptions& opt);
std::unique_ptr<Connections> connect_unix_packets(const std::vector<std::string>& addresses, const ConnectOptions& opt);

}  // namespace pslab::comm
