// ssp:s: stale-synchronous. Each push is applied on arrival; a pull for clock c is served once
// the slowest worker has clock >= c - s, so no worker computes on parameters more than s
// clocks ahead of the slowest. ssp:0 serves a pull only when every worker has caught up.
#include "ps/modes/mode.h"

namespace pslab {
namespace {

class Ssp final : public Mode {
 public:
  explicit Ssp(long staleness) : s_(staleness) {}
  std::string name() const override { return "ssp:" + std::to_string(s_); }
  WorkerProtocol worker_protocol() const override { return {}; }
  int update_batch(int batch, int) const override { return batch; }
  bool trains_without_lost_workers() const override { return true; }  // the others' clocks still bound staleness
  void on_push(const PushInfo& p, const ShardView&, ShardOps& ops) const override { ops.step(nullptr, 1.0, p.batch); }
  bool pull_ready(long clock, const ShardView& s) const override { return s.min_clock() >= clock - s_; }
  bool applies_in_pieces() const override { return true; }
  std::string why_held(long clock, const ShardView& s) const override {
    return name() + " needs every worker at clock >= " + std::to_string(clock - s_) + "; behind: " +
           workers_below(s, clock - s_);
  }

 private:
  long s_;
};

}  // namespace

std::unique_ptr<Mode> make_ssp(const std::string& arg) {
  const char* expected = "the staleness bound must be an integer >= 0, e.g. \"ssp:2\"";
  const long s = mode_integer(arg, expected);
  if (s < 0) throw std::invalid_argument(expected);
  return std::make_unique<Ssp>(s);
}

}  // namespace pslab
