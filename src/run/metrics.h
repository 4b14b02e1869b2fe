// Metrics as JSON lines: one object per line, one file per process, times in seconds since
// the run's start (a wall-clock instant every process of a run is given, so that lines of
// different processes share one time axis).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "core/clock.h"

namespace pslab {

// Seconds since the Unix epoch, as a double (for the run-start instant passed between processes).
double unix_now_s();

class MetricsWriter {
 public:
  // Opens (truncates; with append, appends to: a resumed run) `path`, creating its parent
  // directory. Times are clock.unix_s() - run_start_unix_s; run_start_unix_s <= 0 means now.
  MetricsWriter(const std::string& path, double run_start_unix_s, bool append = false, const RunClock& clock = wall_clock());
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Seconds since the run's start, by the clock (simulated in the virtual cluster).
  double now() const;
  // Writes `record` with "t" (seconds since run start) added as the first key. Buffered;
  // flushed by flush(), every `flush_every_s` of writes and at destruction. A write or flush
  // that fails (a full disk) throws std::runtime_error "PATH: cannot write metrics: why":
  // lines are never cut silently. Roles flush at their end, so that it is checked.
  void write(const nlohmann::ordered_json& record) { write(record, now()); }
  // The same, stamped `t` (seconds since run start) instead of now: what the record describes
  // happened then (an evaluation: when its θ was taken, not when the evaluation ended).
  void write(const nlohmann::ordered_json& record, double t);
  void flush();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  [[noreturn]] void fail();
  std::FILE* f_ = nullptr;
  bool failed_ = false;
  const RunClock& clock_;
  double run_start_;
  double last_flush_;
  static constexpr double flush_every_s = 1.0;
};

}  // namespace pslab
