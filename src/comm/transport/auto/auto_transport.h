// The "auto" transport: shared memory where the processes share a host, TCP otherwise, decided
// per pair of processes by the addresses the launcher hands out (it places the run): ipc:///PATH
// addresses go to the shm transport, tcp://HOST:PORT addresses to the tcp one. A process may talk
// over both (mixed.h): a server of a run over several hosts listens at ipc:///PATH+tcp://HOST:PORT,
// and each worker connects to the part that fits where it runs.
#pragma once

#include <memory>

#include "comm/transport/transport.h"

namespace pslab::comm {

std::unique_ptr<Transport> make_auto_transport();

}  // namespace pslab::comm
