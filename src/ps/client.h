// The parameter-server client of a worker or an evaluator: a connection to every server
// (comm::Connections of the run's transport), every request sent to all servers at once and
// the replies collected as they come.
//
// θ and ∇θ are host buffers of all P floats; shard k is the contiguous range the server
// announced in its Welcome (checked against the local computation). Gradients leave encoded by
// the run's push codec (ps/codecs/): dense f32 zero-copy from the caller's buffer (copied as it
// is sent where the servers have backups), others from
// a buffer per shard allocated once; either is referenced until the transport is done, and
// push() waits for that before returning. Parameters arrive in the transport's buffer and are
// copied into θ in the same pass that verifies their checksum. Dense f32 pushes and replies of
// a shard larger than a piece (cluster.piece_kib, ps/pieces.h) travel in pieces: each piece is
// checksummed and sent while the ones before it travel, and each reply piece is copied into θ
// while the next arrives.
//
// Every wait has a deadline; a missing reply throws naming the server, its address, and
// what was waited for. An Error from a server throws with the server's message.
//
// Heartbeats (Options::heartbeat_s > 0): a server takes a worker silent for cluster.heartbeat_s
// as lost, so every server hears from this client at least every quarter of it: a Beat goes to
// each server that has had no message for that long, sent while a request waits for its replies
// and, while a worker computes, by a thread of the client's own (the evaluator: while it waits). The
// other way round, a server beats to a worker whose request it holds, so a server silent for
// heartbeat_s while a request waits is named at once (stopped, hung or gone), not at timeout_s.
// Liveness of the servers (comm/liveness.h): a server is watched while this client waits for its
// reply, and owed a Beat when nothing was sent to it for a quarter of heartbeat_s.
// Connections that come back: a TCP connection that is cut is made again by the transport, as a
// new peer to the server, and whatever was on its way is lost. The first message on it (a Beat
// at the latest, a quarter of heartbeat_s later) is answered unknown_peer; the client then says
// Hello again with its clock, the server moves its session to the new connection, and once the
// Welcome comes the request under way is sent again. The server applies a push once per
// (worker, clock) and answers one sent again as the first; answers that are not the request's
// (to a request sent twice) are skipped by their clock. A request goes again only when it left
// before the Hello again; the evaluator's, ungated, are numbered in their clock.
// Backups (cluster.replicas = 2, Options::backups): a server silent for heartbeat_s while a
// request waits is taken for dead and its backup (server/replication.cpp) for the shard: this
// client says Hello again to it, with its clock, and sends the request anew there; anything the
// old server sends afterwards is ignored. Should that one die too, the shard goes back to the
// first address, where the launcher started a new backup.
// Time: the transport's clock (Transport::clock()), so that the virtual cluster runs this client
// in simulated time.
// Threading: one thread calls the client; its heartbeat thread takes the connections only while
// no call is using them (a mutex).
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/liveness.h"
#include "comm/transport/in_flight.h"
#include "comm/transport/transport.h"
#include "comm/wire.h"
#include "ps/codecs/codec.h"
#include "ps/pieces.h"
#include "ps/shard_state.h"

namespace pslab {

struct ShardInfo {
  std::string endpoint;
  ShardRange range;
  long version = 0;  // version of the shard last pulled
  long clock = 0;    // this worker's clock at the shard when it said Welcome
};

// Where a resumed worker goes on (PsClient::catch_up).
struct ResumePoint {
  long clock = 0;        // the step to go on from: the furthest clock any server holds for it
  long lost_pushes = 0;  // pushes some server never got (the stop came between shards)
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
  struct Options {
    wire::Role role = wire::Role::worker;
    int rank = 0;                   // the worker's rank; wire::kEvaluator for the evaluator
    std::size_t num_params = 0;     // P, the length of θ
    std::vector<std::size_t> shard_layers;  // layers no shard may split (shard_layers(); empty: none)
    std::uint64_t config_hash = 0;  // config_fingerprint() of the run's config (servers check it)
    double timeout_s = 60.0;        // the run's cluster.timeout_s
    std::string codec = "f32";      // the run's cluster.codec, how pushes are encoded
    std::string pull_codec = "f32"; // how this client's pull replies encode θ (cluster.pull_codec; the evaluator: f32)
    bool error_feedback = false;    // cluster.error_feedback resolved: each shard's encoder keeps what it left out
    double heartbeat_s = 0.0;       // the run's cluster.heartbeat_s (workers; 0: no heartbeats)
    Pieces pieces;                  // cluster.piece_kib: how dense f32 pushes and pull replies are cut
    bool rejoin = false;            // cluster.on_server_loss = "restart": wait for a silent server
                                    // to come back and rejoin it (needs heartbeat_s > 0)
    double reconnect_s = 0;         // reconnect_window_s(): wait this long for a silent server's link
                                    // to come back, saying Hello again (needs heartbeat_s > 0)
    std::vector<std::string> backups;  // cluster.replicas = 2: each shard's backup, in shard order (needs heartbeat_s > 0)
    long total_steps = 0;           // a worker's steps in the run: a Welcome that puts it beyond them is
                                    // refused (0: no bound)
  };
  // `endpoints`: the servers' addresses in shard order. `transport` must outlive the client.
  PsClient(comm::Transport& transport, std::vector<std::string> endpoints, const Options& opt);
  ~PsClient();

  // Hello to every server, then waits for every Welcome (for workers, the start barrier:
  // servers answer once all workers said Hello). Heartbeats start here and stop at bye().
  void connect();
  // A resumed run (servers restored from checkpoints that may hold this worker at different
  // clocks: the stop came between one shard's push and the next's): brings every server up to
  // the furthest with pushes of an empty batch, which change nothing (bsp: the clock's mean is
  // over the batches that arrived), each with a pull of the next clock (bsp answers it once
  // every worker's push of this clock came), and returns where to go on. Call after connect().
  ResumePoint catch_up();
  // Pulls every shard for `clock` into theta (P floats).
  PullResult pull(long clock, float* theta);
  // How far training is (the evaluator): a PullResult of headers only, no θ moved.
  PullResult progress();
  // Pushes grad (P floats) computed at `clock` on the versions last pulled, over `batch`
  // samples. With theta != nullptr the servers answer with the parameters for clock + 1,
  // written into theta; otherwise they acknowledge.
  PullResult push(long clock, int batch, const float* grad, float* theta);
  // The same push in three parts, so that shards leave while backward still computes the rest
  // of grad (overlap): begin_push(); push_ready(lo) each time grad[lo, P) is final, which
  // sends every shard lying inside it that has not left; finish_push() sends what is left and
  // collects the replies (θ is written only there, after backward is done with it).
  void begin_push(long clock, int batch, const float* grad, float* theta);
  void push_ready(std::size_t lo);
  PullResult finish_push();
  // Told each time floats [lo, lo + n) of a θ buffer of pull() or finish_push() are written
  // (a reply's piece or shard, checked), while the rest of the reply arrives: a GPU worker
  // queues their copy to the device there (Replica::upload_params_async). Called on the calling
  // thread, inside pull() / finish_push().
  void on_params(std::function<void(std::size_t lo, std::size_t n)> landed) { params_landed_ = std::move(landed); }
  // Tells every server this worker is done (after its last push); each answers Ack.
  void bye(long clock);
  // Asks every server to exit once training is over (evaluator / launcher); each answers Ack.
  void shutdown();
  // One server's counters (JSON text).
  std::string stats(int shard);
  // Connections that came back (each said Hello again), and replies skipped as stale.
  long reconnects() const { return reconnects_; }
  long stale_replies() const { return stale_replies_; }
  long failovers() const { return failovers_; }

  const std::vector<ShardInfo>& shards() const { return shards_; }
  std::size_t num_params() const { return opt_.num_params; }

 private:
  // What a request's replies are (collect()).
  struct Expect {
    std::string what;   // for messages: "Pull (clock 3)"
    long clock = -1;    // the clock its PushAck or PullReply answers carry; others are stale (-1: any)
    bool watch = true;  // a pending server silent for heartbeat_s fails the wait (or is rejoined)
    std::function<void(int)> resend;  // resend(k): the request to server k again, after a Hello again
    bool hello = false;  // the request is the Hello: a Welcome is its answer
  };
  // One wait for replies: what for, from whom, until when.
  struct Wait {
    const Expect& e;
    std::vector<char>& pending;  // per server: 1 until its reply came
    bool watch;                  // e.watch, with heartbeats on
    bool can_rejoin;             // cluster.on_server_loss = "restart": say Hello to a silent server again
    RunClock::time_point deadline;
  };
  // Waits for a reply from every server marked in `pending`, handing it to on_reply(k, body)
  // (the message's payload, msg_.payload(), is valid during the call). Replies that are not the
  // request's (stale: to a request sent twice, or before a cut) are skipped. A server that does
  // not know this connection (it was cut and came back as a new one, or the server restarted)
  // is said Hello again, with this client's clock, and sent the request anew once it answers.
  // With heartbeats on, a pending server silent for heartbeat_s fails the wait, or with rejoin
  // is said Hello again until it is back.
  template <typename F>
  void collect(const Expect& e, std::vector<char>& pending, F&& on_reply);
  // One message from some server into msg_, sending Beats and watching the pending servers'
  // silence while it waits; throws at the deadline naming the servers it still waits for.
  int receive(const Wait& w);
  // The header of server k's message in msg_, when it is an answer for the caller; nullopt
  // when it was the wait's own business (a Beat, a Welcome to a Hello again, a stale reply, ...).
  std::optional<wire::Header> reply_from(int k, const Wait& w);
  // A pending server fell silent: rejoin it (say Hello again, up to back_within) or fail.
  void on_silent(int k, const Wait& w);
  void say_hello_again(int k, const Wait& w);
  // Server k fell silent and has a backup: from now on, shard k is the other copy's (its backup;
  // after that, where its server was, for a new backup the launcher started there).
  void fail_over(int k, const std::string& why);  // why: "went silent during Push (clock 3) (...)"
  // Whether shard k goes to its backup (connection S + k) rather than its server (k).
  bool on_backup(std::size_t k) const { return active_[k] != k; }
  // Server k answered unknown_peer: this connection is new to it. Says Hello again (once per
  // beat_every while no Welcome comes: a Hello lost in another cut is sent again).
  void on_unknown_peer(int k, const Wait& w);
  void send_hello_again(int k);
  RunClock::duration back_within() const;  // how long a silent server may take to come back (restart, link)
  std::string waiting_for_what() const;    // "its link coming back, cluster.reconnect_s = 30", for messages
  void check_welcome(int k, const wire::Welcome& w);  // the server serves the shard we expect; notes its version
  std::string who() const;                            // "worker 3", "evaluator"
  void send(int k, const wire::Body& body, comm::OutPayload payload = {});
  // A Beat to every server that has had nothing from this client for beat_every_ (never waits:
  // a full queue means messages are on their way anyway). Caller holds mu_.
  void beat_if_due();
  void heartbeat_loop(std::stop_token stop);
  [[noreturn]] void fail(int k, const std::string& what) const;
  // A PullReply (or one piece of it) into θ, checked; true once server k's reply is complete.
  bool take_params(int k, const wire::PullReply& r, std::span<const std::byte> payload, float* theta, PullResult& acc);
  static void note_progress(const wire::PullReply& r, PullResult& acc);  // versions, clocks, samples, done
  void send_push(int k);
  // A gradient's bytes to send: referenced until the transport is done (in_flight_), or, with
  // backups, copied by the transport as it is sent.
  comm::OutPayload gradient_payload(const void* data, std::size_t bytes);
  void expect_ack(const char* what, const wire::Body& request);

  std::mutex mu_;  // the connections and everything below: the calling thread or the heartbeat thread
  RunClock& clock_;   // the transport's
  std::unique_ptr<comm::Connections> conns_;
  std::vector<ShardInfo> shards_;
  std::vector<std::size_t> active_;  // per shard: its connection (k, or S + k: its backup)
  Options opt_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<PushCodec> codec_;  // the run's codec, stateless (catch-up pushes, its properties)
  std::unique_ptr<PushCodec> pull_codec_;  // how pull replies encode θ: null for dense f32
  // Codecs but f32, per shard: its encoder (with error feedback, it keeps that shard's residual),
  // its encoded gradient, and the clock it was encoded for (a push sent again is not re-encoded).
  std::vector<std::unique_ptr<PushCodec>> encoders_;
  std::vector<std::vector<std::byte>> encoded_;
  std::vector<std::size_t> encoded_bytes_;
  std::vector<long> encoded_clock_;
  std::vector<std::size_t> reply_piece_;  // per server: the next piece of the reply in progress
  std::function<void(std::size_t, std::size_t)> params_landed_;  // on_params()
  wire::Encoder enc_;
  comm::Message msg_;  // reused for every reply
  comm::InFlight in_flight_;
  // The push between begin_push() and finish_push().
  struct PushInProgress {
    long clock = 0;
    int batch = 0;
    const float* grad = nullptr;
    float* theta = nullptr;
    int next = -1;  // shards next, next-1, ..., 0 have not left (they leave last to first)
  } push_;
  std::chrono::milliseconds beat_every_{0};  // 0: no heartbeats
  comm::Liveness servers_;                   // per server
  long beat_step_ = 0;                       // the clock Beats report (and a rejoin)
  std::vector<RunClock::time_point> hello_sent_;  // per server: when it was last said Hello again
  std::vector<char> asked_since_hello_;           // per server: a request left after that Hello
  std::vector<char> to_backup_pending_;           // per shard: gone to its backup, whose Welcome has not come
  long evaluator_asks_ = 0;                       // the evaluator's requests so far: their Pull clocks
  long latest_asked_ = -1;                        // the latest clock a PushAck or PullReply was awaited for
  long reconnects_ = 0, stale_replies_ = 0;  // Hellos again after a connection came back; replies skipped
  long failovers_ = 0;                       // shards gone to their backups
  std::unique_ptr<ClockThread> heartbeats_;  // last member: stopped and joined first
};

}  // namespace pslab
