#include "comm/snapshots.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace pslab {

SnapshotSender::SnapshotSender(comm::Transport& transport, const std::string& endpoint, double interval_s,
                               double timeout_s)
    : clock_(transport.clock()), endpoint_(endpoint), interval_(interval_s),
      timeout_(std::chrono::milliseconds(long(timeout_s * 1000))), next_(clock_.now()), last_sent_(clock_.now()) {
  comm::ConnectOptions co;
  co.queue = 2;
  co.linger = timeout_;
  conn_ = transport.connect({endpoint}, co);
}

bool SnapshotSender::send(const float* theta, std::size_t n, long step, long samples, bool final, bool wait) {
  next_ = clock_.now() + std::chrono::duration_cast<RunClock::duration>(interval_);
  const wire::PullReply h{step, step, 0, samples, 0, final, wire::checksum(theta, n), 0, n, /*codec: dense f32*/ 0,
                          n * sizeof(float)};
  // No release function: the transport copies θ, which changes with the next step.
  const comm::OutPayload payload{theta, n * sizeof(float)};
  wait = wait || final;
  const auto deadline = wait ? clock_.now() + timeout_ : clock_.now();
  const bool sent = conn_->send(0, enc_.encode(wire::Header{0, -1, h}), payload, deadline);
  if (!sent && wait)
    throw std::runtime_error("the evaluator at " + endpoint_ + " did not take the " + (final ? "final" : "first") +
                             " snapshot within cluster.timeout_s");
  if (sent) last_sent_ = clock_.now();
  return sent;
}

void SnapshotSender::keep_alive(long step, long samples) {
  if (clock_.now() - last_sent_ < timeout_ / 4) return;
  const wire::PullReply h{step, step, 0, samples, 0, false, 0, 0, /*length*/ 0, 0, /*bytes*/ 0};
  if (conn_->send(0, enc_.encode(wire::Header{0, -1, h}), {}, clock_.now())) last_sent_ = clock_.now();
}

SnapshotReceiver::SnapshotReceiver(comm::Transport& transport, const std::string& endpoint, double timeout_s, bool each)
    : clock_(transport.clock()), endpoint_(endpoint), timeout_(std::chrono::milliseconds(long(timeout_s * 1000))),
      each_(each) {
  comm::ListenOptions lo;
  lo.queue = 4;
  try {
    listener_ = transport.listen(endpoint, lo);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("evaluator: ") + e.what());
  }
}

// Why `m` is not a θ snapshot of n floats ("" if it is one); sets `r` from its header.
std::string SnapshotReceiver::check(const comm::Message& m, std::size_t n, wire::PullReply& r) {
  if (!m.malformed().empty()) return "malformed";
  std::string why;
  const auto h = wire::decode(m.header(), why);
  if (!h) return "malformed";
  const auto* p = std::get_if<wire::PullReply>(&h->body);
  if (!p) return "not a snapshot";
  if (h->sender != 0) return "not from rank 0";
  if (p->length == 0 && m.payload().empty()) return "alive";  // rank 0's sign of life between snapshots
  if (p->length != n || m.payload().size() != n * sizeof(float)) return "wrong size";
  if (wire::checksum_bytes(m.payload().data(), m.payload().size()) != p->checksum) return "bad checksum";
  r = *p;
  return "";
}

Snapshot SnapshotReceiver::next(float* theta, std::size_t n) {
  auto deadline = clock_.now() + timeout_;
  comm::PeerId from;
  bool have = false;
  wire::PullReply newest;
  // Everything waiting, then (if none of it was a snapshot) more until the deadline; the newest
  // good snapshot wins, anything else is counted and dropped.
  while (listener_->recv(other_, from, have ? clock_.now() : deadline)) {
    wire::PullReply r;
    std::string why = check(other_, n, r);
    // The connection rank 0's first message came on is rank 0's: another that claims to be it
    // (a rank, or anyone under cluster.auth = "none") is not taken, alive or with a θ of its own.
    if ((why.empty() || why == "alive") && rank0_.empty()) rank0_ = from;
    if ((why.empty() || why == "alive") && from != rank0_) why = "not from rank 0";
    if (why == "alive") {
      if (!have) deadline = clock_.now() + timeout_;
    } else if (why.empty()) {
      std::swap(newest_, other_);
      newest = r, have = true;
    } else {
      const long k = ++dropped_[why];
      if (k <= 3 || k % 1000 == 0)
        std::fprintf(stderr, "evaluator: dropped a message on %s: %s%s (%ld so far)\n", endpoint_.c_str(), why.c_str(),
                     other_.malformed().empty() ? "" : (", " + other_.malformed()).c_str(), k);
    }
    other_.done_with_payload();  // shm: its sender may exit once the evaluator is done with it
    if (have && each_) break;      // (the next ones wait for the next call)
  }
  if (!have)
    throw std::runtime_error("no θ snapshot (nor a sign of life) from rank 0 within " + std::to_string(timeout_.count() / 1000) +
                             " s (listening on " + endpoint_ + (dropped() ? ", " + std::to_string(dropped()) +
                             " bad message(s) dropped" : "") + "): is rank 0 running? its log says why it stopped");
  std::memcpy(theta, newest_.payload().data(), n * sizeof(float));
  newest_.done_with_payload();
  return Snapshot{newest.clock, newest.samples_applied, newest.training_done, dropped()};
}

long SnapshotReceiver::dropped() const {
  long total = 0;
  for (const auto& [why, k] : dropped_) total += k;
  return total;
}

}  // namespace pslab
