// The rendezvous of an all-reduce group.
//
// Rank 0 runs a Coordinator on the coordinator endpoint (its own thread): a key-value store
// through which Gloo exchanges its pair addresses and NCCL its unique id, and a table of the
// step each rank reported last. Every rank (rank 0 too) talks to it through a
// RendezvousClient, which is also the gloo::rendezvous::Store that Gloo's context uses.
//
// When a collective times out, the rank asks the coordinator which ranks are behind, so the
// error names the ranks that did not arrive instead of just saying "timeout". Faster than
// that, every rank runs a GroupWatch: it asks the coordinator for the group's status every
// quarter of cluster.heartbeat_s (which is also its heartbeat), and names a rank silent for
// heartbeat_s (stopped, hung, its host gone) or a coordinator that stopped answering.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/store.h>
#include <nlohmann/json.hpp>

#include "comm/transport/transport.h"
#include "comm/wire.h"

namespace pslab {

// Threading: the constructor starts the serving thread; the destructor waits (up to
// `linger`) until every rank has said Bye, then stops it. `transport` must outlive it.
class Coordinator {
 public:
  Coordinator(comm::Transport& transport, const std::string& endpoint, int world,
              std::chrono::milliseconds linger = std::chrono::seconds(5));
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

 private:
  struct State;
  void serve(std::stop_token stop);
  void handle(State& st, const std::string& id, const wire::Header& h);
  void reply(State& st, const std::string& to, const wire::Body& b);
  nlohmann::json group_status(const State& st) const;  // {"ranks": [{step, age_s, done} or null]}
  RunClock& clock_;  // the transport's
  std::unique_ptr<comm::Listener> listener_;
  int world_;
  std::chrono::milliseconds linger_;
  std::atomic<int> byes_{0};
  std::unique_ptr<ClockThread> thread_;  // last member: stopped and joined first
};

// Threading: one thread at a time (Gloo calls the Store from the thread that creates the
// context; the training loop calls report_step from the same thread).
class RendezvousClient : public gloo::rendezvous::Store {
 public:
  RendezvousClient(comm::Transport& transport, std::string endpoint, int rank, int world,
                   std::chrono::milliseconds timeout);
  ~RendezvousClient() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  // Blocks until the key is set, or throws after the timeout naming the key and the
  // coordinator.
  std::vector<char> get(const std::string& key) override { return get(key, timeout_, timeout_); }
  // Blocks until every key is set: one deadline, `timeout` from now, for all of them.
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // Tells the coordinator this rank is at `step` (fire and forget; cheap enough per step).
  void report_step(long step);
  // A sentence naming the ranks whose last reported step is below `step`, with how long ago
  // each was heard from; or why the coordinator could not be asked.
  std::string laggards(long step);
  // This rank is done; lets rank 0's coordinator shut down once all are.
  void bye();

  int rank() const { return rank_; }
  int world() const { return world_; }
  comm::Transport& transport() const { return transport_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& endpoint() const { return endpoint_; }

 private:
  // Waits `wait` for the key; a failure says "within `stated`" (the caller's whole timeout).
  std::vector<char> get(const std::string& key, std::chrono::milliseconds wait, std::chrono::milliseconds stated);
  wire::Header request(const wire::Body& body, std::chrono::milliseconds wait);
  comm::Transport& transport_;
  RunClock& clock_;  // the transport's
  std::unique_ptr<comm::Connections> conn_;
  comm::Message msg_;
  std::string endpoint_;
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  wire::Encoder enc_;
};

// Watches an all-reduce group from one rank: a thread of its own, with its own connection to
// the coordinator, asks for the group's status every heartbeat / 4 (its requests are this
// rank's heartbeat, whatever its training thread is doing). When a rank that has not said Bye
// has been silent for `heartbeat`, or the coordinator has not answered for that long,
// on_lost(message) is called once, from the watch's thread, e.g.
//   "rank 1 lost: silent for 5.1 s at step 527 (cluster.heartbeat_s = 5)"
// The caller decides what follows (an all-reduce rank cannot finish its step: it exits).
// Threading: construct and destroy from one thread; the destructor stops the watch.
class GroupWatch {
 public:
  GroupWatch(comm::Transport& transport, const std::string& endpoint, int rank, int world,
             std::chrono::duration<double> heartbeat, std::function<void(const std::string&)> on_lost);
  ~GroupWatch();
  GroupWatch(const GroupWatch&) = delete;
  GroupWatch& operator=(const GroupWatch&) = delete;
  // What a rank (`rank` of `world`) reads in the coordinator's status: the first other rank
  // silent for longer than heartbeat_s, as on_lost names it, or "" (every rank heard, or a
  // status it cannot read: a field of the wrong type is ignored, never thrown on the watch's thread).
  static std::string silent_rank(const std::string& status_json, int rank, int world, double heartbeat_s);

 private:
  void watch(std::stop_token stop);
  RunClock& clock_;  // the transport's
  std::unique_ptr<comm::Connections> conn_;
  std::string endpoint_;
  int rank_, world_;
  std::chrono::duration<double> heartbeat_;
  std::function<void(const std::string&)> on_lost_;
  std::unique_ptr<ClockThread> thread_;  // last member: stopped and joined first
};

}  // namespace pslab
