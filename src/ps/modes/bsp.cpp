// bsp: bulk-synchronous. The pushes of clock c are summed (weighted by their batch) and applied
// once, as their mean, when all W workers have pushed c; a pull for clock c is served once the
// shard's version (= clocks applied) reaches c. One update averages W batches.
#include "ps/modes/clock_sum.h"

namespace pslab {
namespace {

class Bsp final : public Mode {
 public:
  std::string name() const override { return "bsp"; }
  WorkerProtocol worker_protocol() const override { return {}; }
  int update_batch(int batch, int workers) const override { return batch * workers; }
  void check_push(const PushInfo& p, const ShardView& s) const override {
    if (p.clock != s.version)
      throw ProtocolError("bsp push for clock " + std::to_string(p.clock) + " while clock " + std::to_string(s.version) +
                          " is open");
  }
  void on_push(const PushInfo& p, const ShardView& s, ShardOps& ops) const override {
    clock_sum::add(p, ops);
    if (s.min_clock() <= s.version) return;  // not every worker has pushed the open clock
    long samples = 0;
    float* mean = clock_sum::take(ops, samples);
    if (samples == 0) return ops.advance();  // a clock without samples: θ stays, the clock advances
    ops.cpu().scale(ops.length(), 1.0f / float(samples), mean);
    ops.step(mean, 1.0, samples);
  }
  bool pull_ready(long clock, const ShardView& s) const override { return s.version >= clock; }
  std::string why_held(long, const ShardView& s) const override {
    return "bsp clock " + std::to_string(s.version) + " still needs pushes from " + workers_below(s, s.version + 1);
  }
};

}  // namespace

std::unique_ptr<Mode> make_bsp(const std::string&) { return std::make_unique<Bsp>(); }

}  // namespace pslab
