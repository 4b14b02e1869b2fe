// How the processes of a run exchange messages. A message is a header (the FlatBuffers bytes
// of comm/wire.h) and at most one payload (tensor bytes). A Listener (a parameter server, the
// all-reduce coordinator, the evaluator's snapshot port) receives from any peer that connects
// and answers it; Connections (a worker's, the evaluator's, a rank's) talk to a fixed list of
// listeners, addressed by index.
//
// Implementations mirror each other, one folder each, chosen by cluster.transport through
// transport_registry():
//   zmq/   ZeroMQ: "tcp" (tcp://host:port) and "ipc" (ipc:///path, Unix sockets between
//          processes on one host)
//   shm/   "shm": headers as Unix packets, payloads through shared memory (processes on one host)
//   auto/  "auto": shm for ipc:// addresses, tcp for tcp:// ones, both at once for a listener at
//          ipc:///PATH+tcp://HOST:PORT (the launcher chooses per pair of processes)
// A test adds its own (tests/test_seams.cpp: an in-memory queue).
//
// Contracts, the same for every implementation:
//   - Every wait has a deadline: recv() returns false when it passes with nothing received, so
//     that the caller's error can name what it waited for and from whom. A signal that
//     interrupts a wait is not an error: recv() goes on waiting until the deadline.
//   - Payload lifetime: a payload given with a release function is referenced, not copied, until
//     the transport is done with it; then the transport calls release(data, hint), from any
//     thread (e.g. its I/O thread). A payload without one is copied before send() returns.
//     A message that cannot be sent is dropped, and its payload released all the same.
//   - A received Message's bytes stay valid until the Message is reused for the next receive
//     or destroyed; reusing one Message for every receive allocates nothing per message.
//   - What arrives malformed at the transport's level (e.g. a frame too many) is delivered with
//     Message::malformed() saying what, so that the receiver counts and answers it.
//
// Threading: one thread uses a Listener or a Connections at a time; a Transport may be shared
// by the threads of one process (each creating its own listeners and connections), and must
// outlive every listener and connections it made.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/run_key.h"
#include "core/clock.h"
#include "core/registry.h"

namespace pslab::comm {

// Deadlines are time points of the transport's clock (Transport::clock()); for the real
// transports, whose clock is the wall clock, steady_clock's.
using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
inline Deadline after(std::chrono::milliseconds ms) { return Clock::now() + ms; }

// Called when the transport no longer references a payload.
using ReleaseFn = void (*)(void* data, void* hint);

// Bytes to send. With `release`, they are referenced until release(data, hint) is called.
struct OutPayload {
  const void* data = nullptr;
  std::size_t size = 0;
  ReleaseFn release = nullptr;
  void* hint = nullptr;
  bool empty() const { return data == nullptr; }
};

// Gives a payload back to its owner: calls its release function, if it has one, and empties it
// (so that it cannot be released twice).
inline void release(OutPayload& p) {
  if (p.release) p.release(const_cast<void*>(p.data), p.hint);
  p = {};
}

// Memory to keep payloads in (Transport::payload_memory): 64-byte aligned, zero-filled.
class PayloadMemory {
 public:
  virtual ~PayloadMemory() = default;
  virtual void* data() const = 0;
  virtual std::size_t size() const = 0;
};

// A received message. Move-only; its storage belongs to the transport that filled it and is
// reused by the next receive into the same Message.
class Message {
 public:
  std::span<const std::byte> header() const { return header_; }
  std::span<const std::byte> payload() const { return payload_; }
  bool has_payload() const { return has_payload_; }
  // Why the message is malformed at the transport's level ("" if it is not).
  const std::string& malformed() const { return malformed_; }
  // Bytes received for this message (header, payload and framing the transport counts).
  std::size_t wire_bytes() const { return wire_bytes_; }

  // ---- for transports ----
  struct Storage {
    virtual ~Storage() = default;
    virtual void payload_done() {}  // see done_with_payload()
  };
  // The receiver no longer needs the payload's bytes (payload() is empty afterwards): a
  // transport that lent them (shm) gives them back now rather than at the next receive, e.g.
  // before the receiver answers, so that the sender may reuse them once it has the answer.
  void done_with_payload() {
    if (storage_) storage_->payload_done();
    payload_ = {};
  }
  // The transport's storage in this message, created on first use and then reused.
  template <typename S>
  S& storage() {
    if (auto* s = dynamic_cast<S*>(storage_.get())) return *s;
    storage_ = std::make_unique<S>();
    return static_cast<S&>(*storage_);
  }
  void set(std::span<const std::byte> header, std::span<const std::byte> payload, bool has_payload,
           std::size_t wire_bytes) {
    header_ = header, payload_ = payload, has_payload_ = has_payload, wire_bytes_ = wire_bytes;
    malformed_.clear();
  }
  void set_malformed(std::string why, std::size_t wire_bytes) {
    header_ = {}, payload_ = {}, has_payload_ = false, wire_bytes_ = wire_bytes;
    malformed_ = std::move(why);
  }

 private:
  std::unique_ptr<Storage> storage_;
  std::span<const std::byte> header_, payload_;
  bool has_payload_ = false;
  std::size_t wire_bytes_ = 0;
  std::string malformed_;
};

// What a wait for messages polls, for a transport that waits on several listeners or
// connections at once (auto's, over shm and TCP together): a ZeroMQ socket (its handle) or a
// file descriptor, readable when a message may have arrived. A waiter polls the items, then
// calls recv() with a past deadline; it must also do so before its first poll.
struct PollItem {
  void* zmq_socket = nullptr;
  int fd = -1;
};

// Identifies a peer of a Listener (opaque bytes chosen by the transport).
using PeerId = std::string;

struct ListenOptions {
  std::size_t max_message_bytes = 0;  // larger messages are dropped by the transport (0: no limit)
  int queue = 1000;                   // messages queued per peer, each way
  std::chrono::milliseconds linger{2000};  // how long closing waits for queued replies to leave
};

struct ConnectOptions {
  std::size_t max_message_bytes = 0;       // larger messages from a listener are dropped by the transport (0: no
                                           // limit); ZeroMQ drops the connection too and does not make it again
  int queue = 1000;                        // messages queued per listener, each way
  std::chrono::milliseconds linger{1000};  // how long closing waits for queued messages to leave
                                           // (shm: until the listeners are done with their payloads)
};

class Listener {
 public:
  virtual ~Listener() = default;
  // The address peers connect to (as given to listen()).
  virtual const std::string& address() const = 0;
  // Waits for a message from any peer until `deadline`; false if none came.
  virtual bool recv(Message& m, PeerId& from, Deadline deadline) = 0;
  // Queues a message to a peer without blocking. False if it cannot be queued now (the peer is
  // gone or its queue is full): the message is dropped (and its payload released).
  virtual bool send(const PeerId& to, std::span<const std::byte> header, OutPayload payload = {}) = 0;
  // Appends what a wait for its messages polls (none: a waiter looks every millisecond).
  virtual void poll_items(std::vector<PollItem>&) const {}
};

class Connections {
 public:
  virtual ~Connections() = default;
  virtual std::size_t size() const = 0;
  virtual const std::string& address(std::size_t k) const = 0;
  // Queues a message to listener k, waiting while its queue is full until `deadline` (a
  // deadline in the past: never waits). False if it could not be queued in time: the message
  // is dropped (and its payload released).
  virtual bool send(std::size_t k, std::span<const std::byte> header, OutPayload payload, Deadline deadline) = 0;
  // Waits for a message from any listener until `deadline`; false if none came. Sets `from`.
  virtual bool recv(Message& m, std::size_t& from, Deadline deadline) = 0;
  // Finishes what it can of earlier sends without waiting (shm: releases the lent payloads
  // whose receivers are done). recv() and send() do this too.
  virtual void progress() {}
  // Appends what a wait for its messages polls (none: a waiter looks every millisecond).
  virtual void poll_items(std::vector<PollItem>&) const {}
};

class Transport {
 public:
  virtual ~Transport() = default;
  // As cluster.transport names it, e.g. "tcp".
  virtual std::string name() const = 0;
  // The clock of the processes that use it: every deadline given to its listeners and
  // connections is a time point of this clock. The wall clock; the virtual cluster's
  // simulated transport brings its simulated one (src/sim/).
  virtual RunClock& clock() { return wall_clock(); }
  // The form of its addresses, for launchers: "tcp" (tcp://HOST:PORT, processes on any hosts),
  // "ipc" (ipc:///PATH, Unix sockets: every process on one host), or "auto" (either: ipc when
  // the launcher places every process on one host).
  virtual std::string address_scheme() const = 0;
  // An address on this host for a listener named `name` (e.g. "server0"), for tests and tools:
  // tcp://127.0.0.1:PORT with a port that was free a moment ago; ipc://DIR/NAME in a private
  // directory that lives as long as the transport.
  virtual std::string local_address(const std::string& name) = 0;
  // Starts listening at `address`; throws std::runtime_error naming the address and why not.
  virtual std::unique_ptr<Listener> listen(const std::string& address, const ListenOptions& opt = {}) = 0;
  // Connects to every address (connections complete in the background; sends queue meanwhile).
  // Throws std::invalid_argument for an address this transport cannot use.
  virtual std::unique_ptr<Connections> connect(const std::vector<std::string>& addresses,
                                               const ConnectOptions& opt = {}) = 0;
  // From now on its listeners accept only peers that prove they hold `key`, and its
  // connections prove it (tcp: ZeroMQ CURVE, every message encrypted and authenticated; a
  // refused peer gets nothing and is counted in peers_refused()). Transports over Unix sockets
  // accept it and rely on their socket directory: mode 0700, only this user reaches it. Call it
  // before the first listen() or connect(). The default throws std::invalid_argument: this
  // transport cannot authenticate.
  virtual void authenticate(const RunKey& key);
  // Peers refused so far because they did not prove the key.
  virtual long peers_refused() const { return 0; }
  // `bytes` of memory for payloads that are sent again and again (a server's θ versions). A
  // transport that passes payloads by reference (shm) makes it memory its receivers can map:
  // a payload sent from it with a release function is then lent, not copied, until the
  // receiver is done with it. Others give ordinary memory (the default). The transport must
  // outlive it; it must outlive every send from it.
  virtual std::unique_ptr<PayloadMemory> payload_memory(std::size_t bytes);
};

// cluster.transport -> transport. Built-ins: tcp, ipc, shm, auto (comm/transport/registry.cpp).
Registry<Transport>& transport_registry();
inline std::unique_ptr<Transport> make_transport(const std::string& name) { return transport_registry().make(name); }

}  // namespace pslab::comm
