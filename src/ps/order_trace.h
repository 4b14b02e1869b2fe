// The order in which one parameter server applied pushes and served pulls: recorded by every
// server of a real run (small, always on: one short line per push and per pull), so that
// `launch.py replay` re-executes that order in the virtual cluster and reproduces the run's θ
// bit for bit (src/sim/virtual_cluster.h).
//
// File: RUN_DIR/trace/server<k>.txt, one operation per line, in the server's order:
//   push W CLOCK VERSION_PULLED BATCH     worker W's gradient for its step CLOCK was applied (or accumulated)
//   pull W CLOCK VERSION                  worker W was served θ of VERSION for its step CLOCK
//   drop W | rejoin W CLOCK | resume      events a replay cannot re-execute (it refuses the trace):
//   | readmit W | again W CLOCK           readmit, a dropped worker taken back; again, the pull of a
//                                         push+pull whose answer a cut connection lost, served again
//                                         later than its push
// A pull served twice for the same worker and clock (its first answer lost with a cut
// connection, and the worker asked again) is read where it was served last: that is the θ the
// worker took.
//
// Threading: the server's event-loop thread.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace pslab {

class OrderTrace {
 public:
  OrderTrace() = default;
  // Opens `path` (truncated; appended to with `append`: a resumed or restarted server).
  OrderTrace(const std::string& path, bool append);
  ~OrderTrace();
  OrderTrace(const OrderTrace&) = delete;
  OrderTrace& operator=(const OrderTrace&) = delete;

  bool on() const { return f_ != nullptr; }
  void push(int worker, long clock, long version_pulled, int batch);
  void pull(int worker, long clock, long version);
  void event(const std::string& line);  // drop / rejoin / resume
  void flush();
  // Each throws std::runtime_error "PATH: cannot write the order trace: why" when a write fails.

 private:
  void check(int written);
  std::string path_;
  std::FILE* f_ = nullptr;
};

struct TraceOp {
  enum Kind { push, pull } kind;
  int worker = 0;
  long clock = 0;
  long version = 0;  // push: the version pulled; pull: the version served
  int batch = 0;     // push only
};

// The operations of one server's trace. Throws std::runtime_error naming the file and line for
// a malformed line or an event a replay cannot re-execute (drop, rejoin, resume).
std::vector<TraceOp> read_order_trace(const std::string& path);

}  // namespace pslab
