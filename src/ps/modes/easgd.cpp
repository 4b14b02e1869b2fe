// easgd:alpha: asynchronous elastic averaging SGD (Zhang, Choromanska & LeCun 2015). The servers
// hold the centre variable c. Each worker trains its own θ with its own optimizer; every
// cluster.sync_every steps it pulls c, sends the elastic difference e = alpha (θ − c) and moves
// θ −= e, and the shard adds e to c when it arrives: c += e. Pulls are never held. With W
// workers, alpha = 0.9 / W is the paper's choice (beta = W alpha = 0.9).
#include "ps/modes/mode.h"

namespace pslab {
namespace {

class Easgd final : public Mode {
 public:
  Easgd(double alpha, std::string text) : alpha_(alpha), text_(std::move(text)) {}
  std::string name() const override { return "easgd:" + text_; }
  WorkerProtocol worker_protocol() const override { return {WorkerProtocol::Kind::elastic, 1, alpha_}; }
  int update_batch(int batch, int) const override { return batch; }  // each worker's own steps
  bool trains_without_lost_workers() const override { return true; }
  std::vector<Key> reads() const override { return {{"cluster.sync_every", "is the elastic exchange period of easgd"}}; }
  void on_push(const PushInfo& p, const ShardView&, ShardOps& ops) const override { ops.add(nullptr, 1.0, p.batch); }
  bool pull_ready(long, const ShardView&) const override { return true; }
  bool applies_in_pieces() const override { return true; }

 private:
  double alpha_;
  std::string text_;  // alpha as cluster.mode wrote it
};

}  // namespace

std::unique_ptr<Mode> make_easgd(const std::string& arg) {
  const char* expected = "the moving rate alpha must be a number in (0, 1), e.g. \"easgd:0.2\"";
  const double alpha = mode_number(arg, expected);
  if (alpha <= 0 || alpha >= 1) throw std::invalid_argument(expected);
  return std::make_unique<Easgd>(alpha, arg);
}

}  // namespace pslab
