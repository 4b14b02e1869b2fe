#include "run/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace pslab {

double unix_now_s() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

MetricsWriter::MetricsWriter(const std::string& path, double run_start_unix_s, bool append, const RunClock& clock)
    : path_(path), clock_(clock), run_start_(run_start_unix_s > 0 ? run_start_unix_s : clock.unix_s()) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f_) throw std::runtime_error(path + ": cannot write metrics: " + std::strerror(errno));
  last_flush_ = now();
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

double MetricsWriter::now() const { return clock_.unix_s() - run_start_; }

void MetricsWriter::write(const nlohmann::ordered_json& record, double t) {
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "{\"t\":%.6f", t);
  std::string s = record.dump();  // "{...}"
  s.replace(0, 1, s.size() > 2 ? std::string(stamp) + "," : std::string(stamp));
  std::fwrite(s.data(), 1, s.size(), f_);
  std::fputc('\n', f_);
  if (now() - last_flush_ >= flush_every_s) flush();
}

void MetricsWriter::flush() {
  std::fflush(f_);
  last_flush_ = now();
}

}  // namespace pslab
