#include "run/plan.h"

#include "comm/transport/transport.h"
#include "run/setup.h"

namespace pslab {

nlohmann::ordered_json run_plan(const ExperimentConfig& c) {
  const int W = c.cluster.workers, S = c.uses_servers() ? c.cluster.servers : 0;
  const long spe = steps_per_epoch(c, W);
  const long steps = total_steps(c, spe);
  nlohmann::ordered_json processes = nlohmann::ordered_json::array();
  for (int k = 0; k < S; ++k) processes.push_back({{"name", "server" + std::to_string(k)}, {"role", "server"}, {"rank", k}});
  if (c.cluster.replicas > 1)  // cluster.replicas = 2: shard k's backup, fed by server k
    for (int k = 0; k < S; ++k) processes.push_back({{"name", "backup" + std::to_string(k)}, {"role", "backup"}, {"rank", k}});
  for (int r = 0; r < W; ++r) processes.push_back({{"name", "worker" + std::to_string(r)}, {"role", "worker"}, {"rank", r}});
  processes.push_back({{"name", "evaluator"}, {"role", "evaluator"}, {"rank", -1}});
  return {{"name", c.name},
          {"mode", c.cluster.mode},
          {"uses_servers", c.uses_servers()},
          {"workers", W},
          {"servers", S},
          {"replicas", c.uses_servers() ? c.cluster.replicas : 0},
          {"transport", c.cluster.transport},
          {"addresses", comm::make_transport(c.cluster.transport)->address_scheme()},
          {"codec", c.cluster.codec},
          {"launcher", c.cluster.launcher},
          {"hosts", c.cluster.hosts},
          {"bind", c.cluster.bind},
          {"interface", c.cluster.interface},
          {"host_addresses", c.cluster.addresses},
          {"auth", c.cluster.auth},
          {"device", c.train.device},
          {"model_kind", c.model.kind},
          {"worker", {{"kind", c.worker.kind}, {"script", c.worker.script}, {"python", c.worker.python}}},
          {"collective", c.cluster.collective},
          {"mps", c.cluster.mps},
          {"seed", c.seed},
          {"batch", c.train.batch},
          {"accumulate", c.train.accumulate},
          {"global_batch", long(W) * c.train.batch * c.train.accumulate},  // samples behind one update of every worker
          {"data",
           {{"kind", c.data.kind},
            {"train_samples", train_set_size(c)},
            {"test_samples", test_set_size(c)},
            {"classification", data_shape(c).classification}}},
          {"params", c.model.kind == "external" && c.model.sizes.empty() ? 0 : count_params(model_spec(c))},  // (0: the script's, at launch)
          {"steps_per_epoch", spe},
          {"total_steps", steps},
          {"epochs", double(steps) / double(spe)},
          {"target_acc", c.eval.target_acc},
          {"eval_interval_s", c.eval.interval_s},
          {"timeout_s", c.cluster.timeout_s},
          {"heartbeat_s", c.cluster.heartbeat_s},
          {"ssh_alive_s", ssh_alive_window_s(c)},
          {"virtual",
           {{"compute_ms", c.virtual_cluster.compute_ms},
            {"latency_us", c.virtual_cluster.latency_us},
            {"bandwidth_gbps", c.virtual_cluster.bandwidth_gbps},
            {"apply_gbps", c.virtual_cluster.apply_gbps},
            {"allreduce_ms", c.virtual_cluster.allreduce_ms},
            {"allreduce_compute_ms", c.virtual_cluster.allreduce_compute_ms},
            {"startup_ms", c.virtual_cluster.startup_ms}}},
          {"on_worker_loss", continues_without_lost_workers(c) ? "continue" : "fail"},
          {"on_server_loss", restarts_lost_servers(c) ? "restart" : "fail"},
          {"processes", processes}};
}

}  // namespace pslab
