// The push guard (cluster.push_guard): what a parameter server refuses from a worker that holds
// the run's key but sends what no honest worker sends. Per push, before any of it is applied:
//   - a batch outside [0, the plan's most samples per push] (train.batch x train.accumulate x
//     the steps one push covers: 1, local:H's H, easgd's cluster.sync_every);
//   - a value that is not finite (NaN, ±inf), in the decoded push;
//   - a norm (of the push's slice on this shard) over cluster.guard_norm_factor times the median
//     of the last 64 accepted pushes' norms (from the 16th accepted push on; 0: no bound), times
//     sqrt(32 / batch) more for a batch (train.batch x train.accumulate) under 32.
// A refused push changes nothing and counts as an empty batch (the worker's clock moves on, so
// bsp and ssp are not held by it); refusals are counted per worker, and a worker refused
// cluster.guard_drop_after times in a row is dropped with that reason.
//
// A run that diverges (too high a learning rate) is not an insider: once the latest push of
// every worker still in the run was refused for its values, the guard stands aside for good
// (says so once) and the run diverges as it would without it (its status: diverged).
//
// Pieces: a push in pieces is checked piece by piece as they arrive, the norm as it accumulates;
// the first bad piece refuses the whole push.
// Threading: the server's event loop.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pslab {

struct ExperimentConfig;

class PushGuard {
 public:
  struct Options {
    long max_batch = 0;          // most samples one push may claim
    double norm_factor = 4.0;    // (the batch's, options_for) 0: no norm bound
    int drop_after = 10;         // refusals in a row that drop a worker (0: never)
  };
  static Options options_for(const ExperimentConfig& cfg);
  PushGuard(const Options& opt, int workers);

  // Why a push's first piece is refused for its batch, or "".
  std::string check_batch(int batch) const;
  // Why `n` decoded values of the worker's open push are refused, or "" (the norm accumulates
  // over the push's pieces; first: the push's first piece). `at`: the values' first float in
  // the shard, for the message.
  std::string check_values(int worker, const float* v, std::size_t n, std::size_t at, bool first);
  // The worker's push was applied: its norm joins the history, its streak of refusals ends.
  void accepted(int worker);
  // The worker left the run (dropped): it no longer counts when telling divergence from an insider.
  void forget(int worker);
  // The worker dropped as silent is back (cluster.reconnect_s): it counts again, with no refusal.
  void readmit(int worker);
  // Whether the guard stood aside because every worker's pushes were refused (divergence).
  bool stood_aside() const { return stood_aside_; }
  // The worker's push was refused for `why`; returns whether the worker is to be dropped now.
  bool refused(int worker);
  long refusals(int worker) const { return refused_[std::size_t(worker)]; }
  long streak(int worker) const { return streak_[std::size_t(worker)]; }  // refused in a row
  long total_refused() const;
  // {"refused": {worker: count}, "norm_bound": ...} for the stats line.
  nlohmann::ordered_json stats() const;
  const Options& options() const { return opt_; }

 private:
  double norm_bound() const;  // 0: none yet
  std::string values_problem(int worker, const float* v, std::size_t n, std::size_t at, bool first);
  Options opt_;
  std::vector<double> sumsq_;    // per worker: of its open push so far
  // Whether `why` (a refusal for the values) is every worker's latest: then it stands aside.
  bool everyone_refused(int worker);
  std::vector<long> refused_, streak_;
  std::vector<char> values_refused_, gone_;  // per worker: its latest push refused for its values; dropped
  bool stood_aside_ = false;
  std::vector<double> history_;  // norms of the last accepted pushes (a ring)
  std::size_t next_ = 0;
  long accepted_ = 0;
};

}  // namespace pslab
