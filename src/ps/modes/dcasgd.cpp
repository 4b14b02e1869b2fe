// dcasgd:λ: delay-compensated asynchronous SGD (Zheng et al. 2017). Each push is applied on
// arrival, as in asp, with its gradient corrected for the updates it missed:
//     g' = g + λ g ⊙ g ⊙ (θ_now − θ_pulled)
// (a first-order Taylor term whose Hessian is approximated by λ g ⊙ g). θ_pulled is the shard
// as the server last served it to that worker: the shard keeps one copy per worker (its
// memory, workers × shard bytes, is in the server's final metrics line, pulled_params_bytes).
// Those copies are not in the checkpoint: a server restarted from it applies each worker's
// first push after it came back uncorrected (as computed on θ now).
// dcasgd:0 is asp, bit for bit. Pulls are never held.
#include "ps/modes/mode.h"

namespace pslab {
namespace {

class DcAsgd final : public Mode {
 public:
  DcAsgd(double lambda, std::string text) : lambda_(lambda), text_(std::move(text)) {}
  std::string name() const override { return "dcasgd:" + text_; }
  WorkerProtocol worker_protocol() const override { return {}; }
  int update_batch(int batch, int) const override { return batch; }
  bool trains_without_lost_workers() const override { return true; }
  bool keeps_served_theta() const override { return true; }
  bool applies_in_pieces() const override { return true; }
  void on_push(const PushInfo& p, const ShardView&, ShardOps& ops) const override {
    if (p.batch == 0) return ops.step(nullptr, 1.0, 0);  // an empty batch: checked, nothing changes
    const float* then = ops.served(p.worker);
    const float* g = ops.payload();
    const float* now = ops.theta();
    float* corrected = ops.scratch();
    const float l = float(lambda_);
    for (std::size_t i = 0, n = ops.length(); i < n; ++i) corrected[i] = g[i] + l * g[i] * g[i] * (now[i] - then[i]);
    ops.step(corrected, 1.0, p.batch);
  }
  bool pull_ready(long, const ShardView&) const override { return true; }

 private:
  double lambda_;
  std::string text_;  // λ as cluster.mode wrote it
};

}  // namespace

std::unique_ptr<Mode> make_dcasgd(const std::string& arg) {
  const char* expected = "the compensation lambda must be a number >= 0, e.g. \"dcasgd:0.04\"";
  if (mode_number(arg, expected) < 0) throw std::invalid_argument(expected);
  return std::make_unique<DcAsgd>(mode_number(arg, expected), arg);
}

}  // namespace pslab
