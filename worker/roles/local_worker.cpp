// local:H and easgd on a worker. Per step: forward + backward on the local batch, one step of
// the worker's own optimizer on its own θ (at the schedule's lr for the rule's lr batch). Then,
// at a sync point (every H steps for local:H, every cluster.sync_every for easgd, and after the
// last step):
//
//   delta    push θ − θ_pulled (the samples since the last push as its batch); the reply is
//            the servers' average, which becomes θ and θ_pulled
//   elastic  pull the centre c; e = alpha (θ − c); θ −= e; push e (the servers add it to c)
//
// A push's clock counts the worker's pushes. Host buffers: θ_pulled and the pushed change, P
// floats each, allocated once. A GPU step is not waited for (as in run_single: the host queues
// the next while the GPU finishes this one), but at a sync point and under a straggler.
#include "roles/local_worker.h"

#include <vector>

#include "core/optimizer.h"
#include "run/setup.h"

namespace pslab {

void run_local_worker(RoleContext& ctx, PsClient& client, const WorkerProtocol& proto, int lr_batch) {
  const ExperimentConfig& cfg = ctx.cfg;
  Replica& replica = ctx.replica();
  Model& model = replica.model();
  const std::size_t P = model.num_params();
  const bool elastic = proto.kind == WorkerProtocol::Kind::elastic;
  const long every = elastic ? cfg.cluster.sync_every : proto.local_steps;
  const float alpha = float(proto.alpha);

  std::vector<float> pulled(P), change(P);
  PullResult last_pull = client.pull(0, replica.host_params());
  std::copy(replica.host_params(), replica.host_params() + P, pulled.begin());
  replica.upload_params();
  Optimizer optimizer(ctx.backend(), cfg.optimizer, P, layer_sizes(model.spec(), 0, P));

  const long steps = ctx.total_steps(), spe = ctx.steps_per_epoch();
  const ScheduleConfig schedule = schedule_for_run(cfg, spe);
  long clock = 0;
  int samples_since_push = 0;
  for (long step = 0; step < steps; ++step) {
    const auto idx = ctx.batch(step);
    const bool last = step == steps - 1;
    const auto t0 = ctx.clock().now();
    ctx.straggler().start_step(step);
    StepRecord rec;
    rec.lr = learning_rate(schedule, cfg.optimizer.lr, lr_batch, double(step) / double(spe));
    rec.loss = replica.train_step(idx, optimizer, rec.lr);  // (an empty batch moves nothing)
    // Waited for where the step's time must be the GPU's: a straggler's slowdown scales it, and
    // a sync point's communication is timed from its end.
    const bool sync_point = last || (step + 1) % every == 0;
    if (sync_point || ctx.straggler().active()) ctx.backend().synchronize();
    rec.compute_s = ctx.clock().computed(t0, long(idx.size()));
    rec.delay_s = ctx.straggler().sleep_after(rec.compute_s);
    rec.samples = int(idx.size());
    rec.version = last_pull.min_version;
    samples_since_push += rec.samples;

    if (sync_point) {
      const auto t1 = ctx.clock().now();
      replica.download_params();
      float* theta = replica.host_params();
      if (elastic) {
        last_pull = client.pull(clock, change.data());  // the centre
        elastic_exchange(theta, change.data(), P, alpha, samples_since_push);
        client.push(clock, samples_since_push, change.data(), nullptr);
        rec.wait_s = last_pull.held_us * 1e-6;
      } else {
        for (std::size_t i = 0; i < P; ++i) change[i] = theta[i] - pulled[i];
        const PullResult r = client.push(clock, samples_since_push, change.data(), last ? nullptr : theta);
        if (!last) {
          last_pull = r;
          std::copy(theta, theta + P, pulled.begin());
          rec.wait_s = r.held_us * 1e-6;
        }
      }
      replica.upload_params();
      rec.comm_s = ctx.since(t1);
      ++clock;
      samples_since_push = 0;
    }
    ctx.log().add(step, double(step + 1) / double(spe), rec, last || (step + 1) % spe == 0);
  }
  client.bye(clock);
}

}  // namespace pslab
