// bsp: bulk-synchronous. The pushes of clock c are accumulated (weighted by their batch) and
// applied once, as their mean, when all W workers have pushed c; a pull for clock c is served
// once the shard's version (= clocks applied) reaches c. One update averages W batches.
#include "ps/rules/rule.h"

namespace pslab {
namespace {

class Bsp final : public ConsistencyRule {
 public:
  std::string name() const override { return "bsp"; }
  void check_push(const PushInfo& p, const ShardView& s) const override {
    if (p.clock != s.version)
      throw ProtocolError("bsp push for clock " + std::to_string(p.clock) + " while clock " +
                          std::to_string(s.version) + " is open");
  }
  void on_push(const PushInfo&, const ShardView& s, ShardOps& ops) override {
    ops.accumulate();
    if (s.min_clock() > s.version) ops.apply_accumulated();  // every worker pushed the open clock
  }
  bool pull_ready(long clock, const ShardView& s) const override { return s.version >= clock; }
  int update_batch(int batch, int workers) const override { return batch * workers; }
  std::string why_held(long, const ShardView& s) const override {
    return "bsp clock " + std::to_string(s.version) + " still needs pushes from " + workers_below(s, s.version + 1);
  }
};

}  // namespace

std::unique_ptr<ConsistencyRule> make_bsp(const std::string&) { return std::make_unique<Bsp>(); }

}  // namespace pslab
