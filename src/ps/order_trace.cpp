#include "ps/order_trace.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>
#include <sstream>
#include <stdexcept>

namespace pslab {

OrderTrace::OrderTrace(const std::string& path, bool append) : path_(path) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  f_ = std::fopen(path.c_str(), append ? "a+" : "w");
  if (!f_) throw std::runtime_error(path + ": cannot write the order trace: " + std::strerror(errno));
  // A trace cut by a kill ends mid-line: what is appended starts on a line of its own.
  if (append && std::fseek(f_, -1, SEEK_END) == 0 && std::fgetc(f_) != '\n') check(std::fputc('\n', f_));
}

OrderTrace::~OrderTrace() {
  if (f_) std::fclose(f_);
}

void OrderTrace::check(int written) {
  if (written < 0) throw std::runtime_error(path_ + ": cannot write the order trace: " + std::strerror(errno));
}

void OrderTrace::push(int worker, long clock, long version_pulled, int batch) {
  if (f_) check(std::fprintf(f_, "push %d %ld %ld %d\n", worker, clock, version_pulled, batch));
}

void OrderTrace::pull(int worker, long clock, long version) {
  if (f_) check(std::fprintf(f_, "pull %d %ld %ld\n", worker, clock, version));
}

void OrderTrace::event(const std::string& line) {
  if (f_) check(std::fprintf(f_, "%s\n", line.c_str()));
}

void OrderTrace::flush() {
  if (f_) check(std::fflush(f_) == 0 ? 0 : -1);
}

std::vector<TraceOp> read_order_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": no order trace (the servers of a real run write it)");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  for (std::size_t i = 0; i < lines.size(); ++i) {  // first: events a replay cannot re-execute, wherever they are
    const std::string kind = lines[i].substr(0, lines[i].find(' '));
    if (kind == "drop" || kind == "rejoin" || kind == "resume" || kind == "readmit" || kind == "again")
      throw std::runtime_error(path + ":" + std::to_string(i + 1) + ": the run had a '" + kind +
                               "' (a lost worker, a restarted server, a resumed run, or a push+pull whose answer a cut "
                               "connection lost, answered again later): its order cannot be replayed");
  }
  std::vector<TraceOp> ops;
  for (long n = 1; n <= long(lines.size()); ++n) {
    const std::string& line = lines[std::size_t(n - 1)];
    std::istringstream s(line);
    std::string kind;
    s >> kind;
    TraceOp op{};
    bool ok = false;
    if (kind == "push") {
      op.kind = TraceOp::push;
      ok = bool(s >> op.worker >> op.clock >> op.version >> op.batch);
    } else if (kind == "pull") {
      op.kind = TraceOp::pull;
      ok = bool(s >> op.worker >> op.clock >> op.version);
    }
    if (!ok) throw std::runtime_error(path + ":" + std::to_string(n) + ": not an order-trace line: \"" + line + "\"");
    ops.push_back(op);
  }
  // A pull served twice (the answer to the first was lost with a cut connection, and the worker
  // asked again) counts where it was served last: that is the θ the worker took.
  std::set<std::pair<int, long>> later;
  std::vector<char> keep(ops.size(), 1);
  for (std::size_t i = ops.size(); i-- > 0;)
    if (ops[i].kind == TraceOp::pull && !later.insert({ops[i].worker, ops[i].clock}).second) keep[i] = 0;
  std::size_t n = 0;
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (keep[i]) ops[n++] = ops[i];
  ops.resize(n);
  return ops;
}

}  // namespace pslab
