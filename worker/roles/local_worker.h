// The loop of a PS worker whose rule averages models instead of gradients (local:H, easgd):
// the worker trains its own θ with its own optimizer and pushes a change of θ now and then
// (ps/modes/mode.h, WorkerProtocol).
#pragma once

#include "ps/client.h"
#include "ps/modes/mode.h"
#include "role_context.h"

#include <algorithm>
#include <cstddef>

namespace pslab {

// easgd's exchange on the worker (Zhang et al. 2015, eq. 5): e = alpha (θ − c); θ −= e. Writes
// e over `centre_then_e` (n floats: the centre as pulled in, the elastic difference out). A push
// of no samples (a period of empty batches) the shard applies as nothing: then e = 0 and θ stays,
// so that θ and c still move by opposite amounts.
inline void elastic_exchange(float* theta, float* centre_then_e, std::size_t n, float alpha, long samples) {
  if (samples == 0) return std::fill(centre_then_e, centre_then_e + n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) {
    const float e = alpha * (theta[i] - centre_then_e[i]);
    centre_then_e[i] = e;
    theta[i] -= e;
  }
}

// Runs steps [0, total_steps) after client.connect(); the caller says Bye. `proto.kind` is
// delta or elastic.
void run_local_worker(RoleContext& ctx, PsClient& client, const WorkerProtocol& proto, int lr_batch);

}  // namespace pslab
