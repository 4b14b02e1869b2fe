// θ snapshots from rank 0 of an all-reduce run to the evaluator, so that evaluation never
// slows a training rank: rank 0 copies θ into a message every eval.interval_s (one copy per
// interval, not per step) and sends it without waiting; a slow evaluator skips snapshots
// instead of holding training back (the queue holds 2). The final snapshot is sent waiting,
// with the timeout. The message is a PullReply header (clock = step, samples_applied,
// training_done = final, checksum) and θ as payload, over the run's transport. Between
// snapshots further apart than a quarter of the timeout (eval.every_epochs on a long epoch),
// the header alone (length 0, no payload) says rank 0 is alive.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "comm/transport/transport.h"
#include "comm/wire.h"

namespace pslab {

class SnapshotSender {
 public:
  // `transport` must outlive the sender.
  SnapshotSender(comm::Transport& transport, const std::string& evaluator_endpoint, double interval_s, double timeout_s);
  // Whether a snapshot is due now.
  bool due() const { return clock_.now() >= next_; }
  // Sends θ (host, n floats) taken after `step` steps and `samples` samples (all ranks); whether
  // it went. One that must arrive (the final one, θ0 under eval.every_epochs: `wait`) waits up
  // to the timeout for the evaluator (which may still be starting) and throws naming it if it
  // does not take it; another is sent only if the evaluator has room (it is behind otherwise).
  bool send(const float* theta, std::size_t n, long step, long samples, bool final, bool wait = false);
  // After each step: the header alone, when nothing went out for a quarter of the timeout.
  void keep_alive(long step, long samples);

 private:
  RunClock& clock_;  // the transport's
  std::unique_ptr<comm::Connections> conn_;
  std::string endpoint_;
  std::chrono::duration<double> interval_;
  std::chrono::milliseconds timeout_;
  RunClock::time_point next_;
  RunClock::time_point last_sent_;  // when a message last went out
  wire::Encoder enc_;
};

struct Snapshot {
  long step = 0, samples = 0;
  bool final = false;
  long dropped = 0;  // bad messages the receiver has dropped so far
};

class SnapshotReceiver {
 public:
  // Listens at `endpoint` (e.g. tcp://127.0.0.1:5600). `transport` must outlive the receiver.
  // `each`: every snapshot is taken, in order (eval.every_epochs: each is a tick of the curve);
  // otherwise the newest of those waiting (eval.interval_s: the evaluator catches up).
  SnapshotReceiver(comm::Transport& transport, const std::string& endpoint, double timeout_s, bool each = false);
  // Waits for the next snapshot (keeping only the newest if several wait, unless `each`) and copies it into
  // theta (n floats). Throws after the timeout (from rank 0's last sign of life) naming what
  // it waited for. A message that is
  // not a good snapshot (malformed, another kind, the wrong size, a bad checksum) is bad input,
  // never fatal: counted by reason, said on stderr (the first 3 of each reason, then every
  // 1000th) and dropped, θ untouched.
  Snapshot next(float* theta, std::size_t n);
  // Bad messages dropped so far, by reason.
  const std::map<std::string, long>& dropped_by_reason() const { return dropped_; }
  long dropped() const;

 private:
  static std::string check(const comm::Message& m, std::size_t n, wire::PullReply& r);

  RunClock& clock_;  // the transport's
  std::unique_ptr<comm::Listener> listener_;
  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  comm::Message newest_, other_;
  std::map<std::string, long> dropped_;
  comm::PeerId rank0_;  // the connection rank 0 sends on (its first message's)
  bool each_;
};

}  // namespace pslab
