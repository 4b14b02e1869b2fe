// A parameter server: one shard of θ, its optimizer state, its version and clock table
// (ShardState), served on a transport's Listener (comm/transport/) by a single-threaded
// event loop. Its concerns, one file each:
//   server.cpp       the event loop: what it waits for, and for how long
//   requests.cpp     every message checked, then answered: Hello and the start barrier, pulls
//                    (served now or held for the rule), pushes, progress polls, Bye, Shutdown
//   peers.cpp        liveness of the workers (comm/liveness.h): Beats to held workers, lost
//                    workers dropped or named, a worker rejoining a restarted server or
//                    coming back on a new connection
//   checkpoints.cpp  the shard's checkpoints: written periodically and at the end; resume
//   stats.cpp        its counters: the Stats reply and the metrics lines
//   replication.cpp  chain replication (cluster.replicas = 2): a primary sends its backup every
//                    input that changes the shard and answers its peers only once the backup has
//                    what came before; a backup applies them, and takes over when a worker or the
//                    evaluator comes to it (its primary is gone)
//   push_guard.h     what it refuses from a worker that holds the run's key (cluster.push_guard);
//                    requests.cpp applies it to each push as it arrives
//
// Every received message is checked before use: frame count, the header (FlatBuffers
// verifier, magic, protocol), the sender (must have said Hello, rank must match), shard id,
// offset, length and payload checksum. A message that fails is counted in `bad` by reason and
// answered with an Error naming the fault; it never reaches the parameters.
//
// Nothing hangs silently: a pull held longer than the timeout is answered with an Error that
// names the workers it waited for; a start barrier that does not fill, or silence from every
// worker, ends the server with an error naming the missing workers.
//
// Lost workers: a worker sends a message (or a Beat) at least every cluster.heartbeat_s / 4, so
// one silent for cluster.heartbeat_s has died, hangs, or is cut off. Where the run continues
// without it (cluster.on_worker_loss, asp and ssp) the server drops it from the clock table,
// says so once (stderr, a "worker_lost" metrics line, the final stats) and counts it as done;
// otherwise it ends with an error naming the worker. A worker dropped as silent that speaks again
// within cluster.reconnect_s (its link came back), while others still train, is taken back.
// Where the run cannot go on without it (bsp), a silent worker is awaited cluster.reconnect_s
// more before the server fails naming it. When no worker at all has been heard for
// heartbeat_s, the silence is this server's (its link is down): nobody is dropped, the server
// waits (up to timeout_s) for them, and once it hears one again every worker has heartbeat_s
// from then (the first one back does not make the others look lost).
//
// Connections that come back: a worker whose connection was cut (its transport reconnects by
// itself, as a new peer) says Hello again with its clock; the server moves the worker's session
// to the new connection and drops what it had under way there, which the worker sends again.
// A push is applied once per (worker, clock): one for a clock already taken is answered as the
// first was, and counted (pushes_duplicate), never applied twice.
//
// Time: the transport's clock (Transport::clock()), so that the virtual cluster runs this
// server in simulated time.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/liveness.h"
#include "comm/transport/transport.h"
#include "comm/wire.h"
#include "ps/order_trace.h"
#include "ps/pull_encoding.h"
#include "ps/shard_state.h"
#include "push_guard.h"
#include "run/config.h"
#include "run/metrics.h"

namespace pslab {

struct ServerOptions {
  std::string endpoint;          // where to listen, an address of the run's transport, e.g. tcp://127.0.0.1:5555
  int shard = 0;
  std::string metrics_path;      // JSON lines ("" = none)
  double run_start = 0.0;        // Unix seconds of the run's start (0 = now)
  bool wait_for_shutdown = false;  // after every worker's Bye, keep serving until a Shutdown
  bool record_pulls = false;     // keep (and write) a record of every served pull
  double stats_every_s = 1.0;    // period of the "server" metrics line
  int procs_on_host = 1;         // processes sharing this host's cores (cluster.server_threads = 0)
  int servers_on_host = 1;       // of them servers (and backups): a GPU run's share the cores the rest leave
  const std::atomic<bool>* stop = nullptr;  // set (e.g. by a signal handler) to stop serving
  // Checkpoints (ps/checkpoint.h): written to checkpoint_path every checkpoint.every_s and when
  // the server stops, however it stops ("" = none); resume_path: go on from this checkpoint.
  std::string checkpoint_path, resume_path;
  // A server of a run under way, restarted without a checkpoint: no start barrier, the run's
  // initial θ; what the workers had pushed to it is lost (counted as they rejoin).
  bool restarted = false;
  std::string trace_path;        // the order of applied pushes and served pulls (ps/order_trace.h; "" = none)
  // cluster.replicas = 2: this server is the backup of the primary listening here ("": a primary;
  // it then waits for its backup's Hello before the start barrier opens).
  std::string backup_of;
};

struct ServerCounters {
  long pushes = 0, pulls = 0, pulls_held = 0, progress_polls = 0;
  double hold_ms_total = 0.0, hold_ms_max = 0.0;
  long bytes_in = 0, bytes_out = 0;  // bytes_in: of the messages taken (bad input: bytes_bad)
  long bytes_bad = 0;                // of the messages counted as bad input
  long dropped_replies = 0;         // replies the transport could not queue (peer gone or not reading)
  long reconnects = 0;              // workers back on a new connection (their session moved to it)
  long workers_back = 0;            // workers dropped as silent that came back (cluster.reconnect_s)
  long pushes_duplicate = 0;        // pushes for a clock already taken: answered, not applied again
  long replicated = 0;              // inputs sent to the backup (a primary) or applied from the primary (a backup)
  long replies_waited = 0;          // replies that waited for the backup to have what came before them
  struct Pushed {
    long pushes = 0, payload_bytes = 0;
  };
  std::map<std::string, Pushed> pushed;  // push codec -> accepted pushes and their payload bytes
  std::map<std::string, long> bad;  // reason -> count
  long bad_total() const;
};

class Server : private ShardState::Listener {
 public:
  // Listens at construction (so a test can connect right away). `transport` must outlive the
  // server.
  Server(comm::Transport& transport, const ExperimentConfig& cfg, const ServerOptions& opt);
  ~Server();

  // Serves until every worker said Bye (and a Shutdown came, with wait_for_shutdown).
  // Throws std::runtime_error when a wait times out, naming whom it waited for.
  void run();

  const ShardState& state() const { return *state_; }
  const ServerCounters& counters() const { return counters_; }
  long updates_lost() const { return updates_lost_; }
  ShardRange range() const { return range_; }
  // [{worker, clock, silent_s}] of the workers dropped as lost, in order (dropped by the push
  // guard: {worker, clock, refused, reason}).
  const nlohmann::ordered_json& workers_lost() const { return losses_; }
  // The push guard (null: cluster.push_guard = false).
  const PushGuard* guard() const { return guard_.get(); }
  // cluster.replicas = 2: whether this server is a backup that has not taken over.
  bool is_backup() const { return bool(upstream_); }

 private:
  using time_point = RunClock::time_point;
  struct Peer {
    wire::Role role;
    int rank;
  };
  struct HeldPull {
    std::string identity;
    int rank;
    long clock;
    time_point since;
  };

  // ---- the event loop (server.cpp) ----
  // Handles what has arrived until `wake` (at most 256 messages, so that timers run under a
  // flood); returns whether nothing is left queued.
  bool serve_until(time_point wake);
  // The waits that end the server with an error naming whom they waited for.
  void check_waits(time_point now);
  int finished() const { return finished_; }  // workers done: said Bye, or dropped as lost
  bool done() const;
  std::string who() const;  // "server 1 (tcp://...)"

  // ---- requests (requests.cpp) ----
  void handle(const comm::PeerId& id, const comm::Message& m);  // accounts bytes, then handle_message()
  void handle_message(const comm::PeerId& id, const comm::Message& m);
  // The peer that sent `h` on connection `id`, checked; null (answered with an Error) if none.
  Peer* sender(const comm::PeerId& id, const wire::Header& h);
  void on_hello(const std::string& id, const wire::Hello& m);
  void open_barrier_when_full(const std::string& id);
  wire::Header welcome(const std::string& to) const;
  void on_pull(const std::string& id, const Peer& p, long clock);
  void on_push(const std::string& id, const Peer& p, const wire::Push& m, const comm::Message& msg);
  void on_duplicate_push(const std::string& id, const Peer& p, const wire::Push& m);
  // ShardState::Listener: a piece of a push applied (a streamed reply's piece leaves); a push
  // ended: its held messages given back, then counted, traced and answered (PushAck, the pull
  // it asked for, or an Error), unless the server abandoned it.
  void piece_applied(int worker, std::size_t piece) override;
  void push_ended(const ShardState::Done& d) override;
  void finish_push(const ShardState::Done& d);
  // After a piece of a streaming push+pull: its reply's piece, when the pull will be ready.
  void reply_streamed_piece(const std::string& id, int rank, std::size_t piece);
  // Piece `piece` of a PullReply `r` (its fields filled in here) from version buffer `buf`, which
  // the caller acquired for this send (released by the transport once sent).
  void send_piece(const std::string& id, wire::PullReply& r, std::size_t piece, std::uint64_t checksum,
                  ParamVersions::Buffer* buf);
  // A served pull's counters, record, trace and metrics line.
  void note_served(int rank, long clock, double held_s, const wire::PullReply& r);
  // Why the push cannot be applied ("" if it can), with the Error code to answer.
  std::string refuse_push(const Peer& p, const wire::Push& m, const comm::Message& msg, wire::ErrorCode& code) const;
  void on_bye(const std::string& id, const Peer& p);
  void on_shutdown(const std::string& id, const Peer& p);
  void serve_pull(const std::string& id, int rank, long clock, time_point since);
  void serve_progress(const std::string& id, const Peer& p, long asked);  // a progress-only Pull: the header, no θ
  void release_ready_pulls();
  // Why a pull for `clock` can never be served ("" if it may be): a mode that needs every
  // worker's push, and a worker that said Bye before pushing clock - 1. Such pulls, held,
  // are answered with that as an Error.
  std::string held_for_good(long clock) const;
  void refuse_pulls_held_for_good();
  void expire_held_pulls(time_point now);
  // Sends, or (a primary whose backup lacks inputs sent before it) queues until the backup has them.
  void send(const std::string& id, const wire::Header& h, comm::OutPayload payload = {});
  void transmit(const std::string& id, std::span<const std::byte> head, comm::OutPayload payload, const char* what);
  // Answers with an Error; counts it as a bad message (by code), except timeouts.
  void reply_error(const std::string& id, wire::ErrorCode code, const std::string& message);
  wire::Header header(wire::Body body) const { return wire::Header{wire::kServer, opt_.shard, std::move(body)}; }
  std::string missing_hellos() const;

  // ---- liveness of the workers (peers.cpp) ----
  // Workers silent for the heartbeat timeout: dropped (lose_worker) or, where the run cannot go
  // on without them, an error naming them. Called only when every queued message was handled.
  void find_lost_workers(time_point now);
  // A Beat to each worker whose pull has been held for a quarter of heartbeat_s since the last
  // one: it tells that worker this server is alive (PsClient names a silent one).
  void beat_held_pulls(time_point now);
  // Pushes begun and not ended: their workers are beaten likewise while they wait (their turn,
  // or their own pieces to come), and a push none of whose pieces came for timeout_s is
  // abandoned (nothing of it applied; the pushes behind it go on), the worker told which piece.
  void watch_open_pushes(time_point now);
  // A worker's Hello to a server restarted from its checkpoint: moves its clock up to `clock`,
  // counting the updates the checkpoint lacks (updates_lost in stats and metrics).
  void rejoin(int rank, long clock);
  // A worker's Hello again (Hello::rejoin_clock >= 0) to this server, which has its session: its
  // connection was cut and came back. The session moves to connection `id`; what it had under
  // way (a push in pieces, a held pull) is dropped, for the worker sends it again.
  void resume_session(int rank, const std::string& id, long clock);
  void lose_worker(int rank, double silent_s);
  // Whether worker `rank`, dropped as silent, may come back now (its link was down): within
  // cluster.reconnect_s of the drop, while training is not over. readmit() takes it back: it
  // trains on from its clock, as if never dropped.
  bool may_return(int rank) const;
  void readmit(int rank);
  // Where the run cannot go on without a worker (bsp) and cluster.reconnect_s > 0: a silent one
  // is awaited that long more; heard again, training goes on; still silent, the server fails
  // naming it.
  void await_silent_workers(time_point now);
  // Drops a worker (where the run trains on without it; else throws naming it and `why`): its
  // open push abandoned, its held pull answered; `record`'s keys join {worker, clock} in
  // workers_lost and the "worker_lost" metrics line.
  void drop_worker(int rank, const std::string& why, const nlohmann::ordered_json& record);

  // ---- the push guard (requests.cpp) ----
  // Whether this piece of a worker's push is not to be applied: the guard refused its push
  // (now, or at an earlier piece). At the refused push's last piece, an empty push takes its place.
  bool guard_refuses(int rank, const wire::Push& m, const comm::Message& msg);
  std::string guard_check(int rank, const wire::Push& m, std::span<const std::byte> payload);
  void push_empty_instead(int rank);

  // ---- chain replication (replication.cpp) ----
  // The primary: its backup's Hello (the start barrier waits for it), its answers, its silence.
  void on_replica_hello(const std::string& id, const wire::Hello& m);
  // A backup starts receiving: at the start, or (a run under way) with the whole shard first,
  // sent once no push is half-way (attach_joining_replica(), from the event loop).
  void attach_replica(const std::string& id);
  void attach_joining_replica();
  void on_replicated(const std::string& id, const wire::Replicated& r);
  void check_replica(time_point now);
  // Goes on without its backup (`took_over`: the backup serves the shard now, so this one stops: throws).
  void lose_replica(const std::string& why, bool took_over = false);
  bool replicating() const { return !replica_id_.empty(); }
  // Sends the backup one input (a piece's payload is copied into a buffer of the backup's own;
  // shm: lent). Every input that changes the shard goes through here before the shard sees it.
  void replicate(wire::ReplicaEvent event, int worker, long clock = 0, const wire::Push* push = nullptr,
                 std::span<const std::byte> payload = {});
  // What the shard is given, replicated first (a primary with a backup).
  void push_to_shard(int worker, const wire::Push& m, std::span<const std::byte> payload, std::uint64_t checksum);
  void abandon_in_shard(int worker);
  // Replies that wait for the backup to have the inputs before them, in order.
  void release_replies();
  // A backup: its loop until it takes over (inputs from the primary, a look at its listener for a
  // worker or evaluator that came over), the inputs, and the takeover.
  void serve_as_backup(time_point wake);
  void on_replicate(const wire::Replicate& r);
  void take_over(const std::string& by);
  // A backup whose primary has been silent to it for half of heartbeat_s (it beats while idle).
  bool primary_gone() const {
    return primary_lost_ || seconds_between(upstream_heard_, clock_.now()) >= cfg_.cluster.heartbeat_s / 2;
  }
  void hello_upstream();  // a backup's Hello to its primary (again, while that one is itself a backup)
  void note_bye(int rank);  // a worker's Bye, counted

  // ---- checkpoints (checkpoints.cpp) ----
  // Writes the shard's checkpoint to opt_.checkpoint_path (a metrics line says when, which
  // version, how long); `why` for the log. Never throws: a failed write is said on stderr.
  void write_checkpoint_now(const char* why);
  // Goes on from a checkpoint of this shard (--resume): the shard's state, and which workers had
  // said Bye (kept in the checkpoint's per-worker `lost` word as kSaidBye).
  void resume_from(const std::string& path);
  // The shard's state from a checkpoint (`who` begins its errors); the workers that had said Bye
  // or were dropped count as done. The shard as it is now, with who said Bye: its checkpoint.
  void restore_state(ShardCheckpoint c, const std::string& who);
  ShardCheckpoint checkpoint_now() const;
  // A server restarted without a checkpoint: the run is under way (ServerOptions::restarted).
  void restart_fresh();
  static constexpr char kSaidBye = 2;

  // ---- counters (stats.cpp) ----
  nlohmann::ordered_json stats_json() const;  // the Stats reply, and the core of every metrics line
  void write_stats(bool final);

  ExperimentConfig cfg_;
  ServerOptions opt_;
  comm::Transport& transport_;  // outlives the server; peers_refused() for the stats
  RunClock& clock_;                // the transport's
  std::size_t num_params_;
  ShardRange range_;
  std::uint64_t config_hash_;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<ShardState> state_;
  std::unique_ptr<EncodedVersions> pull_encoded_;  // cluster.pull_codec other than f32: θ as workers pull it
  std::unique_ptr<comm::Listener> listener_;
  comm::Message msg_;  // reused for every receive
  comm::PeerId from_;
  wire::Encoder enc_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<OrderTrace> trace_;  // null without ServerOptions::trace_path
  ServerCounters counters_;

  std::map<std::string, Peer> peers_;           // by the transport's identity
  std::vector<std::string> worker_ids_;         // by rank ("" until Hello)
  comm::Liveness workers_;                      // by rank
  std::vector<std::string> welcome_waiting_;    // identities waiting for the start barrier
  std::vector<char> said_bye_;
  std::vector<time_point> may_return_until_;  // per worker dropped as silent: until when it may come back
  std::vector<char> awaited_;                 // per worker: silent, and awaited (await_silent_workers)
  RunClock::duration reconnect_window_{};     // reconnect_window_s(cfg)
  int finished_ = 0;  // workers that said Bye or were dropped as lost
  bool continue_on_loss_ = false;       // continues_without_lost_workers(cfg)
  nlohmann::ordered_json losses_ = nlohmann::ordered_json::array();  // {worker, clock, silent_s} per lost worker
  long updates_lost_ = 0;  // restarted from a checkpoint: updates of rejoining workers it lacks
  long total_steps_ = 0;   // a worker's steps in the run: no clock it says lies beyond them
  bool barrier_open_ = false, shutdown_ = false;
  std::vector<HeldPull> held_;
  std::unique_ptr<PushGuard> guard_;         // null: cluster.push_guard = false
  std::vector<std::byte> empty_payload_;     // the guard's empty push: a zero shard in the run's codec
  std::uint64_t empty_checksum_ = 0;
  std::vector<float> guard_scratch_;         // a push's values, decoded or aligned, for the guard (made when first needed)
  struct Pushing {        // per worker: its push, as its first piece said, until the shard ends it
    wire::Push first;
    std::string refused;  // why the guard refused it ("": it did not)
    long bytes = 0;       // payload bytes of its pieces so far
    // A push+pull that streams, whose pull is ready once it ends: the reply's pieces leave as
    // the push's pieces are applied (the version they belong to is published at its end).
    bool streamed_reply = false;
    wire::PullReply reply;
    time_point last_piece{};  // when its latest piece came
    time_point last_beat{};   // when the server last told it, waiting, that it is alive
  };
  std::vector<Pushing> pushing_;
  // Per worker: the messages of its open push, whose payloads the shard references until the
  // push ends; and received messages to reuse (no allocation per message once warm).
  std::vector<std::vector<comm::Message>> held_msgs_;
  std::vector<comm::Message> spare_msgs_;
  time_point started_, last_message_;

  // ---- chain replication (cluster.replicas = 2) ----
  // A primary: its backup's peer id ("": none, or lost), the inputs sent and the last it applied,
  // when it was last heard, and the replies waiting for it (each for the inputs sent before it).
  std::string replica_id_;
  std::string joining_id_;         // a backup that said Hello to a run under way, until it has the shard
  long backups_joined_ = 0;        // backups that joined a run under way
  bool replica_expected_ = false;  // the start barrier waits for a backup's Hello
  long replica_sent_ = 0, replica_acked_ = 0;
  time_point replica_heard_{}, replica_beat_{};
  struct Waiting {
    std::string to;
    std::vector<std::byte> head;
    comm::OutPayload payload;
    long after;  // the inputs the backup must have applied first
    const char* what;
  };
  std::vector<Waiting> waiting_;  // in order (the front leaves first); vectors reused
  std::size_t waiting_front_ = 0;
  std::vector<std::vector<std::byte>> spare_heads_;
  struct CopyBuffer {  // a piece's payload on its way to the backup
    std::unique_ptr<comm::PayloadMemory> memory;
    std::atomic<bool> busy{false};
  };
  std::vector<std::unique_ptr<CopyBuffer>> copies_;
  // A backup: its connection to the primary (null: a primary, or a backup that took over), the
  // last input applied, and the message each one arrives in.
  std::unique_ptr<comm::Connections> upstream_;
  long applied_ = 0;
  bool ack_owed_ = false;  // the last Replicated could not be queued: said again
  time_point hello_again_at_{};  // its primary is a backup still: say Hello again then
  bool welcomed_ = false;        // its primary took it (Welcome)
  bool primary_lost_ = false;    // another process answers at its primary's address
  comm::Message up_msg_;
  time_point upstream_heard_{}, upstream_beat_{};
};

}  // namespace pslab
