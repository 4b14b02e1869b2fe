#include "snapshots.h"

#include <stdexcept>
#include <utility>

namespace pslab {

SnapshotSender::SnapshotSender(comm::Transport& transport, const std::string& endpoint, double interval_s,
                               double timeout_s)
    : endpoint_(endpoint), interval_(interval_s), timeout_(std::chrono::milliseconds(long(timeout_s * 1000))),
      next_(std::chrono::steady_clock::now()) {
  comm::ConnectOptions co;
  co.queue = 2;
  co.linger = timeout_;
  conn_ = transport.connect({endpoint}, co);
}

void SnapshotSender::send(const float* theta, std::size_t n, long step, long samples, bool final) {
  next_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(interval_);
  const wire::PullReply h{step, step, 0, samples, 0, final, wire::checksum(theta, n), 0, n, /*codec: dense f32*/ 0,
                          n * sizeof(float)};
  // No release function: the transport copies θ, which changes with the next step.
  const comm::OutPayload payload{theta, n * sizeof(float)};
  const auto deadline = final ? comm::Clock::now() + timeout_ : comm::Clock::now();
  if (!conn_->send(0, enc_.encode(wire::Header{0, -1, h}), payload, deadline) && final)
    throw std::runtime_error("the evaluator at " + endpoint_ + " did not take the final snapshot in time");
  // A non-final snapshot that could not be queued is skipped: the evaluator is behind.
}

SnapshotReceiver::SnapshotReceiver(comm::Transport& transport, const std::string& endpoint, double timeout_s)
    : endpoint_(endpoint), timeout_(std::chrono::milliseconds(long(timeout_s * 1000))) {
  comm::ListenOptions lo;
  lo.queue = 4;
  try {
    listener_ = transport.listen(endpoint, lo);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("evaluator: ") + e.what());
  }
}

Snapshot SnapshotReceiver::next(float* theta, std::size_t n) {
  comm::PeerId from;
  if (!listener_->recv(newest_, from, comm::Clock::now() + timeout_))
    throw std::runtime_error("no θ snapshot from rank 0 within " + std::to_string(timeout_.count() / 1000) +
                             " s (listening on " + endpoint_ + "): is rank 0 running? its log says why it stopped");
  while (listener_->recv(other_, from, comm::Clock::now())) std::swap(newest_, other_);  // keep only the newest
  other_.done_with_payload();  // shm: rank 0 may exit once the evaluator is done with what it sent
  std::string why = newest_.malformed();
  const auto h = why.empty() ? wire::decode(newest_.header(), why) : std::nullopt;
  const auto* r = h ? std::get_if<wire::PullReply>(&h->body) : nullptr;
  if (!r || r->length != n || newest_.payload().size() != n * sizeof(float))
    throw std::runtime_error("malformed θ snapshot on " + endpoint_ + (why.empty() ? "" : ": " + why));
  if (wire::copy_with_checksum(theta, reinterpret_cast<const float*>(newest_.payload().data()), n) != r->checksum)
    throw std::runtime_error("θ snapshot checksum mismatch on " + endpoint_);
  newest_.done_with_payload();
  return Snapshot{r->clock, r->samples_applied, r->training_done};
}

}  // namespace pslab
