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
  f_ = std::fopen(path.c_str(), append ? "a+" : "w");
  if (!f_) throw std::runtime_error(path + ": cannot write metrics: " + std::strerror(errno));
  // A life killed mid-line left its last line cut: the next life's first line starts on a line of
  // its own (else both were one line that no reader could parse: a resumed worker's "resumed").
  const bool cut = append && std::fseek(f_, -1, SEEK_END) == 0 && std::fgetc(f_) != '\n';
  std::fseek(f_, 0, SEEK_END);  // (from reading to writing)
  if (cut && std::fputc('\n', f_) == EOF) fail();
  last_flush_ = now();
}

MetricsWriter::~MetricsWriter() {
  if (f_ && std::fclose(f_) != 0 && !failed_)  // roles flush at their end (checked); this is what is left after an error
    std::fprintf(stderr, "%s: the last metrics lines could not be written: %s\n", path_.c_str(), std::strerror(errno));
}

void MetricsWriter::fail() {
  failed_ = true;
  throw std::runtime_error(path_ + ": cannot write metrics: " + std::strerror(errno ? errno : EIO));
}

double MetricsWriter::now() const { return clock_.unix_s() - run_start_; }

void MetricsWriter::write(const nlohmann::ordered_json& record, double t) {
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "{\"t\":%.6f", t);
  std::string s = record.dump();  // "{...}"
  s.replace(0, 1, s.size() > 2 ? std::string(stamp) + "," : std::string(stamp));
  s.push_back('\n');
  errno = 0;
  if (std::fwrite(s.data(), 1, s.size(), f_) != s.size()) fail();
  if (now() - last_flush_ >= flush_every_s) flush();
}

void MetricsWriter::flush() {
  errno = 0;
  if (std::fflush(f_) != 0) fail();
  last_flush_ = now();
}

}  // namespace pslab
