// One worker of a parameter-server run: pull θ, then every step compute the gradient and
// push it, the servers answering with θ for the next step (one round trip per step).
#include <chrono>

#include "ps/client.h"
#include "role_context.h"
#include "run/setup.h"

namespace pslab {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

void run_ps_worker(const ExperimentConfig& cfg, const RoleOptions& opt) {
  RoleContext ctx(cfg, opt, RoleKind::ps_worker);
  if (int(opt.servers.size()) != cfg.cluster.servers)
    throw std::invalid_argument(std::to_string(opt.servers.size()) + " server addresses given, cluster.servers = " +
                                std::to_string(cfg.cluster.servers));
  Replica& replica = ctx.replica();
  PsClient client(ctx.transport(), opt.servers, client_options(cfg, wire::Role::worker, opt.rank));
  ctx.announce(cfg.cluster.mode + " over " + std::to_string(opt.servers.size()) + " server(s), " + cfg.cluster.transport +
               ", pushes in " + cfg.cluster.codec);

  client.connect();  // the start barrier: returns when every worker has said Hello
  PullResult pulled = client.pull(0, replica.host_params());
  replica.upload_params();

  const long steps = ctx.total_steps(), spe = ctx.steps_per_epoch();
  for (long step = 0; step < steps; ++step) {
    const auto idx = ctx.batch(step);
    const auto t0 = Clock::now();
    StepRecord rec;
    rec.loss = replica.compute_gradient(idx);
    const float* grad = replica.download_grads();
    ctx.backend().synchronize();
    rec.compute_s = since(t0);
    rec.delay_s = ctx.straggler().sleep_after(rec.compute_s);
    rec.samples = int(idx.size());
    rec.version = pulled.min_version;

    const bool last = step == steps - 1;
    const auto t1 = Clock::now();
    // Push, and pull θ for step + 1 in the same round trip (none after the last step).
    pulled = client.push(step, int(idx.size()), grad, last ? nullptr : replica.host_params());
    rec.comm_s = since(t1);
    rec.wait_s = last ? 0.0 : pulled.held_us * 1e-6;
    if (!last) replica.upload_params();
    ctx.log().add(step, double(step + 1) / double(spe), rec, last || (step + 1) % spe == 0);
  }
  client.bye(steps);
  ctx.metrics().flush();
}

}  // namespace pslab
