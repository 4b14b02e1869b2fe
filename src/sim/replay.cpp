#include "sim/replay.h"

#include <stdexcept>

#include "comm/wire.h"

namespace pslab::sim {

ReplayPolicy::ReplayPolicy(Scheduler& s, const std::string& run_dir, const std::vector<std::string>& servers, int workers)
    : sched_(s), run_dir_(run_dir) {
  for (std::size_t k = 0; k < servers.size(); ++k) {
    Server& s = servers_[servers[k]];
    s.shard = int(k);
    const std::string path = run_dir + "/trace/server" + std::to_string(k) + ".txt";
    s.ops = read_order_trace(path);
    for (std::size_t i = 0; i < s.ops.size(); ++i)
      if (s.ops[i].worker < 0 || s.ops[i].worker >= workers)
        throw std::runtime_error(path + ": operation " + std::to_string(i + 1) + " is worker " + std::to_string(s.ops[i].worker) +
                                 "'s, not one of this run's " + std::to_string(workers) +
                                 " (cluster.workers): the trace is of another run");
  }
}

std::string ReplayPolicy::failure(const Server& s, const std::string& why) const {
  std::string op = "the end of its trace";
  if (s.at < s.ops.size()) {
    const TraceOp& o = s.ops[s.at];
    op = std::string(o.kind == TraceOp::push ? "push" : "pull") + " of worker " + std::to_string(o.worker) + ", step " +
         std::to_string(o.clock);
  }
  return "replay of " + run_dir_ + ": server " + std::to_string(s.shard) + ", operation " + std::to_string(s.at + 1) + " (" +
         op + "): " + why;
}

void ReplayPolicy::fail(const Server& s, const std::string& why) {
  failed_ = true;
  sched_.stop(std::make_exception_ptr(std::runtime_error(failure(s, why))), "the replay");
}

void ReplayPolicy::arrived(const std::string& address, SimMessage&& msg, const Deliver& deliver) {
  const auto it = servers_.find(address);
  if (it == servers_.end()) return deliver(std::move(msg));  // not a server
  Server& s = it->second;
  if (!s.deliver) s.deliver = deliver;
  std::string why;
  const auto h = wire::decode(msg.header.data(), msg.header.size(), why);
  if (h && h->sender >= 0) {
    if (const auto* hello = std::get_if<wire::Hello>(&h->body); hello && hello->role == wire::Role::worker)
      s.worker_of[msg.from] = hello->rank;
    if (const auto* p = std::get_if<wire::Push>(&h->body)) {
      s.held.push_back(Held{h->sender, p->clock, true, std::move(msg), p->piece, p->pieces});
      if (p->piece > 0) return follow(s, h->sender, p->clock);
      return pump(s);
    }
    if (const auto* p = std::get_if<wire::Pull>(&h->body); p && !p->progress_only) {
      s.held.push_back(Held{h->sender, p->clock, false, std::move(msg)});
      return pump(s);
    }
  }
  deliver(std::move(msg));
}

void ReplayPolicy::pump(Server& s) {
  while (!failed_ && s.at < s.ops.size()) {
    const TraceOp& op = s.ops[s.at];
    if (op.kind == TraceOp::pull && s.asked.count({op.worker, op.clock})) return;  // its answer comes from the server
    const bool push = op.kind == TraceOp::push;
    auto it = std::find_if(s.held.begin(), s.held.end(), [&](const Held& m) {
      return m.push == push && m.worker == op.worker && m.clock == op.clock && m.piece == 0;
    });
    if (it == s.held.end()) return;  // not arrived yet
    std::string why;
    const auto h = wire::decode(it->msg.header.data(), it->msg.header.size(), why);
    if (push) {
      const auto& p = std::get<wire::Push>(h->body);
      if (p.batch != op.batch)
        return fail(s, "the batch is " + std::to_string(p.batch) + " samples, the run pushed " + std::to_string(op.batch));
      if (p.then_pull) s.asked.insert({op.worker, op.clock + 1});
      ++s.at;
    } else {
      s.asked.insert({op.worker, op.clock});  // the cursor stays until the server answers it
    }
    const bool in_pieces = it->pieces > 1;
    SimMessage m = std::move(it->msg);
    s.held.erase(it);
    s.deliver(std::move(m));
    if (in_pieces) {
      s.streaming.insert({op.worker, op.clock});
      follow(s, op.worker, op.clock);
    }
  }
}

void ReplayPolicy::follow(Server& s, int worker, long clock) {
  if (!s.streaming.count({worker, clock})) return;  // its first piece waits for its turn
  for (auto it = s.held.begin(); it != s.held.end();) {  // (in the order they arrived: a link keeps it)
    if (!it->push || it->worker != worker || it->clock != clock || it->piece == 0) {
      ++it;
      continue;
    }
    if (it->piece + 1 == it->pieces) s.streaming.erase({worker, clock});
    SimMessage m = std::move(it->msg);
    it = s.held.erase(it);
    s.deliver(std::move(m));
  }
}

void ReplayPolicy::sent(const std::string& address, const std::string& to, std::span<const std::byte> header) {
  const auto it = servers_.find(address);
  if (it == servers_.end()) return;
  Server& s = it->second;
  const auto w = s.worker_of.find(to);
  if (w == s.worker_of.end()) return;  // not a worker's (the evaluator's)
  std::string why;
  const auto h = wire::decode(header.data(), header.size(), why);
  const auto* r = h ? std::get_if<wire::PullReply>(&h->body) : nullptr;
  if (!r) return;
  // A reply in pieces counts once its last piece has left: one answering a push piece by piece
  // (its version published with the push's last piece) is the pull the run recorded then, and a
  // pull let through before would be served the version before it.
  if (r->piece + 1 < r->pieces) return;
  const int worker = w->second;
  if (!s.asked.erase({worker, r->clock})) return;
  if (s.at >= s.ops.size() || s.ops[s.at].kind != TraceOp::pull)
    return fail(s, "the server answered worker " + std::to_string(worker) + "'s pull for step " + std::to_string(r->clock) +
                       " here, at version " + std::to_string(r->version) + "; the run did not");
  const TraceOp& op = s.ops[s.at];
  const bool same = op.worker == worker && op.clock == r->clock;
  if (!same || r->version != op.version)
    return fail(s, "the shard is at version " + std::to_string(r->version) + ", the run served " + std::to_string(op.version) +
                       (same ? "" : " (the server answered worker " + std::to_string(worker) + "'s pull for step " +
                                        std::to_string(r->clock) + " first)"));
  ++s.at;
  pump(s);
}

std::string ReplayPolicy::stopped(const std::string& error) const {
  if (failed_) return "";
  for (const auto& [address, s] : servers_) {
    if (s.at < s.ops.size() && !s.asked.count({s.ops[s.at].worker, s.ops[s.at].clock}))
      return failure(s, "the run stopped waiting for it (the trace is of another run, or its config differs): " + error);
    if (s.at >= s.ops.size() && !s.held.empty())
      return failure(s, "worker " + std::to_string(s.held.front().worker) + "'s " + (s.held.front().push ? "push" : "pull") +
                            " for step " + std::to_string(s.held.front().clock) + " came after it (the trace is cut short, " +
                            "or of another run): " + error);
  }
  return "";
}

void ReplayPolicy::check_complete() const {
  for (const auto& [address, s] : servers_)
    if (s.at < s.ops.size())
      throw std::runtime_error(failure(s, "it waits for a gradient the recorded order never lets the worker compute: the "
                                          "traces do not belong together"));
}

std::unique_ptr<DeliveryPolicy> make_replay_policy(Scheduler& s, const std::string& run_dir,
                                                   const std::vector<std::string>& servers, int workers) {
  return std::make_unique<ReplayPolicy>(s, run_dir, servers, workers);
}

}  // namespace pslab::sim
