#include "snapshots.h"

#include <stdexcept>

#include "comm/net.h"

namespace pslab {

SnapshotSender::SnapshotSender(zmq::context_t& ctx, const std::string& endpoint, double interval_s, double timeout_s)
    : sock_(ctx, zmq::socket_type::push), endpoint_(endpoint), interval_(interval_s),
      next_(std::chrono::steady_clock::now()) {
  sock_.set(zmq::sockopt::sndhwm, 2);
  sock_.set(zmq::sockopt::linger, int(timeout_s * 1000));
  sock_.set(zmq::sockopt::sndtimeo, int(timeout_s * 1000));
  sock_.connect(endpoint);
}

void SnapshotSender::send(const float* theta, std::size_t n, long step, long samples, bool final) {
  next_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(interval_);
  zmq::message_t payload(theta, n * sizeof(float));  // a copy: θ changes with the next step
  const wire::PullReply h{step, step, 0, samples, 0, final, wire::checksum(theta, n), 0, n};
  zmq::message_t head = enc_.encode(wire::Header{0, -1, h});
  const auto flags = final ? zmq::send_flags::none : zmq::send_flags::dontwait;
  if (!sock_.send(head, flags | zmq::send_flags::sndmore)) {
    if (final) throw std::runtime_error("the evaluator at " + endpoint_ + " did not take the final snapshot in time");
    return;  // the evaluator is behind: skip this one
  }
  sock_.send(payload, zmq::send_flags::none);
}

SnapshotReceiver::SnapshotReceiver(zmq::context_t& ctx, const std::string& endpoint, double timeout_s)
    : sock_(ctx, zmq::socket_type::pull), endpoint_(endpoint),
      timeout_(std::chrono::milliseconds(long(timeout_s * 1000))) {
  sock_.set(zmq::sockopt::rcvhwm, 4);
  try {
    sock_.bind(net::bind_endpoint(endpoint));
  } catch (const zmq::error_t& e) {
    throw std::runtime_error("evaluator: cannot bind " + endpoint + ": " + e.what());
  }
}

Snapshot SnapshotReceiver::next(float* theta, std::size_t n) {
  zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, timeout_) == 0)
    throw std::runtime_error("no θ snapshot from rank 0 within " + std::to_string(timeout_.count() / 1000) +
                             " s (listening on " + endpoint_ + "): is rank 0 running? its log says why it stopped");
  std::vector<zmq::message_t> frames, newest;
  while (net::recv_all(sock_, frames)) newest = std::move(frames);  // keep only the newest
  std::string why;
  const auto h = newest.size() == 2 ? wire::decode(newest[0].data(), newest[0].size(), why) : std::nullopt;
  const auto* r = h ? std::get_if<wire::PullReply>(&h->body) : nullptr;
  if (!r || r->length != n || newest[1].size() != n * sizeof(float))
    throw std::runtime_error("malformed θ snapshot on " + endpoint_ + (why.empty() ? "" : ": " + why));
  if (wire::copy_with_checksum(theta, static_cast<const float*>(newest[1].data()), n) != r->checksum)
    throw std::runtime_error("θ snapshot checksum mismatch on " + endpoint_);
  return Snapshot{r->clock, r->samples_applied, r->training_done};
}

}  // namespace pslab
