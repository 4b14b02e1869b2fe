// ssp:s: stale-synchronous. Each push is applied on arrival; a pull for clock c is served once
// the slowest worker has clock >= c - s, so no worker computes on parameters more than s
// clocks ahead of the slowest. ssp:0 serves a pull only when every worker has caught up.
#include <charconv>

#include "ps/rules/rule.h"

namespace pslab {
namespace {

class Ssp final : public ConsistencyRule {
 public:
  explicit Ssp(long staleness) : s_(staleness) {}
  std::string name() const override { return "ssp:" + std::to_string(s_); }
  void on_push(const PushInfo&, const ShardView&, ShardOps& ops) override { ops.apply(); }
  bool pull_ready(long clock, const ShardView& s) const override { return s.min_clock() >= clock - s_; }
  int update_batch(int batch, int) const override { return batch; }
  bool trains_without_lost_workers() const override { return true; }  // the others' clocks still bound staleness
  std::string why_held(long clock, const ShardView& s) const override {
    return name() + " needs every worker at clock >= " + std::to_string(clock - s_) + "; behind: " +
           workers_below(s, clock - s_);
  }

 private:
  long s_;
};

}  // namespace

std::unique_ptr<ConsistencyRule> make_ssp(const std::string& arg) {
  long s = -1;
  const char* b = arg.data();
  const char* e = arg.data() + arg.size();
  const auto [p, ec] = std::from_chars(b, e, s);
  if (ec != std::errc() || p != e || b == e || s < 0)
    throw std::invalid_argument("the staleness bound must be an integer >= 0, e.g. \"ssp:2\"");
  return std::make_unique<Ssp>(s);
}

}  // namespace pslab
