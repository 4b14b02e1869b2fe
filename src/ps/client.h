// The parameter-server client of a worker or an evaluator: a connection to every server
// (comm::Connections of the run's transport), every request sent to all servers at once and
// the replies collected as they come.
//
// θ and ∇θ are host buffers of all P floats; shard k is the contiguous range the server
// announced in its Welcome (checked against the local computation). Gradients leave
// zero-copy (the caller's buffer is referenced until the transport is done, and push() waits
// for that before returning); parameters arrive in the transport's buffer and are copied into
// θ in the same pass that verifies their checksum.
//
// Every wait has a deadline; a missing reply throws naming the server, its address, and
// what was waited for. An Error from a server throws with the server's message.
// Threading: one thread per client.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "comm/transport/in_flight.h"
#include "comm/transport/transport.h"
#include "comm/wire.h"
#include "ps/shard_state.h"

namespace pslab {

struct ShardInfo {
  std::string endpoint;
  ShardRange range;
  long version = 0;  // version of the shard last pulled
};

// What a round of pull replies said, over all shards.
struct PullResult {
  long min_version = 0, max_version = 0;
  long samples_applied = 0;   // min over shards
  long held_us = 0;           // longest a server held the pull (consistency wait)
  long min_clock = 0;         // slowest worker's clock (min over shards)
  bool training_done = false; // every server: every worker said Bye
};

class PsClient {
 public:
  // rank: the worker's rank, or wire::kEvaluator with role evaluator. `transport` must outlive
  // the client.
  PsClient(comm::Transport& transport, std::vector<std::string> endpoints, wire::Role role, int rank,
           std::size_t num_params, std::uint64_t config_hash, double timeout_s);
  ~PsClient();

  // Hello to every server, then waits for every Welcome (for workers, the start barrier:
  // servers answer once all workers said Hello).
  void connect();
  // Pulls every shard for `clock` into theta (P floats).
  PullResult pull(long clock, float* theta);
  // Pushes grad (P floats) computed at `clock` on the versions last pulled, over `batch`
  // samples. With theta != nullptr the servers answer with the parameters for clock + 1,
  // written into theta; otherwise they acknowledge.
  PullResult push(long clock, int batch, const float* grad, float* theta);
  // Tells every server this worker is done (after its last push); each answers Ack.
  void bye(long clock);
  // Asks every server to exit once training is over (evaluator / launcher); each answers Ack.
  void shutdown();
  // One server's counters (JSON text).
  std::string stats(int shard);

  const std::vector<ShardInfo>& shards() const { return shards_; }
  std::size_t num_params() const { return num_params_; }

 private:
  // Waits for one reply from each server in `pending`, handing it to on_reply(k, header,
  // message) (the message's payload is valid during the call).
  template <typename F>
  void collect(const std::string& what, std::vector<char>& pending, F&& on_reply);
  void send(int k, const wire::Body& body, comm::OutPayload payload = {});
  [[noreturn]] void fail(int k, const std::string& what) const;
  void take_params(int k, const wire::PullReply& r, std::span<const std::byte> payload, float* theta, PullResult& acc);
  void expect_ack(const char* what);

  std::unique_ptr<comm::Connections> conns_;
  std::vector<ShardInfo> shards_;
  wire::Role role_;
  int rank_;
  std::size_t num_params_;
  std::uint64_t config_hash_;
  std::chrono::milliseconds timeout_;
  wire::Encoder enc_;
  comm::Message msg_;  // reused for every reply
  comm::InFlight in_flight_;
};

}  // namespace pslab
