// asp: asynchronous. Each push is applied on arrival and pulls are never held.
#include "ps/rules/rule.h"

namespace pslab {
namespace {

class Asp final : public ConsistencyRule {
 public:
  std::string name() const override { return "asp"; }
  void on_push(const PushInfo&, const ShardView&, ShardOps& ops) override { ops.apply(); }
  bool pull_ready(long, const ShardView&) const override { return true; }
  int update_batch(int batch, int) const override { return batch; }
  bool trains_without_lost_workers() const override { return true; }  // no worker waits for another
  std::string why_held(long, const ShardView&) const override { return "asp never holds a pull"; }
};

}  // namespace

std::unique_ptr<ConsistencyRule> make_asp(const std::string&) { return std::make_unique<Asp>(); }

}  // namespace pslab
