#include "comm/rendezvous.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <stdexcept>

#include <nlohmann/json.hpp>


namespace pslab {

// ---- Coordinator ----

Coordinator::Coordinator(comm::Transport& transport, const std::string& endpoint, int world,
                         std::chrono::milliseconds linger)
    : clock_(transport.clock()), world_(world), linger_(linger) {
  comm::ListenOptions lo;
  lo.max_message_bytes = 1 << 20;
  lo.linger = std::chrono::milliseconds(1000);
  try {
    listener_ = transport.listen(endpoint, lo);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("coordinator: ") + e.what());
  }
  thread_ = clock_.start([this](std::stop_token stop) { serve(stop); });
}

Coordinator::~Coordinator() {
  const auto deadline = clock_.now() + linger_;
  while (byes_.load() < world_ && clock_.now() < deadline) clock_.sleep_for(std::chrono::milliseconds(10));
  thread_.reset();  // stops and joins the serving thread
}

// What the coordinator keeps while it serves: the key-value store, the gets waiting for a key,
// and when each rank was last heard from (and at which step).
struct Coordinator::State {
  struct PendingGet {
    std::string id, key;
    RunClock::time_point deadline;
  };
  struct Heard {
    long step = -1;
    RunClock::time_point when;
    bool seen = false;
    bool done = false;  // said Bye
  };
  std::map<std::string, std::string> kv;
  std::vector<PendingGet> pending;
  std::vector<Heard> heard;
  wire::Encoder enc;
};

void Coordinator::reply(State& st, const std::string& to, const wire::Body& b) {
  // Best effort: a rank that stopped reading times out on its own side.
  listener_->send(to, st.enc.encode(wire::Header{wire::kServer, -1, b}));
}

// A rank's request (senders outside [0, world) may only ask for the group's status). Keys are
// written once (a second value for one is refused: it would redirect a rank's link), and there
// are at most kMaxKeysPerRank per rank; a Bye counts once per rank.
void Coordinator::handle(State& st, const std::string& id, const wire::Header& h) {
  constexpr std::size_t kMaxKeysPerRank = 16;
  const int r = h.sender;
  const bool rank = r >= 0 && r < world_;
  if (!rank && !std::holds_alternative<wire::GroupStatus>(h.body))
    return reply(st, id, wire::Error{wire::ErrorCode::unknown_peer, "the coordinator takes requests from ranks 0 to " +
                                                                        std::to_string(world_ - 1) + ", not " + std::to_string(r)});
  if (rank) st.heard[std::size_t(r)].when = clock_.now(), st.heard[std::size_t(r)].seen = true;
  if (const auto* m = std::get_if<wire::KvSet>(&h.body)) {
    const auto it = st.kv.find(m->key);
    if (it != st.kv.end() && it->second != m->value)
      return reply(st, id, wire::Error{wire::ErrorCode::protocol, "\"" + m->key + "\" was published already (by rank " +
                                                                      std::to_string(r) + " or another): keys are written once"});
    if (it == st.kv.end() && st.kv.size() >= kMaxKeysPerRank * std::size_t(world_) + 64)
      return reply(st, id, wire::Error{wire::ErrorCode::protocol, "the coordinator holds as many keys as a group needs"});
    st.kv[m->key] = m->value;
    reply(st, id, wire::Ack{});
    for (std::size_t i = 0; i < st.pending.size();) {
      if (st.pending[i].key != m->key) {
        ++i;
        continue;
      }
      reply(st, st.pending[i].id, wire::KvValue{m->key, m->value, true});
      st.pending.erase(st.pending.begin() + std::ptrdiff_t(i));
    }
  } else if (const auto* m = std::get_if<wire::KvGet>(&h.body)) {
    auto it = st.kv.find(m->key);
    if (it != st.kv.end()) reply(st, id, wire::KvValue{m->key, it->second, true});
    else if (m->wait_ms > 0)  // (at most an hour: a wait of more overflows a clock of nanoseconds)
      st.pending.push_back({id, m->key, clock_.now() + std::chrono::milliseconds(std::min<long>(m->wait_ms, 3600000L))});
    else reply(st, id, wire::KvValue{m->key, "", false});
  } else if (const auto* m = std::get_if<wire::Beat>(&h.body)) {
    if (rank) st.heard[std::size_t(r)].step = m->step;
  } else if (std::holds_alternative<wire::GroupStatus>(h.body)) {
    reply(st, id, wire::StatsReply{group_status(st).dump()});
  } else if (std::holds_alternative<wire::Bye>(h.body)) {
    if (!st.heard[std::size_t(r)].done) st.heard[std::size_t(r)].done = true, ++byes_;  // (a Bye sent again counts once)
    reply(st, id, wire::Ack{});
  } else {
    reply(st, id, wire::Error{wire::ErrorCode::unknown_type, std::string("the coordinator does not take ") + wire::body_name(h.body)});
  }
}

nlohmann::json Coordinator::group_status(const State& st) const {
  nlohmann::json ranks = nlohmann::json::array();
  for (const State::Heard& x : st.heard) {
    if (!x.seen) ranks.push_back(nullptr);
    else ranks.push_back({{"step", x.step}, {"age_s", seconds_between(x.when, clock_.now())}, {"done", x.done}});
  }
  return nlohmann::json{{"ranks", ranks}};
}

void Coordinator::serve(std::stop_token stop) {
  State st;
  st.heard.resize(std::size_t(world_));
  comm::Message msg;
  comm::PeerId id;
  while (!stop.stop_requested()) {
    // Wakes every 50 ms to expire held KvGets and to notice the stop.
    for (auto until = clock_.now() + std::chrono::milliseconds(50); listener_->recv(msg, id, until); until = clock_.now()) {
      if (!msg.malformed().empty() || msg.has_payload()) continue;
      std::string why;
      const auto h = wire::decode(msg.header(), why);
      if (h) handle(st, id, *h);
      else reply(st, id, wire::Error{wire::ErrorCode::malformed, why});
    }
    const auto now = clock_.now();
    for (std::size_t i = 0; i < st.pending.size();) {
      if (now < st.pending[i].deadline) {
        ++i;
        continue;
      }
      reply(st, st.pending[i].id, wire::KvValue{st.pending[i].key, "", false});
      st.pending.erase(st.pending.begin() + std::ptrdiff_t(i));
    }
  }
}

// ---- RendezvousClient ----

RendezvousClient::RendezvousClient(comm::Transport& transport, std::string endpoint, int rank, int world,
                                   std::chrono::milliseconds timeout)
    : transport_(transport), clock_(transport.clock()), endpoint_(std::move(endpoint)), rank_(rank), world_(world),
      timeout_(timeout) {
  comm::ConnectOptions co;
  co.linger = std::chrono::milliseconds(500);
  conn_ = transport.connect({endpoint_}, co);
  report_step(-1);  // "joined"
}

RendezvousClient::~RendezvousClient() = default;

wire::Header RendezvousClient::request(const wire::Body& body, std::chrono::milliseconds wait) {
  const auto deadline = clock_.now() + wait;
  auto no_answer = [&] {
    return std::runtime_error("the coordinator (rank 0 at " + endpoint_ + ") did not answer " + wire::body_name(body) +
                              " within " + std::to_string(wait.count() / 1000.0).substr(0, 4) + " s: is rank 0 running?");
  };
  if (!conn_->send(0, enc_.encode(wire::Header{rank_, -1, body}), {}, deadline)) throw no_answer();
  std::size_t from = 0;
  while (true) {
    if (!conn_->recv(msg_, from, deadline)) throw no_answer();
    std::string why;
    const auto h = msg_.malformed().empty() ? wire::decode(msg_.header(), why) : std::nullopt;
    if (!h) throw std::runtime_error("coordinator at " + endpoint_ + ": malformed reply: " + why + msg_.malformed());
    if (const auto* e = std::get_if<wire::Error>(&h->body))
      throw std::runtime_error("coordinator at " + endpoint_ + ": " + e->message);
    // A late answer to an earlier request that timed out: not ours.
    if (const auto* v = std::get_if<wire::KvValue>(&h->body); v && std::holds_alternative<wire::KvGet>(body) &&
                                                              v->key != std::get<wire::KvGet>(body).key)
      continue;
    return *h;
  }
}

void RendezvousClient::set(const std::string& key, const std::vector<char>& data) {
  request(wire::KvSet{key, std::string(data.begin(), data.end())}, timeout_);
}

std::vector<char> RendezvousClient::get(const std::string& key, std::chrono::milliseconds wait,
                                        std::chrono::milliseconds stated) {
  // The coordinator answers "not found" after `wait`; the request waits a little longer.
  const auto h = request(wire::KvGet{key, wait.count()}, wait + std::chrono::seconds(2));
  const auto* v = std::get_if<wire::KvValue>(&h.body);
  if (!v) throw std::runtime_error(std::string("coordinator answered KvGet with ") + wire::body_name(h.body));
  if (!v->found)
    throw std::runtime_error("rendezvous: \"" + key + "\" was not published within " +
                             std::to_string(stated.count() / 1000.0).substr(0, 4) + " s; " + laggards(-1));  // (who never joined)
  return std::vector<char>(v->value.begin(), v->value.end());
}

void RendezvousClient::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto deadline = clock_.now() + timeout;
  for (const auto& k : keys)
    get(k, std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_.now())),
        timeout);
}

void RendezvousClient::report_step(long step) {
  // Progress reports are best effort: a full queue drops one (a deadline of now never waits).
  conn_->send(0, enc_.encode(wire::Header{rank_, -1, wire::Beat{step}}), {}, clock_.now());
}

std::string RendezvousClient::laggards(long step) {
  try {
    const auto h = request(wire::GroupStatus{}, std::chrono::milliseconds(3000));
    const auto* s = std::get_if<wire::StatsReply>(&h.body);
    if (!s) return "(the coordinator gave no status)";
    const auto j = nlohmann::json::parse(s->json);
    std::string behind;
    for (int r = 0; r < int(j["ranks"].size()); ++r) {
      const auto& x = j["ranks"][std::size_t(r)];
      char b[128];
      if (x.is_null()) std::snprintf(b, sizeof b, "rank %d (never joined)", r);
      else if (x["step"].get<long>() < step)
        std::snprintf(b, sizeof b, "rank %d (at step %ld, last heard %.1f s ago)", r, x["step"].get<long>(),
                      x["age_s"].get<double>());
      else continue;
      behind += (behind.empty() ? "" : ", ") + std::string(b);
    }
    if (behind.empty()) return step < 0 ? std::string("every rank joined") : "every rank reported reaching step " + std::to_string(step);
    return "not arrived: " + behind;
  } catch (const std::exception& e) {
    return e.what();
  }
}

void RendezvousClient::bye() {
  try {
    request(wire::Bye{0}, std::chrono::milliseconds(2000));
  } catch (const std::exception&) {
    // rank 0 may be gone already; nothing waits on this
  }
}

// ---- GroupWatch ----

GroupWatch::GroupWatch(comm::Transport& transport, const std::string& endpoint, int rank, int world,
                       std::chrono::duration<double> heartbeat, std::function<void(const std::string&)> on_lost)
    : clock_(transport.clock()), endpoint_(endpoint), rank_(rank), world_(world), heartbeat_(heartbeat),
      on_lost_(std::move(on_lost)) {
  comm::ConnectOptions co;
  co.linger = std::chrono::milliseconds(0);
  conn_ = transport.connect({endpoint_}, co);
  thread_ = clock_.start([this](std::stop_token stop) { watch(stop); });
}

GroupWatch::~GroupWatch() {
  thread_.reset();  // stops and joins the watch before its connection goes
}

std::string GroupWatch::silent_rank(const std::string& status_json, int rank, int world, double heartbeat_s) {
  const auto j = nlohmann::json::parse(status_json, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ranks") || !j["ranks"].is_array()) return "";
  const auto number = [](const nlohmann::json& x, const char* key, double otherwise) {
    const auto it = x.find(key);
    return it != x.end() && it->is_number() ? it->get<double>() : otherwise;
  };
  for (int r = 0; r < int(j["ranks"].size()) && r < world; ++r) {
    const auto& x = j["ranks"][std::size_t(r)];
    if (r == rank || !x.is_object()) continue;
    if (const auto done = x.find("done"); done != x.end() && done->is_boolean() && done->get<bool>()) continue;
    const double age = number(x, "age_s", 0.0);  // (a rank that never joined: the start's own timeout)
    if (age > heartbeat_s) {
      char b[160];
      std::snprintf(b, sizeof b, "rank %d lost: silent for %.1f s at step %.0f (cluster.heartbeat_s = %g)", r, age,
                    number(x, "step", -1.0), heartbeat_s);
      return b;
    }
  }
  return "";
}

void GroupWatch::watch(std::stop_token stop) {
  const auto every = std::chrono::duration_cast<RunClock::duration>(heartbeat_ / 4);
  const auto limit = std::chrono::duration_cast<RunClock::duration>(heartbeat_);
  wire::Encoder enc;
  comm::Message msg;
  auto last_answer = clock_.now();
  while (!stop.stop_requested()) {
    const auto asked = clock_.now();
    // Best effort: a full queue means the coordinator is not reading, which the silence shows.
    conn_->send(0, enc.encode(wire::Header{rank_, -1, wire::GroupStatus{}}), {}, asked);
    std::size_t from = 0;
    std::string lost;
    while (!stop.stop_requested() && lost.empty()) {
      const auto until = std::min(asked + every, last_answer + limit);
      if (!conn_->recv(msg, from, std::min(until, clock_.now() + std::chrono::milliseconds(100)))) {
        if (clock_.now() >= last_answer + limit) {
          char b[200];
          std::snprintf(b, sizeof b, "rank 0 lost: its coordinator at %s has not answered for %.1f s "
                        "(cluster.heartbeat_s = %g)", endpoint_.c_str(),
                        seconds_between(last_answer, clock_.now()), heartbeat_.count());
          lost = b;
        } else if (clock_.now() >= asked + every) {
          break;  // time to ask again
        }
        continue;
      }
      std::string why;
      const auto h = msg.malformed().empty() ? wire::decode(msg.header(), why) : std::nullopt;
      const auto* s = h ? std::get_if<wire::StatsReply>(&h->body) : nullptr;
      if (!s) continue;
      last_answer = clock_.now();
      lost = silent_rank(s->json, rank_, world_, heartbeat_.count());
      if (lost.empty()) {  // wait out the rest of the interval
        clock_.sleep_until(asked + every, stop);
        break;
      }
    }
    if (!lost.empty() && !stop.stop_requested()) {
      on_lost_(lost);
      return;
    }
  }
}

}  // namespace pslab
