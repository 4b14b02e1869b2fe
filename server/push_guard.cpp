#include "push_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "run/config.h"

namespace pslab {

namespace {

// Σ v² in 64 independent float lanes: four vectors of 16 with AVX-512 (eight of 8 with AVX2),
// so that the additions do not wait on one another, built for each and picked by the CPU (the
// pass is the first read of a push on the server: without wide vectors it takes as long as the
// update). NaN and inf make the sum non-finite, so the loop needs no branch.
[[gnu::target_clones("avx512f", "avx2", "default")]] double sum_of_squares(const float* v, std::size_t n) {
  constexpr std::size_t kLanes = 64;
  float lane[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::size_t l = 0; l < kLanes; ++l) lane[l] += v[i + l] * v[i + l];
  double s = 0.0;
  for (; i < n; ++i) s += double(v[i]) * double(v[i]);
  for (float x : lane) s += double(x);
  return s;
}

constexpr std::size_t kHistory = 64;  // accepted norms the bound's median is over
constexpr long kWarmup = 16;          // accepted pushes before the norm is bounded
constexpr double kFullBatch = 32;     // the batch from which cluster.guard_norm_factor applies as it is
}  // namespace

PushGuard::Options PushGuard::options_for(const ExperimentConfig& cfg) {
  const WorkerProtocol proto = cfg.mode().worker_protocol();
  const long steps = proto.kind == WorkerProtocol::Kind::delta     ? proto.local_steps
                     : proto.kind == WorkerProtocol::Kind::elastic ? cfg.cluster.sync_every
                                                                   : 1;
  // A small batch's honest norms spike more (one unusual sample weighs more): its bound is wider.
  const double batch = std::max(1.0, double(cfg.train.batch) * cfg.train.accumulate);
  const double factor = cfg.cluster.guard_norm_factor * std::max(1.0, std::sqrt(kFullBatch / batch));
  return Options{long(cfg.train.batch) * cfg.train.accumulate * std::max(1L, steps), factor, cfg.cluster.guard_drop_after};
}

PushGuard::PushGuard(const Options& opt, int workers)
    : opt_(opt), sumsq_(std::size_t(workers), 0.0), refused_(std::size_t(workers), 0), streak_(std::size_t(workers), 0),
      values_refused_(std::size_t(workers), 0), gone_(std::size_t(workers), 0) {
  history_.reserve(kHistory);
}

std::string PushGuard::check_batch(int batch) const {
  if (batch >= 0 && batch <= opt_.max_batch) return "";
  return "a batch of " + std::to_string(batch) + " samples (this run's pushes hold 0 to " + std::to_string(opt_.max_batch) + ")";
}

std::string PushGuard::check_values(int worker, const float* v, std::size_t n, std::size_t at, bool first) {
  std::string why = values_problem(worker, v, n, at, first);
  if (why.empty() || !everyone_refused(worker)) return why;
  stood_aside_ = true;
  std::fprintf(stderr, "push guard: the latest push of every worker was refused (%s): the run is diverging, not one "
               "worker; the guard stands aside from now on\n", why.c_str());
  return "";
}

bool PushGuard::everyone_refused(int worker) {
  values_refused_[std::size_t(worker)] = 1;
  for (std::size_t w = 0; w < values_refused_.size(); ++w)
    if (!values_refused_[w] && !gone_[w]) return false;
  return true;
}

void PushGuard::forget(int worker) { gone_[std::size_t(worker)] = 1; }

void PushGuard::readmit(int worker) {
  gone_[std::size_t(worker)] = values_refused_[std::size_t(worker)] = 0;
  streak_[std::size_t(worker)] = 0;
}

std::string PushGuard::values_problem(int worker, const float* v, std::size_t n, std::size_t at, bool first) {
  if (stood_aside_) return "";
  double& sumsq = sumsq_[std::size_t(worker)];
  if (first) sumsq = 0.0;
  double s = sum_of_squares(v, n);
  if (!std::isfinite(s)) {
    const std::size_t bad = std::size_t(std::find_if(v, v + n, [](float x) { return !std::isfinite(x); }) - v);
    if (bad < n)
      return "a value that is not finite (" + std::to_string(v[bad]) + " at float " + std::to_string(at + bad) + " of the shard)";
    s = 0.0;  // the float lanes overflowed: again in double
    for (std::size_t i = 0; i < n; ++i) s += double(v[i]) * double(v[i]);
  }
  sumsq += s;
  const double bound = norm_bound();
  if (bound > 0 && std::sqrt(sumsq) > bound) {
    char b[192];
    std::snprintf(b, sizeof b, "a norm of %.4g, over %.4g (%.4g x the median of the last accepted pushes; "
                  "cluster.guard_norm_factor)", std::sqrt(sumsq), bound, opt_.norm_factor);
    return b;
  }
  return "";
}

double PushGuard::norm_bound() const {
  if (opt_.norm_factor <= 0 || accepted_ < kWarmup) return 0.0;
  std::vector<double> h = history_;  // (at most 64 values)
  std::nth_element(h.begin(), h.begin() + std::ptrdiff_t(h.size() / 2), h.end());
  return opt_.norm_factor * h[h.size() / 2];
}

void PushGuard::accepted(int worker) {
  const double norm = std::sqrt(sumsq_[std::size_t(worker)]);
  streak_[std::size_t(worker)] = 0;
  values_refused_[std::size_t(worker)] = 0;
  sumsq_[std::size_t(worker)] = 0.0;
  if (norm == 0.0) return;  // an empty batch says nothing about honest norms
  if (history_.size() < kHistory) history_.push_back(norm);
  else history_[next_] = norm;
  next_ = (next_ + 1) % kHistory;
  ++accepted_;
}

bool PushGuard::refused(int worker) {
  ++refused_[std::size_t(worker)];
  sumsq_[std::size_t(worker)] = 0.0;
  return opt_.drop_after > 0 && ++streak_[std::size_t(worker)] >= opt_.drop_after;
}

long PushGuard::total_refused() const {
  long n = 0;
  for (long r : refused_) n += r;
  return n;
}

nlohmann::ordered_json PushGuard::stats() const {
  nlohmann::ordered_json by_worker = nlohmann::ordered_json::object();
  for (std::size_t w = 0; w < refused_.size(); ++w)
    if (refused_[w]) by_worker[std::to_string(w)] = refused_[w];
  return {{"refused", by_worker}, {"norm_bound", norm_bound()}, {"stood_aside", stood_aside_}};
}

}  // namespace pslab
