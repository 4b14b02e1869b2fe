// ZeroMQ transports: "tcp" (tcp://HOST:PORT) and "ipc" (ipc:///PATH, Unix sockets). A
// Listener is a ROUTER socket, Connections are one DEALER socket per listener; a message is
// [header frame][payload frame]? (a ROUTER prepends the peer's identity). Payloads with a
// release function are sent zero-copy (ZeroMQ's free callback, on its I/O thread). The first
// ZeroMQ transport of a process sets its malloc policy so that freed message buffers are kept
// for the next messages (keep_freed_message_memory in the .cpp; a user's MALLOC_* wins).
#pragma once

#include <memory>
#include <string>

#include "comm/transport/transport.h"

namespace pslab::comm {

// scheme: "tcp" or "ipc". The ZeroMQ context (one I/O thread) is created on first use.
std::unique_ptr<Transport> make_zmq_transport(const std::string& scheme);

// The address to bind for a tcp:// address that peers connect to: ZeroMQ binds numeric
// addresses and "*" only, so tcp://localhost:P binds 127.0.0.1 and tcp://<host name>:P binds
// every interface (tcp://*:P). Other addresses are returned unchanged.
std::string zmq_bind_address(const std::string& address);

}  // namespace pslab::comm
