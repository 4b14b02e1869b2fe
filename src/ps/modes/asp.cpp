// asp: asynchronous. Each push is applied on arrival and pulls are never held.
#include "ps/modes/mode.h"

namespace pslab {
namespace {

class Asp final : public Mode {
 public:
  std::string name() const override { return "asp"; }
  WorkerProtocol worker_protocol() const override { return {}; }
  int update_batch(int batch, int) const override { return batch; }
  bool trains_without_lost_workers() const override { return true; }  // no worker waits for another
  void on_push(const PushInfo& p, const ShardView&, ShardOps& ops) const override { ops.step(nullptr, 1.0, p.batch); }
  bool pull_ready(long, const ShardView&) const override { return true; }
  bool applies_in_pieces() const override { return true; }
};

}  // namespace

std::unique_ptr<Mode> make_asp(const std::string&) { return std::make_unique<Asp>(); }

}  // namespace pslab
