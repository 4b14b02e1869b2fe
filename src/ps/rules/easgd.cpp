// easgd:alpha: asynchronous elastic averaging SGD (Zhang, Choromanska & LeCun 2015). The servers
// hold the centre variable c. Each worker trains its own θ with its own optimizer; every
// cluster.sync_every steps it pulls c, sends the elastic difference e = alpha (θ − c) and moves
// θ −= e, and the shard adds e to c when it arrives: c += e. Pulls are never held. With W
// workers, alpha = 0.9 / W is the paper's choice (beta = W alpha = 0.9).
#include <charconv>
#include <cmath>

#include "ps/rules/rule.h"

namespace pslab {
namespace {

class Easgd final : public ConsistencyRule {
 public:
  Easgd(double alpha, std::string text) : alpha_(alpha), text_(std::move(text)) {}
  std::string name() const override { return "easgd:" + text_; }
  void on_push(const PushInfo&, const ShardView&, ShardOps& ops) override { ops.add(); }
  bool pull_ready(long, const ShardView&) const override { return true; }
  int update_batch(int batch, int) const override { return batch; }  // each worker's own steps
  bool trains_without_lost_workers() const override { return true; }
  std::string why_held(long, const ShardView&) const override { return name() + " never holds a pull"; }
  WorkerProtocol worker_protocol() const override { return {WorkerProtocol::Push::elastic, 1, alpha_}; }

 private:
  double alpha_;
  std::string text_;  // alpha as cluster.mode wrote it
};

}  // namespace

std::unique_ptr<ConsistencyRule> make_easgd(const std::string& arg) {
  double alpha = -1;
  const char* b = arg.data();
  const char* e = arg.data() + arg.size();
  const auto [p, ec] = std::from_chars(b, e, alpha);
  if (ec != std::errc() || p != e || b == e || !std::isfinite(alpha) || alpha <= 0 || alpha >= 1)
    throw std::invalid_argument("the moving rate alpha must be a number in (0, 1), e.g. \"easgd:0.2\"");
  return std::make_unique<Easgd>(alpha, arg);
}

}  // namespace pslab
