// The "auto" transport: shared memory where the processes share a host, TCP otherwise, decided
// by the addresses the launcher hands out (it places the run): ipc:///PATH addresses go to the
// shm transport, tcp://HOST:PORT addresses to the tcp one. One process's connections are all of
// one kind: a run on one host uses shm throughout, a run over several hosts TCP throughout.
#pragma once

#include <memory>

#include "comm/transport/transport.h"

namespace pslab::comm {

std::unique_ptr<Transport> make_auto_transport();

}  // namespace pslab::comm
