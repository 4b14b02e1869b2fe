// allreduce: no servers. Every worker keeps a full replica; every step the workers all-reduce
// their gradients (the mean of all W batches) and each takes the same optimizer step
// (worker/roles/allreduce_rank.cpp; NCCL on GPUs, Gloo or shared memory on CPUs).
#include "ps/modes/mode.h"

namespace pslab {
namespace {

class Allreduce final : public Mode {
 public:
  std::string name() const override { return "allreduce"; }
  WorkerProtocol worker_protocol() const override { return {WorkerProtocol::Kind::allreduce}; }
  int update_batch(int batch, int workers) const override { return batch * workers; }
};

}  // namespace

std::unique_ptr<Mode> make_allreduce(const std::string&) { return std::make_unique<Allreduce>(); }

}  // namespace pslab
