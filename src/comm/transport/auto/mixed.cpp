#include "comm/transport/auto/mixed.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

#include <zmq.h>

#include "comm/interrupt.h"

namespace pslab::comm {
namespace {

// The parts' own messages, kept in the outer Message and reused: the outer one shows the bytes
// of parts[last].
struct MixedHeld final : Message::Storage {
  std::vector<Message> parts;
  std::size_t last = SIZE_MAX;
  void payload_done() override {
    if (last < parts.size()) parts[last].done_with_payload();
  }
};

MixedHeld& held_in(Message& m, std::size_t parts) {
  MixedHeld& held = m.storage<MixedHeld>();
  if (held.parts.size() != parts) held.parts.resize(parts);
  held.payload_done();  // the message received before is done with, whichever part it came from
  held.last = SIZE_MAX;
  return held;
}

void show(Message& m, MixedHeld& held, std::size_t part) {
  held.last = part;
  const Message& in = held.parts[part];
  if (!in.malformed().empty()) return m.set_malformed(in.malformed(), in.wire_bytes());
  m.set(in.header(), in.payload(), in.has_payload(), in.wire_bytes());
}

// Waits until a part may have a message, or `deadline` passes (a millisecond at most when the
// parts have nothing to poll). A signal ends the wait early: callers look again and loop.
template <typename Part>
void wait_any(const std::vector<std::unique_ptr<Part>>& parts, std::vector<PollItem>& items,
              std::vector<zmq_pollitem_t>& polls, Deadline deadline) {
  items.clear();
  for (const auto& p : parts) p->poll_items(items);
  polls.clear();
  for (const PollItem& i : items) polls.push_back({i.zmq_socket, i.fd, ZMQ_POLLIN, 0});
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  left = std::max(left, std::chrono::milliseconds(0));
  if (polls.empty()) return std::this_thread::sleep_for(std::min(left, std::chrono::milliseconds(1)));
  zmq_poll(polls.data(), int(polls.size()), interrupt_slice_ms(long(left.count())));
  throw_if_interrupted();
}

class MixedListener final : public Listener {
 public:
  MixedListener(std::string address, std::vector<std::unique_ptr<Listener>> parts)
      : address_(std::move(address)), parts_(std::move(parts)) {
    if (parts_.empty() || parts_.size() > 10) throw std::invalid_argument("a mixed listener has 1 to 10 parts");
  }
  const std::string& address() const override { return address_; }

  bool recv(Message& m, PeerId& from, Deadline deadline) override {
    MixedHeld& held = held_in(m, parts_.size());
    const std::size_t n = parts_.size();
    for (;;) {
      for (std::size_t i = 0; i < n; ++i) {  // round robin, so that no part starves another
        const std::size_t k = (next_ + i) % n;
        if (parts_[k]->recv(held.parts[k], from, Clock::now())) {  // a deadline now: only looks
          next_ = k + 1;
          from.insert(from.begin(), char('0' + k));
          show(m, held, k);
          return true;
        }
      }
      if (Clock::now() >= deadline) return false;
      wait_any(parts_, items_, polls_, deadline);
    }
  }

  bool send(const PeerId& to, std::span<const std::byte> header, OutPayload payload) override {
    const std::size_t k = to.empty() ? parts_.size() : std::size_t(to[0] - '0');
    if (k >= parts_.size()) {  // not a peer id of this listener
      release(payload);
      return false;
    }
    return parts_[k]->send(to.substr(1), header, payload);
  }

  void poll_items(std::vector<PollItem>& out) const override {
    for (const auto& p : parts_) p->poll_items(out);
  }

 private:
  std::string address_;
  std::vector<std::unique_ptr<Listener>> parts_;
  std::size_t next_ = 0;
  std::vector<PollItem> items_;
  std::vector<zmq_pollitem_t> polls_;
};

class MixedConnections final : public Connections {
 public:
  MixedConnections(std::vector<std::string> addresses, std::vector<std::unique_ptr<Connections>> parts,
                   std::vector<PartIndex> where)
      : addresses_(std::move(addresses)), parts_(std::move(parts)), where_(std::move(where)) {
    if (where_.size() != addresses_.size()) throw std::invalid_argument("mixed connections: one place per address");
    global_.resize(parts_.size());
    for (std::size_t p = 0; p < parts_.size(); ++p) global_[p].assign(parts_[p]->size(), SIZE_MAX);
    for (std::size_t k = 0; k < where_.size(); ++k) {
      const PartIndex w = where_[k];
      if (w.part >= parts_.size() || w.index >= global_[w.part].size() || global_[w.part][w.index] != SIZE_MAX)
        throw std::invalid_argument("mixed connections: address " + addresses_[k] + " has no place of its own");
      global_[w.part][w.index] = k;
    }
  }
  std::size_t size() const override { return addresses_.size(); }
  const std::string& address(std::size_t k) const override { return addresses_.at(k); }

  bool send(std::size_t k, std::span<const std::byte> header, OutPayload payload, Deadline deadline) override {
    const PartIndex w = where_.at(k);
    return parts_[w.part]->send(w.index, header, payload, deadline);
  }

  bool recv(Message& m, std::size_t& from, Deadline deadline) override {
    MixedHeld& held = held_in(m, parts_.size());
    const std::size_t n = parts_.size();
    for (;;) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t p = (next_ + i) % n;
        std::size_t index = 0;
        if (parts_[p]->recv(held.parts[p], index, Clock::now())) {
          next_ = p + 1;
          from = global_[p].at(index);
          show(m, held, p);
          return true;
        }
      }
      if (Clock::now() >= deadline) return false;
      wait_any(parts_, items_, polls_, deadline);
    }
  }

  void progress() override {
    for (auto& p : parts_) p->progress();
  }
  void poll_items(std::vector<PollItem>& out) const override {
    for (const auto& p : parts_) p->poll_items(out);
  }

 private:
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<Connections>> parts_;
  std::vector<PartIndex> where_;                  // address k -> its part and index there
  std::vector<std::vector<std::size_t>> global_;  // [part][index] -> address k
  std::size_t next_ = 0;
  std::vector<PollItem> items_;
  std::vector<zmq_pollitem_t> polls_;
};

}  // namespace

std::unique_ptr<Listener> mixed_listener(std::string address, std::vector<std::unique_ptr<Listener>> parts) {
  return std::make_unique<MixedListener>(std::move(address), std::move(parts));
}

std::unique_ptr<Connections> mixed_connections(std::vector<std::string> addresses,
                                               std::vector<std::unique_ptr<Connections>> parts,
                                               std::vector<PartIndex> where) {
  return std::make_unique<MixedConnections>(std::move(addresses), std::move(parts), std::move(where));
}

}  // namespace pslab::comm
