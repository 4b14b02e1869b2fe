// A server's counters: the answer to a Stats request and its metrics lines ("server" every
// stats_every_s, "server_final" at the end with the staleness histograms and θ's checksum).
#include <cstdio>

#include "server.h"

namespace pslab {

namespace {

// {"f32": {"pushes": N, "payload_bytes": B}}: accepted pushes by codec.
nlohmann::ordered_json pushed_json(const ServerCounters& c) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [codec, p] : c.pushed) j[codec] = {{"pushes", p.pushes}, {"payload_bytes", p.payload_bytes}};
  return j;
}

}  // namespace

long ServerCounters::bad_total() const {
  long n = 0;
  for (const auto& [reason, count] : bad) n += count;
  return n;
}

nlohmann::ordered_json Server::stats_json() const {
  return {{"shard", opt_.shard},
          {"version", state_->version()},
          {"samples_applied", state_->samples_applied()},
          {"min_clock", state_->min_clock()},
          {"pushes", counters_.pushes},
          {"pulls", counters_.pulls},
          {"pulls_held", counters_.pulls_held},
          {"progress_polls", counters_.progress_polls},
          {"hold_ms_total", counters_.hold_ms_total},
          {"hold_ms_max", counters_.hold_ms_max},
          {"bytes_in", counters_.bytes_in},
          {"bytes_bad", counters_.bytes_bad},
          {"bytes_out", counters_.bytes_out},
          {"bad_total", counters_.bad_total()},
          {"bad", counters_.bad},
          {"dropped_replies", counters_.dropped_replies},
          {"reconnects", counters_.reconnects},
          {"pushes_duplicate", counters_.pushes_duplicate},
          {"workers_back", counters_.workers_back},
          {"peers_refused", transport_.peers_refused()},
          {"pushed", pushed_json(counters_)},
          {"workers_lost", losses_},
          {"updates_lost", updates_lost_},
          {"push_guard", guard_ ? guard_->stats() : nlohmann::ordered_json(nullptr)},
          // cluster.replicas = 2: "primary" (with its backup, or "alone" once it lost it), "backup", or
          // "took over" (a backup serving the shard); inputs sent or applied, replies that waited
          {"replica", !opt_.backup_of.empty() ? (is_backup() ? "backup" : "took over")
                      : replicating()         ? "primary"
                      : replica_expected_     ? "alone"
                                              : "none"},
          {"replicated", counters_.replicated},
          {"backups_joined", backups_joined_},  // backups sent the whole shard (one joined a run under way)
          {"replies_waited", counters_.replies_waited}};
}

void Server::write_stats(bool final) {
  if (!metrics_) return;
  nlohmann::ordered_json j{{"kind", final ? "server_final" : "server"}};
  const nlohmann::ordered_json stats = stats_json();
  for (const auto& [key, value] : stats.items()) j[key] = value;
  if (final) {
    // The histograms only: the launcher's summary derives the statistics, once, over every shard.
    nlohmann::ordered_json hist = nlohmann::ordered_json::object();
    auto& by_worker = hist.get_ref<nlohmann::ordered_json::object_t&>();  // appended in order: no lookup per key
    for (std::size_t w = 0; w < state_->staleness_histogram().size(); ++w)  // (workers that pushed: a short line
      if (!state_->staleness_histogram()[w].empty())                          // for a run of 100000 stopped early)
        by_worker.emplace_back(std::to_string(w), state_->staleness_histogram()[w]);
    j["staleness_hist"] = std::move(hist);
    j["param_buffers"] = state_->params().buffers();
    char sum[24];  // the shard's θ: a replay of this run's order (launch.py replay) must end on the same
    std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(state_->current_checksum()));
    j["params_checksum"] = sum;
    if (state_->pulled_params_bytes()) j["pulled_params_bytes"] = state_->pulled_params_bytes();  // dcasgd's copies of θ
  }
  if (trace_) trace_->flush();
  metrics_->write(j);
  metrics_->flush();
}

}  // namespace pslab
