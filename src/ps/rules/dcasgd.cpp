// dcasgd:λ: delay-compensated asynchronous SGD (Zheng et al. 2017). Each push is applied on
// arrival, as in asp, with its gradient corrected for the updates it missed:
//     g' = g + λ g ⊙ g ⊙ (θ_now − θ_pulled)
// (a first-order Taylor term whose Hessian is approximated by λ g ⊙ g). θ_pulled is the shard
// as the server last served it to that worker: the shard keeps one copy per worker (its
// memory, workers × shard bytes, is in the server's final metrics line, pulled_params_bytes).
// dcasgd:0 is asp, bit for bit. Pulls are never held.
#include <charconv>
#include <cmath>

#include "ps/rules/rule.h"

namespace pslab {
namespace {

class DcAsgd final : public ConsistencyRule {
 public:
  DcAsgd(double lambda, std::string text) : lambda_(lambda), text_(std::move(text)) {}
  std::string name() const override { return "dcasgd:" + text_; }
  void on_push(const PushInfo&, const ShardView&, ShardOps& ops) override { ops.apply_delay_compensated(lambda_); }
  bool pull_ready(long, const ShardView&) const override { return true; }
  int update_batch(int batch, int) const override { return batch; }
  bool trains_without_lost_workers() const override { return true; }
  bool keeps_pulled_params() const override { return true; }
  std::string why_held(long, const ShardView&) const override { return name() + " never holds a pull"; }

 private:
  double lambda_;
  std::string text_;  // λ as cluster.mode wrote it
};

}  // namespace

std::unique_ptr<ConsistencyRule> make_dcasgd(const std::string& arg) {
  double lambda = -1;
  const char* b = arg.data();
  const char* e = arg.data() + arg.size();
  const auto [p, ec] = std::from_chars(b, e, lambda);
  if (ec != std::errc() || p != e || b == e || !std::isfinite(lambda) || lambda < 0)
    throw std::invalid_argument("the compensation lambda must be a number >= 0, e.g. \"dcasgd:0.04\"");
  return std::make_unique<DcAsgd>(lambda, arg);
}

}  // namespace pslab
