#include "run/config.h"

#include "comm/transport/transport.h"
#include "ps/codecs/codec.h"
#include "ps/modes/mode.h"
#include "run/setup.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <functional>
#include <set>
#include <cmath>
#include <sstream>
#include <type_traits>


namespace pslab {
namespace {

template <typename T>
struct is_vector : std::false_type {};
template <typename T>
struct is_vector<std::vector<T>> : std::true_type {};

// The one list of keys. f(key, field, description) is called for every field, in the order
// in which to_toml() writes them.
template <typename Config, typename F>
void visit_fields(Config& c, F&& f) {
  f("name", c.name, "experiment name: runs/<name>/ holds its runs");
  f("seed", c.seed, "seed of initialisation, shuffling and straggler delays");
  f("model.kind", c.model.kind, "the model (listed below)");
  f("model.hidden", c.model.hidden, "mlp: hidden layer widths");
  f("model.conv_channels", c.model.conv_channels, "cnn: channels of the 5x5 stride-2 convolutions");
  f("model.depth", c.model.depth, "resnet: layers, 6n + 2 for n basic blocks per stage (8, 20, 56, ...)");
  f("model.width", c.model.width, "resnet: channels of the first stage (the second has twice, the third four times)");
  f("model.init", c.model.init, "\"he\" (He/Xavier-uniform weights from the seed) or \"zeros\"");
  f("model.sizes", c.model.sizes, "external: its parameter tensors' sizes (floats), in the order of θ");
  f("model.theta_file", c.model.theta_file, "external: θ at initialisation, a file of P float32 values (\"\": zeros)");
  f("data.kind", c.data.kind, "the data set (listed below)");
  f("data.path", c.data.path, "fashion-mnist, cifar10, arrays: the directory of its files");
  f("data.normalize", c.data.normalize,
    "fashion-mnist, cifar10, arrays: standardise inputs with the training set's mean and std (fashion-mnist: 0.2860, "
    "0.3530)");
  f("data.train_samples", c.data.train_samples, "training samples used (0 = all; synthetic: 0 = 8192)");
  f("data.test_samples", c.data.test_samples, "test samples used (0 = all; synthetic: 0 = 2048)");
  f("data.dim", c.data.dim, "synthetic: input features");
  f("data.outputs", c.data.outputs, "synthetic: regression outputs or classes");
  f("data.augment", c.data.augment,
    "training images: \"none\", or \"crop-flip\" (a random crop of the image padded by data.augment_pad zeros, and a "
    "horizontal flip, half the time; each sample's draw from the seed, the epoch and the sample, on CPU and GPU alike)");
  f("data.augment_pad", c.data.augment_pad, "crop-flip: pixels of zeros padded on each side before the crop");
  f("optimizer.kind", c.optimizer.kind, "the optimizer (listed below)");
  f("optimizer.lr", c.optimizer.lr, "base learning rate");
  f("optimizer.momentum", c.optimizer.momentum, "momentum coefficient (momentum, nesterov, lars)");
  f("optimizer.trust", c.optimizer.trust, "lars: the trust coefficient of the layer-wise learning rate");
  f("optimizer.staleness_lr", c.optimizer.staleness_lr,
    "PS modes: the server divides each update's step by max(1, its staleness) (Zhang et al. 2016)");
  f("optimizer.weight_decay", c.optimizer.weight_decay, "L2 weight decay added to the gradient (lamb: to the update)");
  f("optimizer.beta1", c.optimizer.beta1, "adam, lamb: first-moment decay");
  f("optimizer.beta2", c.optimizer.beta2, "adam, lamb: second-moment decay");
  f("optimizer.eps", c.optimizer.eps, "adam, lamb: denominator epsilon");
  f("schedule.kind", c.schedule.kind, "\"constant\", \"step\" or \"cosine\" (over train.epochs)");
  f("schedule.warmup_epochs", c.schedule.warmup_epochs, "linear warmup length in epochs");
  f("schedule.warmup_start_factor", c.schedule.warmup_start_factor, "warmup starts at this fraction of the lr");
  f("schedule.milestones", c.schedule.milestones, "step: epochs at which the lr is multiplied by gamma");
  f("schedule.gamma", c.schedule.gamma, "step: decay factor");
  f("schedule.min_lr_factor", c.schedule.min_lr_factor, "cosine: final lr as a fraction of the lr");
  f("schedule.scale_lr", c.schedule.scale_lr,
    "linear scaling rule: lr *= update batch / base_batch (samples one update averages: W x batch x accumulate in "
    "allreduce, bsp, local:H; batch x accumulate in ssp, asp, dcasgd; batch in easgd)");
  f("schedule.base_batch", c.schedule.base_batch, "batch the base lr was tuned for");
  f("train.batch", c.train.batch, "samples per worker per step");
  f("train.accumulate", c.train.accumulate,
    "gradient accumulation: each update (push, all-reduce, optimizer step) is the mean over this many "
    "consecutive batches of a worker; the global batch is workers x batch x accumulate");
  f("train.epochs", c.train.epochs, "passes over the training set, all workers together");
  f("train.steps", c.train.steps, "if > 0: steps per worker, overriding epochs");
  f("train.device", c.train.device, "\"cpu\" or \"cuda\"");
  f("train.tf32", c.train.tf32, "cuda: let cuBLAS GEMMs use TF32 tensor cores (faster; 10-bit mantissa products)");
  f("train.cuda_graphs", c.train.cuda_graphs,
    "cuda: a step's forward and backward (and the optimizer's update where the worker owns θ: single, local:H, easgd) "
    "as one CUDA graph, replayed: \"auto\" (where it can be recorded; not where "
    "overlap downloads a gradient over 4 MiB during backward), \"on\" (every step of the run's batch size; a step "
    "that cannot be recorded is an error), \"off\"");
  f("train.threads", c.train.threads, "BLAS threads per process (0 = host cores / processes on it)");
  f("train.log_every", c.train.log_every, "steps between metric lines");
  f("cluster.mode", c.cluster.mode, "the consistency model (listed below)");
  f("cluster.workers", c.cluster.workers, "worker processes");
  f("cluster.servers", c.cluster.servers, "parameter servers (PS modes)");
  f("cluster.server_threads", c.cluster.server_threads,
    "threads a server splits a large update over (0 = host cores / processes on it; with train.device = \"cuda\" the "
    "servers share the cores the GPU processes leave, one each)");
  f("cluster.transport", c.cluster.transport, "how processes exchange messages (listed below)");
  f("cluster.codec", c.cluster.codec, "how pushes encode gradients (listed below)");
  f("cluster.pull_codec", c.cluster.pull_codec,
    "PS modes: how pull replies to workers encode θ: \"f32\", or \"f16\" / \"bf16\" (each value rounded; the "
    "servers keep f32 and the evaluator pulls f32)");
  f("cluster.error_feedback", c.cluster.error_feedback,
    "\"on\": a worker keeps what a lossy codec left out of a push and adds it to the next; \"off\"; \"auto\": on for "
    "the codecs that drop most of each push (topk, sign)");
  f("cluster.sync_every", c.cluster.sync_every,
    "easgd: each worker's local steps between its elastic exchanges with the servers' centre");
  f("cluster.overlap", c.cluster.overlap,
    "push (PS modes) or all-reduce (allreduce) each finished piece of the gradient while backward goes on; \"auto\": "
    "on for GPU workers of PS modes and GPU all-reduce through host memory (gradients leave the GPU on its copy engine "
    "as backward finishes them), on for CPU workers on a host with at least as many cores as processes (allreduce: "
    "on every rank's host), off otherwise; the virtual cluster runs steps whole (its time model has no overlap)");
  f("cluster.bucket_kb", c.cluster.bucket_kb, "allreduce with overlap: KiB of the gradient per all-reduce bucket");
  f("cluster.piece_kib", c.cluster.piece_kib,
    "PS modes: a shard's pushes and pull replies travel in pieces of at least this many KiB (at most 8 per shard), "
    "each checked and applied as it arrives while the next travels (0 = whole shards; pushes in codecs other than "
    "f32, and runs with lars or lamb, go whole)");
  f("cluster.collective", c.cluster.collective,
    "allreduce with train.device = \"cuda\": \"nccl\", \"gloo\" (through host memory) or \"auto\" "
    "(NCCL when no two ranks share a GPU)");
  f("cluster.mps", c.cluster.mps,
    "GPU runs of the local launcher: \"auto\" starts a CUDA MPS daemon of the run's own when two or more of its "
    "processes share a GPU (their kernels then run side by side instead of taking turns), \"on\" whenever it "
    "computes on GPUs, \"off\" never; where MPS cannot start the run goes on without it");
  f("cluster.launcher", c.cluster.launcher,
    "\"local\", \"ssh\", \"slurm\", or \"virtual\": every worker and server in one process in simulated time ([virtual])");
  f("cluster.hosts", c.cluster.hosts, "ssh: hosts as ssh names them ([user@]host), processes placed round-robin");
  f("cluster.bind", c.cluster.bind, "local launcher: address servers and the rendezvous listen on");
  f("cluster.interface", c.cluster.interface,
    "ssh, Slurm: the network interface (e.g. \"ib0\") or address every host listens and is reached on "
    "(default: ssh: the address ssh reached the host at; Slurm: the node's route to the launching node)");
  f("cluster.addresses", c.cluster.addresses,
    "ssh, Slurm: per host, \"HOST=ADDRESS\" or \"HOST=INTERFACE\" (over cluster.interface)");
  f("cluster.auth", c.cluster.auth,
    "\"curve\": every TCP peer proves the run's key (made by the launcher), messages encrypted; \"none\"; "
    "\"auto\": curve whenever a listener is a TCP port (loopback too), none when every one is a private Unix socket");
  f("cluster.timeout_s", c.cluster.timeout_s, "longest blocking wait before failing with the peer's name (s)");
  f("cluster.heartbeat_s", c.cluster.heartbeat_s,
    "a worker or all-reduce rank silent this long (heartbeats are sent meanwhile) is lost (s)");
  f("cluster.on_worker_loss", c.cluster.on_worker_loss,
    "PS modes: \"continue\" (the servers drop a lost worker and training goes on), \"fail\", or \"auto\": "
    "continue where the mode allows it (asp, ssp, dcasgd, easgd), else fail");
  f("cluster.reconnect_s", c.cluster.reconnect_s,
    "how long a link may be down and come back (s): a worker the servers dropped as silent that speaks again within it "
    "is taken back, and workers wait this long for a silent server; -1: auto, 0 on one host, 30 across hosts; 0: never");
  f("cluster.ssh_alive_s", c.cluster.ssh_alive_s,
    "ssh: how long the launcher and a process it started over ssh may go without hearing each other before the "
    "process is stopped on its host and the run fails (s); longer than cluster.reconnect_s; -1: auto, twice the "
    "reconnect window, at least 60");
  f("cluster.on_server_loss", c.cluster.on_server_loss,
    "PS modes: \"restart\" (the launcher restarts a server that died from its checkpoint; the workers rejoin it and "
    "the updates since are lost, counted), \"fail\", or \"auto\": restart for the modes that go on without a worker (asp, "
    "ssp, dcasgd, easgd) over tcp or ipc (not under Slurm or the virtual cluster), else fail");
  f("cluster.replicas", c.cluster.replicas,
    "PS modes: copies of each shard, 1 or 2; with 2 each server has a backup process (on another host where there is one) "
    "that has every update before the primary answers, and takes over with nothing lost when the primary dies "
    "(local and ssh launchers)");
  f("cluster.push_guard", c.cluster.push_guard,
    "PS modes: servers refuse (count, and take as an empty batch) a push with a batch beyond the plan's, a value that is "
    "not finite, or a norm over cluster.guard_norm_factor x the median of recent ones");
  f("cluster.guard_norm_factor", c.cluster.guard_norm_factor,
    "push guard: the norm bound, in medians of the last 64 accepted pushes' norms on a shard (from the 16th on), at a "
    "batch (train.batch x train.accumulate) of 32 or more; sqrt(32 / batch) times it for smaller ones, whose honest "
    "norms spike more (0: no bound)");
  f("cluster.guard_drop_after", c.cluster.guard_drop_after,
    "push guard: a worker refused this many times in a row is dropped, with that reason, where the run can go on "
    "without it (else its pushes go on being refused) (0: never)");
  f("worker.kind", c.worker.kind,
    "\"builtin\": pslab_worker trains model.kind; \"python\": worker.script does, for every worker and the "
    "evaluator (pslab.torch, docs/usage.md)");
  f("worker.script", c.worker.script, "python: the script the launcher runs (relative: to the config file's directory)");
  f("worker.python", c.worker.python, "python: the interpreter that runs worker.script (e.g. a virtualenv's python)");
  f("eval.interval_s", c.eval.interval_s, "evaluator period (s); one more evaluation at the end");
  f("eval.every_epochs", c.eval.every_epochs,
    "if > 0: evaluate each time training has applied this many more epochs (instead of every eval.interval_s), "
    "so every curve has as many points however fast the run");
  f("eval.batch", c.eval.batch, "evaluation batch (a model with batch norm: at least 256, the batch its statistics "
    "are measured in)");
  f("eval.target_acc", c.eval.target_acc, "accuracy for time_to_target_s in the summary");
  f("checkpoint.every_s", c.checkpoint.every_s,
    "checkpoints (s): PS servers write their shard this often and when they stop (0: only then); allreduce rank 0 "
    "writes θ and the optimizer's state this often and at the end (0: only at the end)");
  f("straggler.workers", c.straggler.workers, "ranks slowed down by straggler.slowdown");
  f("straggler.slowdown", c.straggler.slowdown, "compute of those ranks takes this many times as long");
  f("straggler.delay_ms", c.straggler.delay_ms, "fixed extra sleep per step, every worker (ms)");
  f("straggler.exp_delay_ms", c.straggler.exp_delay_ms, "extra sleep per step ~ Exp(mean), every worker (ms)");
  f("byzantine.workers", c.byzantine.workers,
    "PS modes that push gradients: ranks that push garbage on purpose (robustness experiments; cluster.push_guard)");
  f("byzantine.kind", c.byzantine.kind,
    "what they push instead of their gradient: \"nan\", \"noise\" (uniform in ±byzantine.scale), or \"batch\" "
    "(the gradient, claiming a batch of 2^31 - 1)");
  f("byzantine.scale", c.byzantine.scale, "\"noise\": its amplitude");
  f("virtual.compute_ms", c.virtual_cluster.compute_ms,
    "virtual cluster: a worker's forward + backward at train.batch (ms; 0: measured at start on this machine)");
  f("virtual.latency_us", c.virtual_cluster.latency_us, "virtual cluster: one message's latency, one way (us)");
  f("virtual.bandwidth_gbps", c.virtual_cluster.bandwidth_gbps, "virtual cluster: one link's bandwidth (GB/s)");
  f("virtual.apply_gbps", c.virtual_cluster.apply_gbps, "virtual cluster: a server's update rate (GB/s of its shard)");
  f("virtual.allreduce_ms", c.virtual_cluster.allreduce_ms,
    "virtual cluster: one all-reduce of the gradient (ms; 0: a ring over the links)");
  f("virtual.allreduce_compute_ms", c.virtual_cluster.allreduce_compute_ms,
    "virtual cluster: compute_ms in allreduce mode, where no servers share the cores (ms; 0: compute_ms)");
  f("virtual.startup_ms", c.virtual_cluster.startup_ms,
    "virtual cluster: time before the first step (connections, first-touch costs; calibrate measures it) (ms)");
  f("virtual.replay", c.virtual_cluster.replay,
    "virtual cluster: re-execute the recorded order of this run directory (launch.py replay sets it)");
}

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_same_v<T, AutoBool>) return "true, false or \"auto\"";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else if constexpr (std::is_integral_v<T>) return "an integer";
  else if constexpr (std::is_same_v<T, std::vector<int>>) return "a list of integers";
  else if constexpr (std::is_same_v<T, std::vector<double>>) return "a list of numbers";
  else return "a list of strings";
}

std::string number_text(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

std::string node_text(const toml::node& n) {
  std::ostringstream s;
  n.visit([&](const auto& v) { s << v; });
  std::string t = s.str();
  return t.size() > 60 ? t.substr(0, 57) + "..." : t;
}

// Compact text of a sweep value for run labels: bsp, 0.1, [32,16].
std::string label_text(const toml::node& n) {
  if (const auto* s = n.as_string()) return s->get();
  if (const auto* a = n.as_array()) {
    std::string t = "[";
    for (std::size_t i = 0; i < a->size(); ++i) {
      if (i) t += ',';
      t += label_text((*a)[i]);
    }
    return t + "]";
  }
  return node_text(n);
}

const char* node_type(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "a list";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

[[noreturn]] void fail(const std::string& origin, const std::string& key, const std::string& what) {
  throw ConfigError(origin + ": " + key + ": " + what);
}

// Reads one scalar of type T from `n`, or returns false.
template <typename T>
bool read_scalar(const toml::node& n, T& out) {
  if constexpr (std::is_same_v<T, std::string>) {
    if (!n.is_string()) return false;
    out = *n.value<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!n.is_boolean()) return false;
    out = *n.value<bool>();
  } else if constexpr (std::is_same_v<T, AutoBool>) {
    if (n.is_boolean()) out.value = *n.value<bool>() ? AutoBool::on : AutoBool::off;
    else if (n.is_string() && *n.value<std::string>() == "auto") out.value = AutoBool::automatic;
    else return false;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!n.is_number()) return false;
    out = T(*n.value<double>());
  } else {
    if (!n.is_integer()) return false;
    const std::int64_t v = *n.value<std::int64_t>();
    if (v < std::int64_t(std::numeric_limits<T>::min()) ||
        (v > 0 && std::uint64_t(v) > std::uint64_t(std::numeric_limits<T>::max())))
      return false;
    out = T(v);
  }
  return true;
}

// inf and nan are TOML numbers, but no key takes them.
template <typename T>
void check_finite(const T& x, const toml::node& n, const std::string& origin, const std::string& key) {
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(x)) fail(origin, key, "must be a finite number, got " + node_text(n));
}

template <typename T>
void read_field(const toml::node& n, T& out, const std::string& origin, const std::string& key) {
  auto wrong = [&] {
    fail(origin, key, std::string("expected ") + type_name<T>() + ", got " + node_type(n) + " (" +
                          node_text(n) + ")");
  };
  if constexpr (is_vector<T>::value) {
    const toml::array* a = n.as_array();
    if (!a) wrong();
    T v;
    for (const toml::node& e : *a) {
      typename T::value_type x{};
      if (!read_scalar(e, x)) wrong();
      check_finite(x, e, origin, key);
      v.push_back(x);
    }
    out = std::move(v);
  } else {
    if (!read_scalar(n, out)) wrong();
    check_finite(out, n, origin, key);
  }
}

// The table that holds `key` ("section.leaf" or "leaf"), created if missing; sets `leaf`.
// nullptr if the section exists but is not a table.
toml::table* table_of(toml::table& root, const std::string& key, std::string& leaf) {
  const auto dot = key.find('.');
  if (dot == std::string::npos) {
    leaf = key;
    return &root;
  }
  const std::string section = key.substr(0, dot);
  leaf = key.substr(dot + 1);
  if (!root.contains(section)) root.insert(section, toml::table{});
  return root[section].as_table();
}

template <typename T>
void write_field(toml::table& root, const std::string& key, const T& v) {
  std::string leaf;
  toml::table* t = table_of(root, key, leaf);
  if constexpr (is_vector<T>::value) {
    toml::array a;
    for (const auto& x : v) {
      if constexpr (std::is_same_v<typename T::value_type, int>) a.push_back(std::int64_t(x));
      else a.push_back(x);
    }
    t->insert_or_assign(leaf, std::move(a));
  } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    t->insert_or_assign(leaf, std::int64_t(v));
  } else if constexpr (std::is_same_v<T, AutoBool>) {
    if (v.is_auto()) t->insert_or_assign(leaf, "auto");
    else t->insert_or_assign(leaf, v.is_on());
  } else {
    t->insert_or_assign(leaf, v);
  }
}

std::set<std::string> known_keys() {
  std::set<std::string> keys;
  ExperimentConfig c;
  visit_fields(c, [&](const char* key, auto&, const char*) { keys.insert(key); });
  return keys;
}

// Edits between a and b: insertions, deletions, substitutions and swaps of neighbours (a typo's).
std::size_t typo_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The known key an unknown one most likely meant: one typo away (two in a name of more than 3
// letters), else the same name in other sections ("a.k or b.k"); "" when none.
std::string meant_key(const std::string& unknown, const std::set<std::string>& keys) {
  const auto leaf_of = [](const std::string& k) { return k.substr(k.find('.') == std::string::npos ? 0 : k.find('.') + 1); };
  const std::size_t allowed = leaf_of(unknown).size() > 3 ? 2 : 1;
  std::string best;
  std::size_t best_d = allowed + 1;
  for (const auto& k : keys)
    if (const std::size_t d = typo_distance(unknown, k); d < best_d) best = k, best_d = d;
  if (!best.empty()) return best;
  std::string elsewhere;
  for (const auto& k : keys)
    if (leaf_of(k) == leaf_of(unknown) && k != unknown) elsewhere += (elsewhere.empty() ? "" : " or ") + k;
  return elsewhere;
}

// Dotted paths of every value (non-table node) in `t`. A quoted key holding a dot ("train.batch"
// = 7) is refused: its path would read as a known key that the config never sets.
void leaf_paths(const toml::table& t, const std::string& prefix, std::vector<std::string>& out,
                const std::string& origin) {
  for (const auto& [k, v] : t) {
    const std::string path = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (k.str().find('.') != std::string_view::npos)
      fail(origin, path, "a quoted key with a dot in it is one key named \"" + std::string(k.str()) +
                             "\", not a key of a section: write it without the quotes");
    if (const toml::table* sub = v.as_table()) leaf_paths(*sub, path, out, origin);
    else out.push_back(path);
  }
}

toml::table parse_toml(const std::string& text, const std::string& origin) {
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream s;
    s << origin << ":" << e.source().begin.line << ":" << e.source().begin.column
      << ": not valid TOML: " << e.description();
    throw ConfigError(s.str());
  }
}

void apply_override(toml::table& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set " + assignment + ": expected section.key=value");
  const auto trimmed = [](std::string x) {  // ("train.batch = 32", as in a TOML file)
    x.erase(0, x.find_first_not_of(" \t"));
    x.erase(x.find_last_not_of(" \t") + 1);
    return x;
  };
  const std::string key = trimmed(assignment.substr(0, eq));
  const std::string value = trimmed(assignment.substr(eq + 1));
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};  // a bare word is a string: --set cluster.mode=bsp
  }
  std::string leaf;
  toml::table* t = table_of(root, key, leaf);
  if (!t) throw ConfigError("--set " + assignment + ": " + key.substr(0, key.find('.')) + " is not a table");
  t->insert_or_assign(leaf, *parsed["v"].node());
}

void check_unknown_keys(const toml::table& root, const std::string& origin) {
  const auto keys = known_keys();
  std::vector<std::string> paths;
  leaf_paths(root, "", paths, origin);
  for (const auto& p : paths) {
    if (keys.count(p)) continue;
    const std::string section = p.find('.') == std::string::npos ? "" : p.substr(0, p.find('.'));
    std::string known;
    for (const auto& k : keys)
      if ((section.empty() && k.find('.') == std::string::npos) ||
          (!section.empty() && k.rfind(section + ".", 0) == 0))
        known += (known.empty() ? "" : ", ") + k;
    const std::string meant = meant_key(p, keys);
    const bool top_level = !meant.empty() && meant.find('.') == std::string::npos;  // (TOML: before the first [section])
    fail(origin, p, "unknown key" + (meant.empty() ? std::string() : "; did you mean " + meant + "?") +
                        (top_level ? " (a key of no section goes before the first [section] header)" : "") +
                        (known.empty() ? std::string() : " (known here: " + known + ")"));
  }
}

ExperimentConfig from_table(const toml::table& root, const std::string& origin) {
  check_unknown_keys(root, origin);
  if (!root.contains("name"))
    fail(origin, "name", "missing; every experiment names its runs directory, e.g. name = \"my-experiment\"");
  ExperimentConfig c;
  visit_fields(c, [&](const char* key, auto& field, const char*) {
    if (const toml::node* n = root.at_path(key).node()) read_field(*n, field, origin, key);
  });
  validate(c, origin);
  return c;
}

}  // namespace

namespace {

// Checks of one config: check(ok, key, what) fails with "<origin>: <key>: <what>".
struct Checker {
  const ExperimentConfig& c;
  const std::string& origin;
  void operator()(bool ok, const char* key, const std::string& what) const {
    if (!ok) fail(origin, key, what);
  }
  // A seam's name through its registry (built-ins and whatever a test registered).
  template <typename Registry>
  void name(const Registry& registry, const std::string& name, const char* key) const {
    try {
      registry.check(name);
    } catch (const std::invalid_argument& e) {
      fail(origin, key, e.what());
    }
  }
};

void validate_model_and_data(const Checker& check) {
  const ExperimentConfig& c = check.c;
  check(!c.name.empty() && c.name.find('/') == std::string::npos && c.name != "." && c.name != "..", "name",
        "must be a non-empty name without '/', other than \".\" and \"..\" (it names a directory under --runs-dir)");
  check.name(model_registry(), c.model.kind, "model.kind");
  check(c.model.init == "he" || c.model.init == "zeros", "model.init", "expected \"he\" or \"zeros\", got \"" + c.model.init + "\"");
  for (int h : c.model.hidden) check(h > 0, "model.hidden", "widths must be > 0");
  for (int h : c.model.conv_channels) check(h > 0, "model.conv_channels", "channels must be > 0");
  check(c.model.depth >= 8 && (c.model.depth - 2) % 6 == 0, "model.depth",
        "must be 6n + 2 for n >= 1 blocks per stage (8, 14, 20, 32, 44, 56, 110)");
  check(c.model.width > 0, "model.width", "channels must be > 0");
  check(c.model.kind == "external" || c.model.sizes.empty(), "model.sizes", "only model.kind = \"external\" takes sizes");
  check(c.model.kind == "external" || c.model.theta_file.empty(), "model.theta_file",
        "only model.kind = \"external\" reads θ0 from a file");
  check(c.model.kind != "external" || !c.model.sizes.empty() || (c.worker.kind == "python" && c.model.theta_file.empty()),
        "model.sizes", "model.kind = \"external\" needs its parameter tensors' sizes, in θ's order (with worker.kind = "
        "\"python\" and no model.theta_file, the launcher asks worker.script for them and for θ0)");
  check.name(data_registry(), c.data.kind, "data.kind");
  check(c.data.kind != "external" || c.model.kind == "external", "data.kind",
        "\"external\" (data pslab does not read) needs model.kind = \"external\" (workers of your own that read it)");
  check(c.data.kind != "external" || c.data.train_samples > 0, "data.train_samples",
        "data.kind = \"external\" needs the number of training samples (the servers count epochs, the workers share them out)");
  check(c.data.kind != "least-squares" || c.model.kind == "linear", "model.kind",
        "data.kind = \"least-squares\" needs model.kind = \"linear\" (its known optimum is linear)");
  check(c.data.train_samples >= 0, "data.train_samples", "must be >= 0");
  check(c.data.test_samples >= 0, "data.test_samples", "must be >= 0");
  check(c.data.dim > 0, "data.dim", "must be > 0");
  check(c.data.outputs > 0, "data.outputs", "must be > 0");
  check(c.data.kind != "logistic" || c.data.outputs >= 2, "data.outputs", "logistic needs >= 2 classes");
  try {
    validate(c.optimizer);
    validate(c.schedule);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(check.origin + ": " + e.what());
  }
  check(c.data.augment == "none" || c.data.augment == "crop-flip", "data.augment",
        "expected \"none\" or \"crop-flip\", got \"" + c.data.augment + "\"");
  check(c.data.augment_pad >= 0 && c.data.augment_pad <= 64, "data.augment_pad", "must be in [0, 64]");
  try {  // what the model needs of its input (a cnn: images); an external one without sizes: the script's, at launch
    if (c.data.augment != "none" && c.data.kind != "external") {
      const DataShape d = data_shape(c);
      check(d.height > 1 && d.width > 1, "data.augment",
            "crops and flips need images; this data set's samples are " + std::to_string(d.channels) + "x" +
                std::to_string(d.height) + "x" + std::to_string(d.width));
    }
    if (c.model.kind != "external" || !c.model.sizes.empty()) build_layers(model_spec(c));
  } catch (const DataError& e) {  // (a data set read from disk: its files' headers)
    fail(check.origin, "data.path", e.what());
  } catch (const std::invalid_argument& e) {
    fail(check.origin, "model.kind", e.what());
  } catch (const std::bad_alloc&) {  // (model.depth, model.hidden, ... of a size that cannot be built)
    fail(check.origin, "model.kind", "the model \"" + c.model.kind + "\" is too large to build in memory");
  } catch (const std::length_error&) {
    fail(check.origin, "model.kind", "the model \"" + c.model.kind + "\" is too large to build in memory");
  }
}

// What the sizes allow: parameters and steps that fit their counters, a shard for every server,
// a batch no larger than a worker's share of the training set (the sampler clipped it, while the
// plan's global batch and schedule.scale_lr took it whole).
void validate_sizes(const Checker& check) {
  const ExperimentConfig& c = check.c;
  check(std::int64_t(c.cluster.workers) * c.train.batch * c.train.accumulate <= INT32_MAX, "train.batch",
        "cluster.workers x train.batch x train.accumulate must be at most 2^31 - 1");
  if (c.model.kind != "external" || !c.model.sizes.empty()) {
    const std::size_t params = count_params(model_spec(c));
    check(params <= (std::size_t(1) << 36), "model.kind",
          "the model has " + std::to_string(params) + " parameters: at most 2^36 (256 GiB of float32)");
    check(!c.uses_servers() || std::size_t(c.cluster.servers) <= params, "cluster.servers",
          std::to_string(c.cluster.servers) + " servers for " + std::to_string(params) +
              " parameters: some shards would hold none");
    const std::size_t layers = shard_layers(c).size();
    check(!c.uses_servers() || layers == 0 || std::size_t(c.cluster.servers) <= layers, "cluster.servers",
          std::to_string(c.cluster.servers) + " servers for a model of " + std::to_string(layers) +
              " layers: optimizer.kind = \"" + c.optimizer.kind + "\" takes a trust ratio per layer, so each " +
              "server holds whole layers");
  }
  std::size_t n = 0;
  try {
    n = train_set_size(c);
  } catch (const std::exception&) {
    return;  // (data not there: said when it is read, naming the file)
  }
  const std::size_t share = (n + c.cluster.workers - 1) / std::size_t(c.cluster.workers);
  check(n == 0 || std::size_t(c.train.batch) <= share, "train.batch",
        std::to_string(c.train.batch) + " is more than a worker's share of the training set (" + std::to_string(n) +
            " samples over " + std::to_string(c.cluster.workers) + " worker(s): " + std::to_string(share) + ")");
  const long spe = steps_per_epoch(c, c.cluster.workers);
  check(c.train.steps > 0 || c.train.epochs * double(spe) < 1e15, "train.epochs",
        "makes more than 10^15 steps (" + std::to_string(spe) + " per epoch)");
}

void validate_train(const Checker& check) {
  const ExperimentConfig& c = check.c;
  check(c.train.batch >= 1, "train.batch", "must be >= 1");
  check(c.train.accumulate >= 1, "train.accumulate", "must be >= 1");
  check(c.train.accumulate == 1 || !c.cluster.overlap.is_on(), "train.accumulate",
        "with cluster.overlap: a push or all-reduce goes once per accumulated update, not during each backward");
  check(c.train.epochs > 0 || c.train.steps > 0, "train.epochs", "must be > 0 (or set train.steps)");
  check(c.train.steps >= 0, "train.steps", "must be >= 0");
  check(c.train.device == "cpu" || c.train.device == "cuda", "train.device",
        "expected \"cpu\" or \"cuda\", got \"" + c.train.device + "\"");
  check(c.train.threads >= 0, "train.threads", "must be >= 0");
  check(c.train.log_every >= 1, "train.log_every", "must be >= 1");
  check(!c.train.tf32 || c.train.device == "cuda", "train.tf32", "TF32 is a GPU option: it needs train.device = \"cuda\"");
  check(c.train.cuda_graphs == "auto" || c.train.cuda_graphs == "on" || c.train.cuda_graphs == "off", "train.cuda_graphs",
        "expected \"auto\", \"on\" or \"off\", got \"" + c.train.cuda_graphs + "\"");
  check(c.train.cuda_graphs != "on" || c.train.device == "cuda", "train.cuda_graphs",
        "\"on\" records steps as CUDA graphs: it needs train.device = \"cuda\" (\"auto\" is off on the CPU)");
}

// The rendered value of `key` in `c` (for comparing a key with its default).
std::string value_of(const ExperimentConfig& c, const std::string& key) {
  std::string v;
  visit_fields(c, [&](const char* k, const auto& field, const char*) {
    if (k != key) return;
    toml::table t;
    write_field(t, "v", field);
    v = node_text(*t["v"].node());
  });
  return v;
}

// What the mode needs: its name, the keys only some modes read, and what its protocol allows.
void validate_mode(const Checker& check) {
  const ExperimentConfig& c = check.c;
  check.name(mode_registry(), c.cluster.mode, "cluster.mode");
  const Mode& mode = c.mode();
  const std::string in_mode = "cluster.mode = \"" + c.cluster.mode + "\"";
  const auto mine = mode.reads();
  for (const auto& e : mode_registry().entries())
    for (const Mode::Key& k : (e.takes_argument && e.example.empty() ? std::vector<Mode::Key>{}
                                                                      : mode_of(e.example_spec()).reads())) {  // every mode's mode-only keys
      const bool read = std::any_of(mine.begin(), mine.end(), [&](const Mode::Key& m) { return m.key == k.key; });
      check(read || value_of(c, k.key) == value_of(ExperimentConfig{}, k.key), k.key.c_str(),
            k.what + "; " + in_mode + " does not use it");
    }
  const WorkerProtocol::Kind kind = mode.worker_protocol().kind;
  const bool gradients = kind == WorkerProtocol::Kind::gradient || kind == WorkerProtocol::Kind::allreduce;
  check(c.train.accumulate == 1 || gradients, "train.accumulate",
        "accumulates gradients for a push; " + in_mode + " trains each worker's own model between pushes");
  check(!c.cluster.overlap.is_on() || gradients, "cluster.overlap",
        "overlaps gradient pushes with backward; " + in_mode + " pushes changes of the model after local steps");
  const bool servers = mode.uses_servers();
  check(servers || c.cluster.codec == "f32" || c.cluster.codec == "f16" || c.cluster.codec == "bf16", "cluster.codec",
        "allreduce all-reduces the gradient in \"f32\", \"f16\" or \"bf16\"; \"" + c.cluster.codec + "\" is a codec for PS pushes");
  check(c.cluster.pull_codec == "f32" || servers, "cluster.pull_codec",
        "encodes the servers' pull replies: " + in_mode + " has no servers (cluster.codec sets its wire)");
  check(servers || c.cluster.error_feedback != "on", "cluster.error_feedback",
        "keeps what a lossy push codec left out for the next push: PS modes only");
  check(!c.optimizer.staleness_lr || servers, "optimizer.staleness_lr",
        "divides a server's update by its staleness: " + in_mode + " has no servers");
}

void validate_cluster(const Checker& check) {
  const ExperimentConfig& c = check.c;
  check.name(comm::transport_registry(), c.cluster.transport, "cluster.transport");
  check.name(codec_registry(), c.cluster.codec, "cluster.codec");
  check(c.cluster.pull_codec == "f32" || c.cluster.pull_codec == "f16" || c.cluster.pull_codec == "bf16",
        "cluster.pull_codec", "expected \"f32\", \"f16\" or \"bf16\" (a pull carries θ itself: codecs that drop or "
                              "share precision between values are for gradients), got \"" + c.cluster.pull_codec + "\"");
  check(c.cluster.error_feedback == "auto" || c.cluster.error_feedback == "on" || c.cluster.error_feedback == "off",
        "cluster.error_feedback", "expected \"auto\", \"on\" or \"off\", got \"" + c.cluster.error_feedback + "\"");
  check(c.cluster.workers >= 1, "cluster.workers", "must be >= 1");
  check(c.cluster.servers >= 1, "cluster.servers", "must be >= 1");
  check(c.cluster.server_threads >= 0, "cluster.server_threads", "must be >= 0");
  check(c.cluster.sync_every >= 1, "cluster.sync_every", "must be >= 1");
  check(c.cluster.bucket_kb >= 1, "cluster.bucket_kb", "must be >= 1");
  check(c.cluster.piece_kib >= 0, "cluster.piece_kib", "must be >= 0 (0: whole shards)");
  check(!c.cluster.overlap.is_on() || c.train.device == "cpu" || c.cluster.mode != "allreduce" ||
            c.cluster.collective != "nccl",
        "cluster.overlap", "GPU ranks overlap an all-reduce through host memory only: NCCL's does not overlap yet (set "
                           "it false or \"auto\", or cluster.collective = \"gloo\")");
  check(c.cluster.mps == "auto" || c.cluster.mps == "on" || c.cluster.mps == "off", "cluster.mps",
        "expected \"auto\", \"on\" or \"off\", got \"" + c.cluster.mps + "\"");
  check(c.cluster.collective == "auto" || c.cluster.collective == "nccl" || c.cluster.collective == "gloo",
        "cluster.collective", "expected \"auto\", \"nccl\" or \"gloo\", got \"" + c.cluster.collective + "\"");
  check(c.cluster.collective != "nccl" || c.train.device == "cuda", "cluster.collective",
        "\"nccl\" all-reduces GPU buffers: it needs train.device = \"cuda\" (CPU workers use Gloo or shm)");
  check(c.cluster.auth == "auto" || c.cluster.auth == "curve" || c.cluster.auth == "none", "cluster.auth",
        "expected \"auto\", \"curve\" or \"none\", got \"" + c.cluster.auth + "\"");
  constexpr double kLongest = 1e7;  // seconds (115 days): longer waits overflow clocks counting nanoseconds
  check(c.cluster.timeout_s > 0 && c.cluster.timeout_s <= kLongest, "cluster.timeout_s", "must be in (0, 1e7]");
  check(c.cluster.heartbeat_s >= 0.05 && c.cluster.heartbeat_s <= kLongest, "cluster.heartbeat_s",
        "must be in [0.05, 1e7] (a client beats at most every 10 ms)");
  check((c.cluster.reconnect_s >= 0 && c.cluster.reconnect_s <= kLongest) || c.cluster.reconnect_s == -1,
        "cluster.reconnect_s", "must be in [0, 1e7], or -1 (auto)");
  check((c.cluster.ssh_alive_s >= 1 && c.cluster.ssh_alive_s <= kLongest) || c.cluster.ssh_alive_s == -1,
        "cluster.ssh_alive_s", "must be in [1, 1e7], or -1 (auto)");
  check(c.cluster.launcher != "ssh" || c.cluster.ssh_alive_s < 0 || c.cluster.ssh_alive_s > reconnect_window_s(c),
        "cluster.ssh_alive_s",
        "must be longer than the reconnect window (cluster.reconnect_s: " + number_text(reconnect_window_s(c)) +
            " s here): a link down for less must lose nothing");
  check(c.cluster.guard_norm_factor == 0 || c.cluster.guard_norm_factor >= 1, "cluster.guard_norm_factor",
        "must be 0 (no norm bound) or >= 1 (a bound below the median would refuse honest pushes)");
  check(c.cluster.guard_drop_after >= 0, "cluster.guard_drop_after", "must be >= 0");
}

void validate_placement(const Checker& check) {
  const ExperimentConfig& c = check.c;
  check(c.cluster.launcher == "local" || c.cluster.launcher == "ssh" || c.cluster.launcher == "slurm" ||
            c.cluster.launcher == "virtual",
        "cluster.launcher", "expected \"local\", \"ssh\", \"slurm\" or \"virtual\", got \"" + c.cluster.launcher + "\"");
  check(c.cluster.launcher != "virtual" || c.train.device == "cpu", "cluster.launcher",
        "the virtual cluster computes on the CPU: set train.device = \"cpu\"");
  check(c.cluster.launcher != "virtual" || !c.cluster.overlap.is_on(), "cluster.overlap",
        "the virtual cluster runs each step whole (its time model has no overlap): set it \"auto\" or false");
  check(c.cluster.launcher != "ssh" || !c.cluster.hosts.empty(), "cluster.hosts", "cluster.launcher = \"ssh\" needs at least one host");
  const bool here = c.cluster.launcher == "local";  // (every process on this machine; the virtual cluster ignores placement)
  check(!here || c.cluster.hosts.empty(), "cluster.hosts",
        "names the hosts of the ssh or Slurm launcher; with cluster.launcher = \"" + c.cluster.launcher +
            "\" every process runs on this machine (set cluster.launcher = \"ssh\")");
  check(!here || c.cluster.interface.empty(), "cluster.interface",
        "is for the ssh or Slurm launcher; with cluster.launcher = \"" + c.cluster.launcher + "\", cluster.bind");
  check(!here || c.cluster.addresses.empty(), "cluster.addresses",
        "is for the ssh or Slurm launcher; with cluster.launcher = \"" + c.cluster.launcher + "\", cluster.bind");
  for (const auto& h : c.cluster.hosts)  // (ssh would take "-oProxyCommand=..." as an option, and run it here)
    check(!h.empty() && h[0] != '-' && h.find_first_of(" \t\r\n'\"`$;|&<>\\") == std::string::npos, "cluster.hosts",
          "entries are host names as ssh takes them ([user@]host), got \"" + h + "\"");
  check(c.cluster.launcher == "local" || c.cluster.launcher == "virtual" || c.cluster.bind == "127.0.0.1", "cluster.bind",
        "is the local launcher's address; with cluster.launcher = \"" + c.cluster.launcher +
            "\" each host listens on its own address: name it with cluster.interface or cluster.addresses");
  for (const auto& a : c.cluster.addresses) {
    const auto eq = a.find('=');
    check(eq != std::string::npos && eq > 0 && eq + 1 < a.size() && a.find_first_of(" \t,") == std::string::npos,
          "cluster.addresses", "expected entries \"HOST=ADDRESS\" or \"HOST=INTERFACE\", got \"" + a + "\"");
  }
  check(c.cluster.interface.find_first_of(" \t,=") == std::string::npos, "cluster.interface",
        "expected an interface name or an address, got \"" + c.cluster.interface + "\"");
  const VirtualConfig& v = c.virtual_cluster;
  check(v.compute_ms >= 0, "virtual.compute_ms", "must be >= 0");
  check(v.latency_us >= 0, "virtual.latency_us", "must be >= 0");
  check(v.bandwidth_gbps > 0, "virtual.bandwidth_gbps", "must be > 0");
  check(v.apply_gbps > 0, "virtual.apply_gbps", "must be > 0");
  check(v.allreduce_ms >= 0, "virtual.allreduce_ms", "must be >= 0");
  check(v.allreduce_compute_ms >= 0, "virtual.allreduce_compute_ms", "must be >= 0");
  check(v.startup_ms >= 0, "virtual.startup_ms", "must be >= 0");
}

void validate_failures(const Checker& check) {
  const ExperimentConfig& c = check.c;
  const bool trains_on = c.mode().uses_servers() && c.mode().trains_without_lost_workers();
  check(c.cluster.on_worker_loss == "auto" || c.cluster.on_worker_loss == "continue" || c.cluster.on_worker_loss == "fail",
        "cluster.on_worker_loss", "expected \"auto\", \"continue\" or \"fail\", got \"" + c.cluster.on_worker_loss + "\"");
  check(c.cluster.on_worker_loss != "continue" || trains_on, "cluster.on_worker_loss",
        "\"continue\" needs a mode that trains on without a lost worker (asp, ssp:s, dcasgd, easgd); cluster.mode = \"" + c.cluster.mode +
            "\" needs every worker" + (c.uses_servers() ? " each clock" : " in every all-reduce"));
  check(c.cluster.on_server_loss == "auto" || c.cluster.on_server_loss == "restart" || c.cluster.on_server_loss == "fail",
        "cluster.on_server_loss", "expected \"auto\", \"restart\" or \"fail\", got \"" + c.cluster.on_server_loss + "\"");
  check(c.cluster.replicas == 1 || c.cluster.replicas == 2, "cluster.replicas", "must be 1 or 2");
  check(c.cluster.replicas == 1 || c.uses_servers(), "cluster.replicas",
        "2 needs a parameter-server mode (cluster.mode = \"" + c.cluster.mode + "\" has no servers)");
  check(c.cluster.replicas == 1 || c.cluster.launcher != "virtual", "cluster.replicas",
        "2 needs real processes (cluster.launcher = \"local\", \"ssh\" or \"slurm\"; the virtual cluster has one copy)");
  check(c.cluster.replicas == 1 || c.cluster.launcher != "slurm", "cluster.replicas",
        "2 needs the local or ssh launcher: under Slurm, srun ends the whole step when one task dies, so a backup "
        "could not take over");
  check(c.cluster.replicas == 1 || c.cluster.on_server_loss != "restart", "cluster.replicas",
        "2 replaces restarts: a backup takes over from a server that died; set cluster.on_server_loss = \"auto\"");
  if (c.cluster.on_server_loss != "restart") return;
  check(trains_on, "cluster.on_server_loss",
        "\"restart\" needs a mode that trains on when updates are lost (asp, ssp:s, dcasgd, easgd); cluster.mode = \"" + c.cluster.mode +
            "\" does not");
  check(c.cluster.launcher != "slurm", "cluster.on_server_loss",
        "\"restart\" needs the local or ssh launcher (under Slurm, srun owns the tasks)");
  check(c.cluster.transport == "tcp" || c.cluster.transport == "ipc", "cluster.on_server_loss",
        "\"restart\" needs cluster.transport = \"tcp\" or \"ipc\" (over shm, a worker's gradient lent to a "
        "server that died is never given back); got \"" + c.cluster.transport + "\"");
}

void validate_eval_and_straggler(const Checker& check) {
  const ExperimentConfig& c = check.c;
  check(c.eval.interval_s > 0, "eval.interval_s", "must be > 0");
  check(c.eval.every_epochs >= 0, "eval.every_epochs", "must be >= 0");
  check(c.checkpoint.every_s >= 0, "checkpoint.every_s", "must be >= 0");
  check(c.eval.batch >= 1, "eval.batch", "must be >= 1");
  check(c.eval.target_acc >= 0 && c.eval.target_acc <= 1, "eval.target_acc", "must be in [0, 1]");
  for (int w : c.straggler.workers)
    check(w >= 0 && w < c.cluster.workers, "straggler.workers",
          "rank " + std::to_string(w) + " is not a worker (cluster.workers = " + std::to_string(c.cluster.workers) + ")");
  check(c.straggler.slowdown >= 1, "straggler.slowdown", "must be >= 1");
  for (int w : c.byzantine.workers)
    check(w >= 0 && w < c.cluster.workers, "byzantine.workers",
          "rank " + std::to_string(w) + " is not a worker (cluster.workers = " + std::to_string(c.cluster.workers) + ")");
  check(c.byzantine.kind == "nan" || c.byzantine.kind == "noise" || c.byzantine.kind == "batch", "byzantine.kind",
        "expected \"nan\", \"noise\" or \"batch\", got \"" + c.byzantine.kind + "\"");
  check(c.byzantine.scale > 0, "byzantine.scale", "must be > 0");
  check(c.byzantine.workers.empty() ||
            (c.uses_servers() && c.mode().worker_protocol().kind == WorkerProtocol::Kind::gradient),
        "byzantine.workers", "needs a parameter-server mode whose workers push gradients (bsp, ssp, asp, dcasgd); "
                             "cluster.mode = \"" + c.cluster.mode + "\"");
  check(c.straggler.delay_ms >= 0, "straggler.delay_ms", "must be >= 0");
  check(c.straggler.exp_delay_ms >= 0, "straggler.exp_delay_ms", "must be >= 0");
}

}  // namespace

// Workers of the user's own (worker.kind = "python"): a script, servers to push to, real processes.
void validate_worker(const Checker& check) {
  const ExperimentConfig& c = check.c;
  const std::string& kind = c.worker.kind;
  check(kind == "builtin" || kind == "python", "worker.kind", "expected \"builtin\" or \"python\", got \"" + kind + "\"");
  if (kind == "builtin") {
    check(c.worker.script.empty(), "worker.script", "only worker.kind = \"python\" runs a script");
    return;
  }
  check(!c.worker.script.empty(), "worker.script", "worker.kind = \"python\" needs the script its workers run");
  check(!c.worker.python.empty(), "worker.python", "the interpreter must be named");
  check(c.uses_servers(), "worker.kind",
        "\"python\" workers talk to parameter servers (libpslab_client.so); cluster.mode = \"allreduce\" has none");
  check(c.cluster.launcher != "virtual", "worker.kind",
        "\"python\" workers are real processes; the virtual cluster simulates pslab_worker's model alone");
  check(c.byzantine.workers.empty(), "byzantine.workers",
        "pushing garbage on purpose is pslab_worker's; \"python\" workers push what they computed");
}

void validate(const ExperimentConfig& c, const std::string& origin) {
  const Checker check{c, origin};
  validate_model_and_data(check);
  validate_train(check);
  validate_cluster(check);
  validate_mode(check);
  validate_placement(check);
  validate_failures(check);
  validate_eval_and_straggler(check);
  validate_worker(check);
  validate_sizes(check);
}

bool restarts_lost_servers(const ExperimentConfig& c) {
  if (c.cluster.replicas > 1) return false;  // its backup takes over instead
  if (c.cluster.on_server_loss == "fail" || !c.uses_servers() || c.cluster.launcher == "slurm" ||
      c.cluster.launcher == "virtual")  // (no process to restart)
    return false;
  if (c.cluster.transport != "tcp" && c.cluster.transport != "ipc") return false;  // shm, auto (shm on one host)
  return c.mode().trains_without_lost_workers();
}

double reconnect_window_s(const ExperimentConfig& c) {
  if (c.cluster.reconnect_s >= 0) return c.cluster.reconnect_s;
  const std::set<std::string> hosts(c.cluster.hosts.begin(), c.cluster.hosts.end());
  const bool across_hosts = c.cluster.launcher == "slurm" || (c.cluster.launcher == "ssh" && hosts.size() > 1);
  return across_hosts ? 30.0 : 0.0;
}

double ssh_alive_window_s(const ExperimentConfig& c) {
  if (c.cluster.ssh_alive_s > 0) return c.cluster.ssh_alive_s;
  return std::max(60.0, 2 * reconnect_window_s(c));
}

bool uses_error_feedback(const ExperimentConfig& c) {
  if (c.cluster.error_feedback != "auto") return c.cluster.error_feedback == "on";
  return make_codec(c.cluster.codec)->wants_error_feedback();
}

bool continues_without_lost_workers(const ExperimentConfig& c) {
  if (c.cluster.on_worker_loss == "fail" || !c.uses_servers()) return false;
  return c.mode().trains_without_lost_workers();
}

const Mode& ExperimentConfig::mode() const { return mode_of(cluster.mode); }

namespace {

// Runs fn(); an error it throws about a key that an override set names the override too
// ("run.toml (with --set optimizer.lr=inf): optimizer.lr: ..."), not the file alone.
template <typename F>
auto naming_overrides(const std::string& origin, const std::vector<std::string>& overrides, F fn) {
  try {
    return fn();
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    for (const auto& o : overrides) {
      const auto at = m.find(": " + o.substr(0, o.find('=')) + ": ");
      if (m.rfind(origin, 0) == 0 && at != std::string::npos && at >= origin.size())
        throw ConfigError(m.substr(0, at) + " (with --set " + o + ")" + m.substr(at));
    }
    throw;
  }
}

}  // namespace

ExperimentConfig parse_config(const std::string& text, const std::string& origin,
                              const std::vector<std::string>& overrides) {
  toml::table root = parse_toml(text, origin);
  for (const auto& o : overrides) apply_override(root, o);
  return naming_overrides(origin, overrides, [&] { return from_table(root, origin); });
}

ExperimentConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open the config file");
  std::stringstream s;
  s << in.rdbuf();
  return parse_config(s.str(), path, overrides);
}

std::string to_toml(const ExperimentConfig& c) {
  toml::table root;
  visit_fields(c, [&](const char* key, const auto& field, const char*) { write_field(root, key, field); });
  std::ostringstream s;
  s << "# pslab experiment config, every key with its value (defaults included)\n" << root << "\n";
  return s.str();
}

std::string to_json(const ExperimentConfig& c) {
  toml::table root;
  visit_fields(c, [&](const char* key, const auto& field, const char*) { write_field(root, key, field); });
  std::ostringstream s;
  s << toml::json_formatter{root};
  return s.str();
}

std::uint64_t config_fingerprint(const ExperimentConfig& c) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : to_toml(c)) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

std::string describe_keys() {
  constexpr std::size_t key_width = 26;
  ExperimentConfig c;
  std::ostringstream s;
  visit_fields(c, [&](const char* key, const auto& field, const char* doc) {
    using T = std::decay_t<decltype(field)>;
    toml::table t;
    write_field(t, "v", field);
    s << key << std::string(key_width - std::min(key_width, std::strlen(key)), ' ') << " = "
      << node_text(*t["v"].node()) << "\n      " << type_name<T>() << ": " << doc << "\n";
  });
  // What each seam has registered (ps/modes/, ps/codecs/, comm/transport/).
  auto list = [&](const char* key, const auto& registry, const char* more) {
    s << "\n" << key << " takes:\n";
    constexpr std::size_t width = 16;  // the longest usage, "dcasgd:<lambda>", and a space
    for (const auto& e : registry.entries())
      s << "  " << e.usage << std::string(width - std::min(width - 1, e.usage.size()), ' ') << e.help << "\n";
    if (*more) s << "  " << more << "\n";
  };
  list("model.kind", model_registry(), "");
  list("data.kind", data_registry(), "");
  list("optimizer.kind", optimizer_registry(), "");
  list("cluster.mode", mode_registry(), "");
  list("cluster.codec", codec_registry(), "");
  list("cluster.transport", comm::transport_registry(), "");
  return s.str();
}

namespace {

// dst's values replaced by src's, table by table (src's tables merge into dst's).
void merge_into(toml::table& dst, const toml::table& src) {
  for (const auto& [k, v] : src) {
    toml::node* d = dst.get(k);
    if (v.is_table() && d && d->is_table()) merge_into(*d->as_table(), *v.as_table());
    else dst.insert_or_assign(k, v);
  }
}

// A config's [[variant]] tables: (name, the values it sets), in order; none: one unnamed variant.
// Takes them out of `root`.
std::vector<std::pair<std::string, toml::table>> take_variants(toml::table& root, const std::string& origin) {
  std::vector<std::pair<std::string, toml::table>> out;
  const toml::node* n = root.get("variant");
  if (!n) return {{"", toml::table{}}};
  const toml::array* a = n->as_array();
  if (!a || a->empty() || !a->is_array_of_tables())
    fail(origin, "variant", "expected [[variant]] tables, each with name = \"...\" and the keys it sets");
  for (const toml::node& t : *a) {
    toml::table values = *t.as_table();
    const auto name = values["name"].value<std::string>();
    if (!name || name->empty())
      fail(origin, "variant", "every [[variant]] needs name = \"...\" (it names the run)");
    for (const auto& [seen, _] : out)
      if (seen == *name) fail(origin, "variant", "two variants are named \"" + *name + "\"");
    values.erase("name");
    check_unknown_keys(values, origin + " [variant " + *name + "]");
    out.emplace_back(*name, std::move(values));
  }
  root.erase("variant");
  return out;
}

// How a run's label names `key`: by its last part (workers), unless a key declared before it ends
// the same way (cluster.workers, then straggler.workers): then whole. The summaries read
// "workers=", "batch=", "accumulate=" and "seed=" as what sets the global batch and the seed.
std::string label_name(const std::string& key) {
  const std::string leaf = key.substr(key.find('.') + 1);
  bool earlier = false, found = false;
  ExperimentConfig c;
  visit_fields(c, [&](const char* k, auto&, const char*) {
    if (found || k == key) {
      found = true;
      return;
    }
    const std::string other = k;
    earlier = earlier || other.substr(other.find('.') + 1) == leaf;
  });
  return earlier ? key : leaf;
}

// Keys naming a file that every process, on any host and from any directory, must find: a relative
// path in the config file (its tables, a variant, a sweep) is relative to the file's directory,
// made absolute in each point (whose file is written elsewhere).
void files_beside(toml::table& point, const std::string& origin) {
  if (!std::filesystem::is_regular_file(origin)) return;  // (a config given as text)
  const auto dir = std::filesystem::absolute(origin).parent_path();
  for (const auto& [section, leaf] : {std::pair{"worker", "script"}, std::pair{"model", "theta_file"}}) {
    toml::table* t = point[section].as_table();
    const auto* v = t ? t->get_as<std::string>(leaf) : nullptr;
    if (v && !v->get().empty() && std::filesystem::path(v->get()).is_relative())
      t->insert_or_assign(leaf, (dir / v->get()).lexically_normal().string());
  }
}

// Every point of the sweep in `config` (see expand_sweep): each variant crossed with the swept
// keys; --set `overrides` have the last word over both.
std::vector<std::string> expand_points(const toml::table& config, const std::string& origin,
                                       std::vector<std::string>& labels, const std::vector<std::string>& overrides) {
  toml::table root = config;
  const auto variants = take_variants(root, origin);
  check_unknown_keys(root, origin);
  // Axes: keys whose value is a list where one value is expected.
  std::vector<std::pair<std::string, const toml::array*>> axes;
  ExperimentConfig c;
  visit_fields(c, [&](const char* key, auto& field, const char*) {
    using T = std::decay_t<decltype(field)>;
    const toml::node* n = root.at_path(key).node();
    if (!n || !n->is_array()) return;
    const toml::array& a = *n->as_array();
    const bool sweep = is_vector<T>::value ? (!a.empty() && a[0].is_array()) : true;
    if (!sweep) return;
    if (a.empty()) fail(origin, key, "an empty list sweeps over nothing");
    axes.emplace_back(key, &a);
  });
  std::vector<std::string> out;
  labels.clear();
  for (const auto& [name, values] : variants) {
    std::vector<std::pair<std::string, const toml::array*>> swept;
    for (const auto& axis : axes)
      if (!values.at_path(axis.first)) swept.push_back(axis);  // a key the variant sets is not swept
    std::vector<std::size_t> idx(swept.size(), 0);
    while (true) {
      toml::table point = root;
      std::string label = name.empty() ? std::string() : "variant=" + name;
      for (std::size_t i = 0; i < swept.size(); ++i) {
        const auto& [key, arr] = swept[i];
        const toml::node& v = (*arr)[idx[i]];
        std::string leaf;
        table_of(point, key, leaf)->insert_or_assign(leaf, v);
        if (!label.empty()) label += ',';
        label.append(label_name(key)).append("=").append(label_text(v));
      }
      merge_into(point, values);
      for (const auto& o : overrides)  // root has them already; they replace what the variant set
        if (values.at_path(o.substr(0, o.find('=')))) apply_override(point, o);
      files_beside(point, origin);
      std::string where = origin;
      if (!label.empty()) where.append(" [").append(label).append("]");
      from_table(point, where);  // validate each point
      std::ostringstream s;
      s << point << "\n";
      out.push_back(s.str());
      labels.push_back(label);
      std::size_t i = swept.size();
      while (i > 0 && ++idx[i - 1] == swept[i - 1].second->size()) idx[--i] = 0;
      if (i == 0) break;
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_sweep(const std::string& text, const std::string& origin,
                                      std::vector<std::string>& labels, const std::vector<std::string>& overrides) {
  toml::table root = parse_toml(text, origin);
  for (const auto& o : overrides) apply_override(root, o);
  return naming_overrides(origin, overrides, [&] { return expand_points(root, origin, labels, overrides); });
}

}  // namespace pslab
