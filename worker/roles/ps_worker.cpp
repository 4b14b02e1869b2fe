// One worker of a parameter-server run: pull θ, then every step compute the gradient and
// push it, the servers answering with θ for the next step (one round trip per step). With
// overlap (cluster.overlap, run/setup.h: overlaps()) each shard's push leaves as soon as
// backward has finished that shard; on a GPU its gradient first lands in host memory piece by
// piece on the copy engine (GradStager), and the reply's pieces of θ go back to the GPU as they
// arrive, the next forward waiting for them on the device.
// Rules that average models (local:H, easgd) run worker/roles/local_worker.cpp's loop instead.
#include "byzantine.h"
#include "grad_accumulator.h"
#include "grad_stager.h"
#include "roles/local_worker.h"
#include "ps/client.h"
#include "role_context.h"
#include "run/setup.h"

namespace pslab {

namespace {

// A GPU's gradient copies to the host move at least this many floats (1 MiB: far above a
// copy's fixed cost, far below a shard).
constexpr std::size_t kStagedCopyFloats = std::size_t(1) << 18;

// Backward's progress -> the pushes of the shards it finished.
struct PushWhenReady final : GradListener {
  PsClient& client;
  explicit PushWhenReady(PsClient& c) : client(c) {}
  void ready(std::size_t lo) override { client.push_ready(lo); }
};

// With overlap, what backward tells as it goes: shards leave during backward (a slowed rank's
// as late as on a slower machine: Straggler::paced). On the CPU ∇θ is final when backward says
// so; on a GPU once its copy to the host has landed (GradStager).
struct OverlapChain {
  PushWhenReady push;
  GradStager stager;
  GradListener* listener = nullptr;  // what backward tells; nullptr without overlap
  OverlapChain(RoleContext& ctx, PsClient& client, bool on)
      : push(client), stager(ctx.backend(), ctx.replica().model().grads(), ctx.replica().host_grads(),
                             ctx.replica().model().num_params(), kStagedCopyFloats, push) {
    const bool gpu = ctx.backend().device() != Device::cpu;
    if (on) listener = ctx.straggler().paced(gpu ? static_cast<GradListener*>(&stager) : &push);
  }
};

// "asp over 2 server(s), tcp, pushes in f32, overlapped with backward": the worker's first line.
std::string how_it_pushes(const ExperimentConfig& cfg, RoleContext& ctx, std::size_t servers, bool overlap, bool gpu) {
  return cfg.cluster.mode + " over " + std::to_string(servers) + " server(s), " + ctx.transport().name() + ", pushes in " +
         cfg.cluster.codec +
         (overlap ? gpu ? ", overlapped with backward (gradients leave the GPU on its copy engine)" : ", overlapped with backward"
                  : "");
}
}  // namespace

void run_ps_worker(const ExperimentConfig& cfg, const RoleOptions& opt) {
  RoleContext ctx(cfg, opt, RoleKind::ps_worker);
  if (int(opt.servers.size()) != cfg.cluster.servers)
    throw std::invalid_argument(std::to_string(opt.servers.size()) + " server addresses given, cluster.servers = " +
                                std::to_string(cfg.cluster.servers));
  Replica& replica = ctx.replica();
  // Declared before the client, whose end waits for pushes sent from them uncopied (acc: train.accumulate).
  GradAccumulator acc(ctx.backend(), cfg.train.accumulate, replica.model().num_params());
  Byzantine byzantine(cfg, opt.rank);  // pushes garbage on purpose (byzantine.workers): whole, after backward
  PsClient client(ctx.transport(), opt.servers, client_options(cfg, wire::Role::worker, opt.rank, opt.backups));
  const bool overlap = overlaps(cfg, opt.procs_on_host) && !byzantine.on();
  const bool gpu = ctx.backend().device() != Device::cpu;
  ctx.announce(how_it_pushes(cfg, ctx, opt.servers.size(), overlap, gpu) + (byzantine.on() ? "; " + byzantine.describe() : ""));
  OverlapChain chain(ctx, client, overlap);
  GradListener* listener = chain.listener;

  const Mode& mode = cfg.mode();
  const WorkerProtocol proto = mode.worker_protocol();
  if (proto.kind != WorkerProtocol::Kind::gradient) {
    if (opt.resume)
      throw std::invalid_argument(cfg.cluster.mode + " keeps each worker's own θ and optimizer state on the worker, "
                                  "which checkpoints do not hold: a run in this mode cannot be resumed");
    client.connect();
    run_local_worker(ctx, client, proto, mode.update_batch(cfg.train.batch, cfg.cluster.workers));
    ctx.metrics().flush();
    return;
  }

  client.connect();  // the start barrier: returns when every worker has said Hello
  const int N = acc.batches();
  long first = 0;    // a resumed run goes on from the clock the servers hold for this worker
  if (opt.resume) {
    const ResumePoint r = client.catch_up();
    first = r.clock * N;
    std::fprintf(stderr, "[worker %d] resumed at step %ld%s\n", opt.rank, first,
                 r.lost_pushes ? (" (" + std::to_string(r.lost_pushes) + " push(es) some server never got were sent again empty)").c_str() : "");
    ctx.metrics().write({{"kind", "resumed"}, {"worker", opt.rank}, {"step", first}, {"lost_pushes", r.lost_pushes}});
  }
  PullResult pulled = client.pull(first / N, replica.host_params());
  replica.upload_params();
  // θ's pieces go back to the device as they arrive (a GPU; nothing to do on the CPU).
  if (gpu) client.on_params([&replica](std::size_t lo, std::size_t n) { replica.upload_params_async(lo, n); });

  const long steps = ctx.total_steps(), spe = ctx.steps_per_epoch();
  for (long step = first; step < steps; ++step) {
    const auto idx = ctx.batch(step);
    const bool last = step == steps - 1;
    const long clock = step / N;
    // Push, and pull θ for the next clock in the same round trip (none after the last step).
    if (listener) {
      client.begin_push(clock, int(idx.size()), replica.host_grads(), last ? nullptr : replica.host_params());
      chain.stager.start();
    }
    const auto t0 = ctx.clock().now();
    ctx.straggler().start_step(step);
    StepRecord rec;
    rec.loss = replica.compute_gradient(idx, -1.0f, listener);
    const bool due = acc.add(replica.model().grads(), double(idx.size()), last);
    const float* grad = !due || listener ? nullptr : N == 1 ? replica.download_grads() : acc.host_mean();
    ctx.backend().synchronize();
    rec.compute_s = ctx.clock().computed(t0, long(idx.size())) - ctx.straggler().paced_s();
    rec.delay_s = ctx.straggler().sleep_after(rec.compute_s);
    rec.samples = int(idx.size());
    rec.version = pulled.min_version;

    if (due) {
      const auto t1 = ctx.clock().now();
      int batch = int(acc.weight());
      if (!listener) grad = byzantine.corrupt(grad, replica.model().num_params(), step, batch);
      if (!listener) client.begin_push(clock, batch, grad, last ? nullptr : replica.host_params());
      pulled = client.finish_push();
      rec.comm_s = ctx.since(t1);
      rec.wait_s = last ? 0.0 : pulled.held_us * 1e-6;
      if (!last) replica.params_fence();  // the next forward waits (on the device) for θ's pieces
    }
    ctx.log().add(step, double(step + 1) / double(spe), rec, last || (step + 1) % spe == 0);
  }
  client.bye((steps + N - 1) / N);
  ctx.metrics().flush();
}

}  // namespace pslab
