// The virtual cluster's transport ("sim"): listeners and connections between the threads of
// one simulation, delivering each message after the time the cost model gives it (sim_clock.h):
// its link's latency and bandwidth (messages on one link queue behind each other, so each
// link keeps its order), and at a server's listener the time the server takes to apply a
// payload, one message at a time. Payloads are copied at send and released at once. Its clock is
// the simulated one; every wait on it is a wait of the scheduler.
//
// A DeliveryPolicy may hold messages back from a listener and let them through later: a replay
// of a recorded run (replay.h) lets each server take pushes and pulls in the recorded order.
//
// Addresses are sim://NAME. A listener accepts every peer (the run's key is not needed: every
// peer is a thread of this process).
//
// Threading: the simulation's threads and the scheduler's callbacks, one at a time.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "comm/transport/transport.h"
#include "sim/scheduler.h"
#include "sim/sim_clock.h"

namespace pslab::sim {

struct SimMessage {
  std::vector<std::byte> header, payload;
  bool has_payload = false;
  std::string from;  // a listener's message: the peer's id; a connection's: the listener's index
  std::size_t bytes() const { return header.size() + payload.size(); }
};

class DeliveryPolicy {
 public:
  using Deliver = std::function<void(SimMessage&&)>;
  virtual ~DeliveryPolicy() = default;
  // `msg` reached the listener at `address`: call deliver(msg) now or later.
  virtual void arrived(const std::string& address, SimMessage&& msg, const Deliver& deliver) = 0;
  // The listener at `address` sent `header` to its peer `to`.
  virtual void sent(const std::string& address, const std::string& to, std::span<const std::byte> header) = 0;
};

class SimTransport final : public comm::Transport {
 public:
  SimTransport(Scheduler& s, const Costs& costs);
  ~SimTransport() override;

  std::string name() const override { return "sim"; }
  std::string address_scheme() const override { return "sim"; }
  RunClock& clock() override { return clock_; }
  std::string local_address(const std::string& name) override { return "sim://" + name; }
  std::unique_ptr<comm::Listener> listen(const std::string& address, const comm::ListenOptions& opt = {}) override;
  std::unique_ptr<comm::Connections> connect(const std::vector<std::string>& addresses,
                                             const comm::ConnectOptions& opt = {}) override;
  void authenticate(const comm::RunKey&) override {}

  // Messages with a payload to `address` wait for its server to apply them, one at a time.
  void apply_at(const std::string& address) { servers_.insert(address); }
  void set_policy(std::unique_ptr<DeliveryPolicy> p) { policy_ = std::move(p); }
  DeliveryPolicy* policy() { return policy_.get(); }
  Scheduler& scheduler() { return s_; }
  const Costs& costs() const { return costs_; }
  // An object the simulation's threads share, by key, made on first use (the all-reduce groups).
  template <typename T>
  T& shared(const std::string& key) {
    std::shared_ptr<void>& p = shared_[key];
    if (!p) p = std::make_shared<T>();
    return *static_cast<T*>(p.get());
  }

  // ---- for the listeners and connections ----
  struct Inbox;
  struct Peers;  // every connection's inbox and its index for each listener
  Peers& peers() { return *peers_; }
  struct Link {
    Scheduler::time_point free_at{};  // when its last message has left
  };
  // Sends `msg` over `link`; land(msg) when it has crossed.
  void carry(Link& link, SimMessage&& msg, std::function<void(SimMessage&&)> land);
  // A message that crossed to the listener at `address`.
  void arrive(const std::string& address, SimMessage&& msg);
  // The message of a send: header and payload copied (into a buffer of the pool), the payload
  // released; recycle() gives a received message's buffers back.
  SimMessage copy_of(std::span<const std::byte> header, comm::OutPayload& payload, std::string from);
  void recycle(SimMessage& m);
  void listening(const std::string& address, std::shared_ptr<Inbox> inbox);

 private:
  void deliver(const std::string& address, SimMessage&& msg);

  Scheduler& s_;
  Costs costs_;
  SimClock clock_;
  std::unique_ptr<DeliveryPolicy> policy_;
  std::unique_ptr<Peers> peers_;
  std::set<std::string> servers_;
  std::map<std::string, std::weak_ptr<Inbox>> listeners_;     // by address
  std::map<std::string, std::vector<SimMessage>> early_;      // sent before the listener was there
  std::map<std::string, Scheduler::time_point> busy_until_;   // a server's queue: when it is done
  std::map<std::string, std::shared_ptr<void>> shared_;
  std::vector<std::vector<std::byte>> pool_;  // payload buffers of messages received and done with
};

// Registers the all-reduce of the "sim" transport (sim_collective.cpp) in
// host_collective_registry(); SimTransport's constructor calls it.
void register_sim_collective();

// A queue of received messages and the thread that waits on it.
struct SimTransport::Inbox {
  explicit Inbox(SimTransport& t) : net(t) {}
  SimTransport& net;  // (its pool of payload buffers)
  std::deque<SimMessage> messages;
  Scheduler::Thread* waiter = nullptr;
  // Waits until a message is there or `deadline` passes; pops it into `m` (false: none).
  bool pop(Scheduler& s, comm::Message& m, std::string& from, comm::Deadline deadline);
  void push(Scheduler& s, SimMessage&& msg);
};

}  // namespace pslab::sim
