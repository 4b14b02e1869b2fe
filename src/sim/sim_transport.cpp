#include "sim/sim_transport.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <unordered_map>

namespace pslab::sim {

namespace {

// A received message's storage: the message, replaced by the next receive into it.
struct Held final : comm::Message::Storage {
  SimMessage msg;
};

Scheduler::duration from_s(double s) {
  return std::chrono::duration_cast<Scheduler::duration>(std::chrono::duration<double>(s));
}

}  // namespace

// ---- an inbox ----

bool SimTransport::Inbox::pop(Scheduler& s, comm::Message& m, std::string& from, comm::Deadline deadline) {
  while (messages.empty()) {
    if (s.now() >= deadline) return false;
    waiter = s.current();
    s.wait_until(deadline);
    waiter = nullptr;
  }
  Held& h = m.storage<Held>();
  net.recycle(h.msg);
  h.msg = std::move(messages.front());
  messages.pop_front();
  from = h.msg.from;
  m.set(h.msg.header, h.msg.payload, h.msg.has_payload, h.msg.bytes());
  return true;
}

void SimTransport::Inbox::push(Scheduler& s, SimMessage&& msg) {
  messages.push_back(std::move(msg));
  if (waiter) s.wake(waiter);
}

// ---- connections and listeners ----

// Who a listener's peers are: each connection's inbox and, per listener address, its index.
struct SimTransport::Peers {
  struct Peer {
    std::weak_ptr<SimTransport::Inbox> inbox;
    std::unordered_map<std::string, std::size_t> index;  // listener address -> the connection's index for it
  };
  std::unordered_map<std::string, Peer> by_id;
  long next_id = 0;
};

namespace {
using Peers = SimTransport::Peers;
}  // namespace

class SimConnections final : public comm::Connections {
 public:
  SimConnections(SimTransport& net, Peers& peers, std::vector<std::string> addresses)
      : net_(net), peers_(peers), addresses_(std::move(addresses)), inbox_(std::make_shared<SimTransport::Inbox>(net)),
        links_(addresses_.size()) {
    char name[24];  // "c<n>" (built so: GCC 12 warns wrongly, -Wrestrict, on "c" + to_string)
    std::snprintf(name, sizeof name, "c%ld", peers.next_id++);
    id_.assign(name);
    Peers::Peer& p = peers.by_id[id_];
    p.inbox = inbox_;
    for (std::size_t k = 0; k < addresses_.size(); ++k) p.index[addresses_[k]] = k;
  }
  ~SimConnections() override { peers_.by_id.erase(id_); }
  std::size_t size() const override { return addresses_.size(); }
  const std::string& address(std::size_t k) const override { return addresses_.at(k); }
  bool send(std::size_t k, std::span<const std::byte> header, comm::OutPayload payload, comm::Deadline) override {
    const std::string& to = addresses_.at(k);
    SimMessage m = net_.copy_of(header, payload, id_);
    net_.carry(links_[k], std::move(m), [&net = net_, to](SimMessage&& msg) { net.arrive(to, std::move(msg)); });
    return true;
  }
  bool recv(comm::Message& m, std::size_t& from, comm::Deadline deadline) override {
    std::string f;
    if (!inbox_->pop(net_.scheduler(), m, f, deadline)) return false;
    from = std::stoul(f);
    return true;
  }

 private:
  SimTransport& net_;
  Peers& peers_;
  std::vector<std::string> addresses_;
  std::shared_ptr<SimTransport::Inbox> inbox_;
  std::vector<SimTransport::Link> links_;
  std::string id_;
};

class SimListener final : public comm::Listener {
 public:
  SimListener(SimTransport& net, Peers& peers, std::string address)
      : net_(net), peers_(peers), address_(std::move(address)), inbox_(std::make_shared<SimTransport::Inbox>(net)) {
    net.listening(address_, inbox_);
  }
  const std::string& address() const override { return address_; }
  bool recv(comm::Message& m, comm::PeerId& from, comm::Deadline deadline) override {
    return inbox_->pop(net_.scheduler(), m, from, deadline);
  }
  bool send(const comm::PeerId& to, std::span<const std::byte> header, comm::OutPayload payload) override {
    const auto it = peers_.by_id.find(to);
    std::shared_ptr<SimTransport::Inbox> inbox = it == peers_.by_id.end() ? nullptr : it->second.inbox.lock();
    if (!inbox) {  // the peer is gone
      comm::release(payload);
      return false;
    }
    if (DeliveryPolicy* p = net_.policy()) p->sent(address_, to, header);
    SimMessage m = net_.copy_of(header, payload, std::to_string(it->second.index.at(address_)));
    net_.carry(links_[to], std::move(m), [&s = net_.scheduler(), inbox](SimMessage&& msg) { inbox->push(s, std::move(msg)); });
    return true;
  }

 private:
  SimTransport& net_;
  Peers& peers_;
  std::string address_;
  std::shared_ptr<SimTransport::Inbox> inbox_;
  std::unordered_map<std::string, SimTransport::Link> links_;  // to each peer
};

// ---- the transport ----

SimTransport::SimTransport(Scheduler& s, const Costs& costs)
    : s_(s), costs_(costs), clock_(s, costs_), peers_(std::make_unique<Peers>()) {
  register_sim_collective();
}

SimTransport::~SimTransport() = default;

std::unique_ptr<comm::Listener> SimTransport::listen(const std::string& address, const comm::ListenOptions&) {
  if (address.rfind("sim://", 0) != 0) throw std::runtime_error("sim transport: cannot listen at " + address + " (sim://NAME)");
  if (const auto it = listeners_.find(address); it != listeners_.end() && !it->second.expired())
    throw std::runtime_error("sim transport: " + address + " is in use");
  return std::make_unique<SimListener>(*this, *peers_, address);
}

std::unique_ptr<comm::Connections> SimTransport::connect(const std::vector<std::string>& addresses,
                                                         const comm::ConnectOptions&) {
  for (const auto& a : addresses)
    if (a.rfind("sim://", 0) != 0) throw std::invalid_argument("sim transport: cannot connect to " + a + " (sim://NAME)");
  return std::make_unique<SimConnections>(*this, *peers_, addresses);
}

SimMessage SimTransport::copy_of(std::span<const std::byte> header, comm::OutPayload& payload, std::string from) {
  SimMessage m;
  m.header.assign(header.begin(), header.end());
  m.has_payload = !payload.empty();
  if (m.has_payload) {
    if (!pool_.empty()) m.payload = std::move(pool_.back()), pool_.pop_back();
    const auto* p = static_cast<const std::byte*>(payload.data);
    m.payload.assign(p, p + payload.size);  // (a pooled buffer's capacity is reused)
  }
  m.from = std::move(from);
  comm::release(payload);  // copied: the sender may reuse it at once
  return m;
}

void SimTransport::recycle(SimMessage& m) {
  if (m.payload.capacity() > 0 && pool_.size() < 4096) pool_.push_back(std::move(m.payload));
  m.payload.clear();
}

void SimTransport::carry(Link& link, SimMessage&& msg, std::function<void(SimMessage&&)> land) {
  // The link sends one message after the other at its bandwidth; each then takes its latency.
  link.free_at = std::max(s_.now(), link.free_at) + from_s(costs_.transfer_s(msg.bytes()));
  s_.at(link.free_at + from_s(costs_.latency_s),
        [m = std::move(msg), land = std::move(land)]() mutable { land(std::move(m)); });
}

void SimTransport::arrive(const std::string& address, SimMessage&& msg) {
  if (policy_) policy_->arrived(address, std::move(msg), [this, address](SimMessage&& m) { deliver(address, std::move(m)); });
  else deliver(address, std::move(msg));
}

void SimTransport::deliver(const std::string& address, SimMessage&& msg) {
  const auto it = listeners_.find(address);
  if (it == listeners_.end()) return early_[address].push_back(std::move(msg));  // it listens later
  std::shared_ptr<Inbox> inbox = it->second.lock();
  if (!inbox) return;  // it has closed: the message is lost, as on a socket
  if (!servers_.count(address)) return inbox->push(s_, std::move(msg));
  // A server takes one message at a time; a payload takes its time to apply.
  auto& busy = busy_until_[address];
  busy = std::max(s_.now(), busy) + from_s(msg.has_payload ? costs_.apply_s(msg.payload.size()) : 0.0);
  s_.at(busy, [this, inbox, m = std::move(msg)]() mutable { inbox->push(s_, std::move(m)); });
}

void SimTransport::listening(const std::string& address, std::shared_ptr<Inbox> inbox) {
  listeners_[address] = inbox;
  auto early = std::move(early_[address]);
  early_.erase(address);
  for (auto& m : early) deliver(address, std::move(m));
}

}  // namespace pslab::sim
