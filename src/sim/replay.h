// Replay of a recorded parameter-server run (virtual.replay = RUN_DIR): a delivery policy of the
// simulated transport that lets each server take the workers' pushes and pulls in the order its
// real counterpart recorded (RUN_DIR/trace/server<k>.txt, ps/order_trace.h), and checks that
// each pull is served the version it was served then.
//
// Per server, a cursor walks its trace:
//   push W C ...   worker W's push for clock C is let through once it has arrived (a push that
//                  also asks for θ for clock C + 1 is a request for that pull too); a push in
//                  pieces (cluster.piece_kib) is its first piece: the others follow it through
//   pull W C V     if W asked for clock C with a message already let through (the pull half of
//                  a push, or a pull the rule held), the server answers it when its rule allows:
//                  the cursor waits for that answer (the last piece of an answer in pieces);
//                  else W's pull for C is let through once it has arrived. The answer must
//                  carry version V, or the replay fails saying so.
// Everything else (Hello, Beats, Bye, the evaluator's pulls and polls) goes through at once:
// none of it changes θ.
//
// Threading: the simulation's (one thread at a time).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ps/order_trace.h"
#include "sim/sim_transport.h"

namespace pslab::sim {

class ReplayPolicy final : public DeliveryPolicy {
 public:
  // `servers`: their addresses in shard order; reads RUN_DIR/trace/server<k>.txt for each, whose
  // workers must be in [0, workers).
  ReplayPolicy(Scheduler& s, const std::string& run_dir, const std::vector<std::string>& servers, int workers);
  void arrived(const std::string& address, SimMessage&& msg, const Deliver& deliver) override;
  void sent(const std::string& address, const std::string& to, std::span<const std::byte> header) override;
  // After the run: throws naming the first operation of a trace that was never re-executed.
  void check_complete() const;
  // A run that stopped on `error` (a worker's wait for its server ran out): where the replay
  // stood, and the error; "" when the replay itself stopped it (its own failure says why).
  std::string stopped(const std::string& error) const;

 private:
  struct Held {
    int worker;
    long clock;
    bool push;  // else a pull
    SimMessage msg;
    std::uint32_t piece = 0, pieces = 1;  // a push's
  };
  struct Server {
    int shard = 0;
    std::vector<TraceOp> ops;
    std::size_t at = 0;                     // the next operation
    std::vector<Held> held;                 // arrived, not let through yet
    std::set<std::pair<int, long>> asked;   // (worker, clock) of pulls let through, not answered
    std::set<std::pair<int, long>> streaming;  // (worker, clock) of pushes whose first piece went through
    std::map<std::string, int> worker_of;   // a peer's id -> the worker rank it said Hello as
    Deliver deliver;
  };
  void pump(Server& s);  // lets through what the trace allows now
  // Lets through the held pieces of worker's push for clock that follow its first.
  void follow(Server& s, int worker, long clock);
  std::string failure(const Server& s, const std::string& why) const;
  // The order is not the run's: the simulation stops with that as its failure.
  void fail(const Server& s, const std::string& why);

  Scheduler& sched_;
  std::string run_dir_;
  bool failed_ = false;
  std::map<std::string, Server> servers_;  // by address
};

std::unique_ptr<DeliveryPolicy> make_replay_policy(Scheduler& s, const std::string& run_dir,
                                                   const std::vector<std::string>& servers, int workers);

}  // namespace pslab::sim
