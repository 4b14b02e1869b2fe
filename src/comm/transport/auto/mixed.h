// Several listeners or connections of different transports used as one (the auto transport's:
// shm with co-located peers, TCP with the others). A receive looks at each part without waiting,
// round robin, then waits on all their poll items at once (zmq_poll: ZeroMQ sockets and file
// descriptors together), so a message on either wakes it at once.
// Threading: as for any Listener / Connections, one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/transport/transport.h"

namespace pslab::comm {

// One listener at `address` (e.g. ipc:///DIR/server0+tcp://*:29500) over `parts` (at most 10):
// a peer of part i is known as i's peer id prefixed with the digit i.
std::unique_ptr<Listener> mixed_listener(std::string address, std::vector<std::unique_ptr<Listener>> parts);

// Connections to `addresses` over `parts`: address k is where[k] = {part, index in that part}.
struct PartIndex {
  std::size_t part, index;
};
std::unique_ptr<Connections> mixed_connections(std::vector<std::string> addresses,
                                               std::vector<std::unique_ptr<Connections>> parts,
                                               std::vector<PartIndex> where);

}  // namespace pslab::comm
