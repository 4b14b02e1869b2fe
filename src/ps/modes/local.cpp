// local:H: local SGD (model averaging; Stich 2019, Lin et al. 2020). Each worker takes H steps
// of its own optimizer on its own θ, then pushes the change θ_local − θ_pulled; a shard adds the
// batch-weighted mean of the W changes of a clock once all have arrived (as bsp averages
// gradients), and the reply replaces every worker's θ with that average. A worker's clock
// counts its pushes, so clock c ends local step (c + 1) H. With plain SGD, local:1 is bsp.
#include "ps/modes/clock_sum.h"

namespace pslab {
namespace {

class LocalSgd final : public Mode {
 public:
  explicit LocalSgd(int h) : h_(h) {}
  std::string name() const override { return "local:" + std::to_string(h_); }
  WorkerProtocol worker_protocol() const override { return {WorkerProtocol::Kind::delta, h_, 0.0}; }
  // A worker's local step stands in for 1/W of a bsp step over the W batches.
  int update_batch(int batch, int workers) const override { return batch * workers; }
  void check_push(const PushInfo& p, const ShardView& s) const override {
    if (p.clock != s.version)
      throw ProtocolError(name() + " push for clock " + std::to_string(p.clock) + " while clock " +
                          std::to_string(s.version) + " is open");
  }
  void on_push(const PushInfo& p, const ShardView& s, ShardOps& ops) const override {
    clock_sum::add(p, ops);
    if (s.min_clock() <= s.version) return;  // not every worker has pushed its model for the open clock
    long samples = 0;
    const float* sum = clock_sum::take(ops, samples);
    if (samples == 0) return ops.advance();
    ops.add(sum, 1.0 / double(samples), samples);
  }
  bool pull_ready(long clock, const ShardView& s) const override { return s.version >= clock; }
  std::string why_held(long, const ShardView& s) const override {
    return name() + " average " + std::to_string(s.version) + " still needs the models of " + workers_below(s, s.version + 1);
  }

 private:
  int h_;
};

}  // namespace

std::unique_ptr<Mode> make_local(const std::string& arg) {
  const char* expected = "the local steps between averages must be an integer >= 1, e.g. \"local:4\"";
  const long h = mode_integer(arg, expected);
  if (h < 1 || h > 1000000) throw std::invalid_argument(expected);
  return std::make_unique<LocalSgd>(int(h));
}

}  // namespace pslab
