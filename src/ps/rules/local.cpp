// local:H: local SGD (model averaging; Stich 2019, Lin et al. 2020). Each worker takes H steps
// of its own optimizer on its own θ, then pushes the change θ_local − θ_pulled; a shard adds the
// batch-weighted mean of the W changes of a clock once all have arrived (as bsp averages
// gradients), and the reply replaces every worker's θ with that average. A worker's clock
// counts its pushes, so clock c ends local step (c + 1) H. With plain SGD, local:1 is bsp.
#include <charconv>

#include "ps/rules/rule.h"

namespace pslab {
namespace {

class LocalSgd final : public ConsistencyRule {
 public:
  explicit LocalSgd(int h) : h_(h) {}
  std::string name() const override { return "local:" + std::to_string(h_); }
  void check_push(const PushInfo& p, const ShardView& s) const override {
    if (p.clock != s.version)
      throw ProtocolError(name() + " push for clock " + std::to_string(p.clock) + " while clock " +
                          std::to_string(s.version) + " is open");
  }
  void on_push(const PushInfo&, const ShardView& s, ShardOps& ops) override {
    ops.accumulate();
    if (s.min_clock() > s.version) ops.add_accumulated();  // every worker pushed the open clock
  }
  bool pull_ready(long clock, const ShardView& s) const override { return s.version >= clock; }
  // A worker's local step stands in for 1/W of a bsp step over the W batches.
  int update_batch(int batch, int workers) const override { return batch * workers; }
  std::string why_held(long, const ShardView& s) const override {
    return name() + " average " + std::to_string(s.version) + " still needs the models of " +
           workers_below(s, s.version + 1);
  }
  WorkerProtocol worker_protocol() const override { return {WorkerProtocol::Push::delta, h_, 0.0}; }

 private:
  int h_;
};

}  // namespace

std::unique_ptr<ConsistencyRule> make_local(const std::string& arg) {
  int h = 0;
  const char* b = arg.data();
  const char* e = arg.data() + arg.size();
  const auto [p, ec] = std::from_chars(b, e, h);
  if (ec != std::errc() || p != e || b == e || h < 1)
    throw std::invalid_argument("the local steps between averages must be an integer >= 1, e.g. \"local:4\"");
  return std::make_unique<LocalSgd>(h);
}

}  // namespace pslab
