// Config parsing: errors name the file and the key; defaults are written back; sweeps expand.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/optimizer.h"
#include "run/config.h"
#include "run/metrics.h"
#include "run/plan.h"
#include "run/setup.h"

using namespace pslab;

namespace {

std::string error_of(const std::string& toml, std::vector<std::string> overrides = {}) {
  try {
    parse_config(toml, "exp.toml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Config, MinimalFileGetsTheDefaults) {
  const ExperimentConfig c = parse_config("name = \"x\"\n", "exp.toml");
  EXPECT_EQ(c.name, "x");
  EXPECT_EQ(c.model.kind, "mlp");
  EXPECT_EQ(c.model.hidden, (std::vector<int>{256, 128}));
  EXPECT_EQ(c.train.batch, 64);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.1);
  EXPECT_EQ(c.cluster.mode, "bsp");
  EXPECT_TRUE(c.uses_servers());
}

TEST(Config, MissingRequiredKeyIsNamed) {
  EXPECT_EQ(error_of("[train]\nbatch = 32\n"),
            "exp.toml: name: missing; every experiment names its runs directory, e.g. name = \"my-experiment\"");
}

TEST(Config, WrongTypeNamesKeyExpectedAndFound) {
  EXPECT_EQ(error_of("name = \"x\"\n[train]\nbatch = \"64\"\n"),
            "exp.toml: train.batch: expected an integer, got a string ('64')");
  EXPECT_EQ(error_of("name = \"x\"\n[model]\nhidden = [256, \"a\"]\n"),
            "exp.toml: model.hidden: expected a list of integers, got a list ([ 256, 'a' ])");
  EXPECT_NE(error_of("name = \"x\"\n[train]\nbatch = 3000000000000\n").find("train.batch: expected an integer"),
            std::string::npos);
}

TEST(Config, SyncEveryAndOverlapAreRefusedWhereTheModeDoesNotUseThem) {
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nmode = \"asp\"\nsync_every = 4\n"),
            "exp.toml: cluster.sync_every: is the elastic exchange period of easgd; cluster.mode = \"asp\" does not use it");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nmode = \"local:4\"\nsync_every = 4\n"),
            "exp.toml: cluster.sync_every: is the elastic exchange period of easgd; cluster.mode = \"local:4\" does not use it");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nmode = \"easgd:0.2\"\nsync_every = 0\n"),
            "exp.toml: cluster.sync_every: must be >= 1");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nmode = \"easgd:0.2\"\noverlap = true\n"),
            "exp.toml: cluster.overlap: overlaps gradient pushes with backward; cluster.mode = \"easgd:0.2\" pushes "
            "changes of the model after local steps");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nmode = \"easgd:0.2\"\nsync_every = 4\n"), "(no error)");
  // The virtual cluster's time model runs a step whole: overlap there raced its scheduler.
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nmode = \"allreduce\"\nlauncher = \"virtual\"\noverlap = true\n"),
            "exp.toml: cluster.overlap: the virtual cluster runs each step whole (its time model has no overlap): set it "
            "\"auto\" or false");
}

TEST(Config, AllreduceTakesSixteenBitCodecsAndNoErrorFeedback) {
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nmode = \"allreduce\"\ncodec = \"bf16\"\n"), "(no error)");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nmode = \"allreduce\"\ncodec = \"topk:0.01\"\n"),
            "exp.toml: cluster.codec: allreduce all-reduces the gradient in \"f32\", \"f16\" or \"bf16\"; \"topk:0.01\" "
            "is a codec for PS pushes");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nmode = \"allreduce\"\ncodec = \"f16\"\nerror_feedback = \"on\"\n"),
            "exp.toml: cluster.error_feedback: keeps what a lossy push codec left out for the next push: PS modes only");
}

TEST(Config, PullCodecsRoundEachValueAndNeedServers) {
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nmode = \"asp\"\npull_codec = \"bf16\"\n"), "(no error)");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nmode = \"asp\"\npull_codec = \"topk:0.1\"\n"),
            "exp.toml: cluster.pull_codec: expected \"f32\", \"f16\" or \"bf16\" (a pull carries θ itself: codecs that "
            "drop or share precision between values are for gradients), got \"topk:0.1\"");
  EXPECT_NE(error_of("name = \"x\"\n[cluster]\nmode = \"allreduce\"\npull_codec = \"f16\"\n").find("no servers"),
            std::string::npos);
}

// cluster.reconnect_s: auto is 0 on one host and 30 s across hosts; a value of one's own stands.
TEST(Config, ReconnectWindowIsZeroOnOneHostAndThirtySecondsAcross) {
  const auto window = [](const std::string& cluster) {
    return reconnect_window_s(parse_config("name = \"x\"\n[cluster]\n" + cluster, "exp.toml"));
  };
  EXPECT_EQ(window(""), 0.0);
  EXPECT_EQ(window("launcher = \"ssh\"\nhosts = [\"a\", \"a\"]\n"), 0.0);
  EXPECT_EQ(window("launcher = \"ssh\"\nhosts = [\"a\", \"b\"]\n"), 30.0);
  EXPECT_EQ(window("launcher = \"slurm\"\n"), 30.0);
  EXPECT_EQ(window("launcher = \"ssh\"\nhosts = [\"a\", \"b\"]\nreconnect_s = 5\n"), 5.0);
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nreconnect_s = -2\n"), "exp.toml: cluster.reconnect_s: must be in [0, 1e7], or -1 (auto)");
}

// cluster.ssh_alive_s: auto is twice the reconnect window, at least 60 s; one's own must outlast
// the reconnect window (a link down for less loses nothing, so nothing may be stopped meanwhile).
TEST(Config, SshAliveWindowOutlastsTheReconnectWindow) {
  const auto alive = [](const std::string& cluster) {
    return ssh_alive_window_s(parse_config("name = \"x\"\n[cluster]\n" + cluster, "exp.toml"));
  };
  const std::string two_hosts = "launcher = \"ssh\"\nhosts = [\"a\", \"b\"]\n";
  EXPECT_EQ(alive(two_hosts), 60.0);
  EXPECT_EQ(alive(two_hosts + "reconnect_s = 45\n"), 90.0);
  EXPECT_EQ(alive(two_hosts + "ssh_alive_s = 31\n"), 31.0);
  EXPECT_EQ(alive(two_hosts + "reconnect_s = 1\nssh_alive_s = 2\n"), 2.0);
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\n" + two_hosts + "ssh_alive_s = 30\n"),
            "exp.toml: cluster.ssh_alive_s: must be longer than the reconnect window (cluster.reconnect_s: 30 s here): "
            "a link down for less must lose nothing");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nssh_alive_s = 0.5\n"),
            "exp.toml: cluster.ssh_alive_s: must be in [1, 1e7], or -1 (auto)");
}

TEST(Config, ByzantineWorkersAreRanksOfAModeThatPushesGradients) {
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nworkers = 2\n[byzantine]\nworkers = [5]\n"),
            "exp.toml: byzantine.workers: rank 5 is not a worker (cluster.workers = 2)");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nworkers = 2\n[byzantine]\nworkers = [1]\nkind = \"zeros\"\n"),
            "exp.toml: byzantine.kind: expected \"nan\", \"noise\" or \"batch\", got \"zeros\"");
  EXPECT_NE(error_of("name = \"x\"\n[cluster]\nworkers = 2\nmode = \"allreduce\"\n[byzantine]\nworkers = [1]\n")
                .find("byzantine.workers: needs a parameter-server mode whose workers push gradients"),
            std::string::npos);
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nworkers = 2\nmode = \"asp\"\n[byzantine]\nworkers = [1]\nkind = \"noise\"\n"), "(no error)");
}

TEST(Config, UnknownModeIsNamed) {
  const std::string e = error_of("name = \"x\"\n[cluster]\nmode = \"gossip\"\n");
  EXPECT_EQ(e, "exp.toml: cluster.mode: \"gossip\" is not a mode: expected \"allreduce\", \"bsp\", \"ssp:<s>\", \"asp\", "
            "\"dcasgd:<lambda>\", \"local:<H>\" or \"easgd:<alpha>\"") << e;
  const std::string no_bound = error_of("name = \"x\"\n[cluster]\nmode = \"ssp\"\n");
  EXPECT_EQ(no_bound.rfind("exp.toml: cluster.mode: \"ssp\" needs an argument: ssp:<s>", 0), 0u) << no_bound;
  const std::string negative = error_of("name = \"x\"\n[cluster]\nmode = \"ssp:-1\"\n");
  EXPECT_NE(negative.find("cluster.mode: \"ssp:-1\": the staleness bound must be an integer >= 0"), std::string::npos) << negative;
  EXPECT_NE(error_of("name = \"x\"\n[cluster]\nmode = \"asp:1\"\n").find("asp takes no argument"), std::string::npos);
  const ExperimentConfig ar = parse_config("name = \"x\"\n[cluster]\nmode = \"allreduce\"\n", "e");
  EXPECT_FALSE(ar.uses_servers());
}

TEST(Config, UnknownKeyIsNamedWithTheOneItMostLikelyMeantAndTheKnownOnes) {
  const std::string e = error_of("name = \"x\"\n[optimizer]\nlrr = 0.1\n");
  EXPECT_EQ(e.rfind("exp.toml: optimizer.lrr: unknown key; did you mean optimizer.lr? (known here: optimizer.beta1", 0), 0u) << e;
  const std::string section = error_of("name = \"x\"\n[trian]\nbatch = 1\n");  // (a section of no known key)
  EXPECT_NE(section.find("trian.batch: unknown key; did you mean train.batch?"), std::string::npos) << section;
  EXPECT_EQ(section.find("known here"), std::string::npos) << section;
  const std::string elsewhere = error_of("name = \"x\"\n[train]\nmomentum = 0.9\nbatch = 8\n");
  EXPECT_NE(elsewhere.find("train.momentum: unknown key; did you mean optimizer.momentum? (known here: train."), std::string::npos)
      << elsewhere;
  const std::string several = error_of("name = \"x\"\n[train]\nworkers = 4\n");
  EXPECT_NE(several.find("train.workers: unknown key; did you mean byzantine.workers or cluster.workers or "), std::string::npos)
      << several;
  const std::string top = error_of("name = \"x\"\n[cluster]\nmode = \"asp\"\nseed = 3\n");
  EXPECT_NE(top.find("cluster.seed: unknown key; did you mean seed? (a key of no section goes before the first [section] "
                     "header) (known here: cluster."), std::string::npos) << top;
  const std::string none = error_of("name = \"x\"\n[cluster]\nzzzzzz = 4\n");
  EXPECT_NE(none.find("cluster.zzzzzz: unknown key (known here: cluster."), std::string::npos) << none;
}

TEST(Config, RangeAndCrossFieldChecks) {
  EXPECT_EQ(error_of("name = \"x\"\n[train]\nbatch = 0\n"), "exp.toml: train.batch: must be >= 1");
  for (const char* name : {"..", ".", "a/b"})
    EXPECT_EQ(error_of("name = \"" + std::string(name) + "\"\n"),
              "exp.toml: name: must be a non-empty name without '/', other than \".\" and \"..\" (it names a directory "
              "under --runs-dir)");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nworkers = 2\n[straggler]\nworkers = [2]\n"),
            "exp.toml: straggler.workers: rank 2 is not a worker (cluster.workers = 2)");
  EXPECT_NE(error_of("name = \"x\"\n[optimizer]\nkind = \"rmsprop\"\n").find("optimizer.kind"), std::string::npos);
  EXPECT_NE(error_of("name = \"x\"\n[data]\nkind = \"least-squares\"\n").find("model.kind"), std::string::npos);
  EXPECT_EQ(error_of("name = \"x\"\n[train]\ndevice = \"cuda\"\n[cluster]\nmode = \"allreduce\"\ncollective = \"nccl\"\n"
                     "overlap = true\n"),
            "exp.toml: cluster.overlap: GPU ranks overlap an all-reduce through host memory only: NCCL's does not overlap "
            "yet (set it false or \"auto\", or cluster.collective = \"gloo\")");
  EXPECT_EQ(error_of("name = \"x\"\n[train]\ndevice = \"cuda\"\n[cluster]\nmode = \"allreduce\"\ncollective = \"gloo\"\n"
                     "overlap = true\n"),
            "(no error)");
  EXPECT_EQ(error_of("name = \"x\"\n[train]\ndevice = \"cuda\"\n[cluster]\noverlap = true\n"), "(no error)");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\noverlap = true\nbucket_kb = 0\n"), "exp.toml: cluster.bucket_kb: must be >= 1");
  EXPECT_EQ(error_of("name = \"x\"\n[train]\ntf32 = true\n"),
            "exp.toml: train.tf32: TF32 is a GPU option: it needs train.device = \"cuda\"");
  EXPECT_EQ(error_of("name = \"x\"\n[train]\ncuda_graphs = \"on\"\n"),
            "exp.toml: train.cuda_graphs: \"on\" records steps as CUDA graphs: it needs train.device = \"cuda\" "
            "(\"auto\" is off on the CPU)");
  EXPECT_EQ(error_of("name = \"x\"\n[train]\ncuda_graphs = \"yes\"\n"),
            "exp.toml: train.cuda_graphs: expected \"auto\", \"on\" or \"off\", got \"yes\"");
  EXPECT_EQ(error_of("name = \"x\"\n[train]\ndevice = \"cuda\"\ncuda_graphs = \"on\"\n"), "(no error)");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\ncollective = \"mpi\"\n"),
            "exp.toml: cluster.collective: expected \"auto\", \"nccl\" or \"gloo\", got \"mpi\"");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nmode = \"allreduce\"\ncollective = \"nccl\"\n"),
            "exp.toml: cluster.collective: \"nccl\" all-reduces GPU buffers: it needs train.device = \"cuda\" "
            "(CPU workers use Gloo or shm)");
}

// Sizes and times past what their counters or the data allow, and keys that read as others, are
// refused naming the key (each was accepted, and then ignored, clipped or overflowed).
TEST(Config, SizesTimesAndKeysPastWhatTheRunCanHold) {
  const std::string ls = "name = \"x\"\n[model]\nkind = \"linear\"\n[data]\nkind = \"least-squares\"\n";
  EXPECT_EQ(error_of(ls + "[cluster]\nworkers = 4\n[train]\nbatch = 4096\n"),
            "exp.toml: train.batch: 4096 is more than a worker's share of the training set (8192 samples over 4 "
            "worker(s): 2048)");
  EXPECT_EQ(error_of(ls + "[cluster]\nworkers = 4\n[train]\nbatch = 2048\n"), "(no error)");
  EXPECT_EQ(error_of(ls + "[train]\nepochs = 1e18\n"), "exp.toml: train.epochs: makes more than 10^15 steps (128 per epoch)");
  EXPECT_EQ(error_of(ls + "[cluster]\nservers = 1000\n"),
            "exp.toml: cluster.servers: 1000 servers for 132 parameters: some shards would hold none");
  EXPECT_EQ(error_of("name = \"x\"\n[optimizer]\nkind = \"lars\"\n[cluster]\nservers = 4\n"),  // (MLP: 3 layers)
            "exp.toml: cluster.servers: 4 servers for a model of 3 layers: optimizer.kind = \"lars\" takes a trust "
            "ratio per layer, so each server holds whole layers");
  EXPECT_EQ(error_of("name = \"x\"\n[optimizer]\nkind = \"lamb\"\n[cluster]\nservers = 3\n"), "(no error)");
  EXPECT_EQ(error_of(ls + "[cluster]\nheartbeat_s = 0.001\n"),
            "exp.toml: cluster.heartbeat_s: must be in [0.05, 1e7] (a client beats at most every 10 ms)");
  EXPECT_EQ(error_of(ls + "[cluster]\ntimeout_s = 1e12\n"), "exp.toml: cluster.timeout_s: must be in (0, 1e7]");
  EXPECT_EQ(error_of("name = \"x\"\n[model]\nkind = \"mlp\"\nhidden = [2000000000, 2000000000]\n"),
            "exp.toml: model.kind: the model has 4000001592000000010 parameters: at most 2^36 (256 GiB of float32)");
  EXPECT_EQ(error_of("name = \"x\"\n\"train.batch\" = 7\n"),
            "exp.toml: train.batch: a quoted key with a dot in it is one key named \"train.batch\", not a key of a "
            "section: write it without the quotes");
  EXPECT_EQ(parse_config("name = \"x\"\n", "e", {" train.batch = 32 "}).train.batch, 32);
  // hosts given, the launcher forgotten: every process ran on this machine, without a word
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nhosts = [\"a\", \"b\"]\n"),
            "exp.toml: cluster.hosts: names the hosts of the ssh or Slurm launcher; with cluster.launcher = \"local\" every "
            "process runs on this machine (set cluster.launcher = \"ssh\")");
  EXPECT_NE(error_of("name = \"x\"\n[cluster]\naddresses = [\"a=10.0.0.1\"]\n").find("cluster.addresses: is for the ssh"),
            std::string::npos);
}

TEST(Config, EachHostsAddressIsNamedPerHostNotByOneBind) {
  const std::string ssh = "name = \"x\"\n[cluster]\nlauncher = \"ssh\"\nhosts = [\"a\", \"b\"]\n";
  EXPECT_EQ(error_of(ssh + "bind = \"10.0.0.2\"\n"),
            "exp.toml: cluster.bind: is the local launcher's address; with cluster.launcher = \"ssh\" each host listens "
            "on its own address: name it with cluster.interface or cluster.addresses");
  EXPECT_EQ(error_of(ssh + "addresses = [\"a\"]\n"),
            "exp.toml: cluster.addresses: expected entries \"HOST=ADDRESS\" or \"HOST=INTERFACE\", got \"a\"");
  EXPECT_NE(error_of(ssh + "interface = \"eth0,eth1\"\n").find("cluster.interface"), std::string::npos);
  // A host is a host name: not an option ssh would take (and run a ProxyCommand of), nothing a shell reads.
  for (const char* bad : {"-oProxyCommand=touch /tmp/x", "a b", "a;b", "$(id)", ""})
    EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nlauncher = \"ssh\"\nhosts = [\"a\", \"" + std::string(bad) + "\"]\n"),
              "exp.toml: cluster.hosts: entries are host names as ssh takes them ([user@]host), got \"" + std::string(bad) + "\"");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nlauncher = \"ssh\"\nhosts = [\"me@node-1.example.org\", \"10.0.0.2\"]\n"),
            "(no error)");
  const auto c = parse_config(ssh + "interface = \"ib0\"\naddresses = [\"b=10.0.0.3\"]\n", "exp.toml", {});
  const auto plan = run_plan(c);
  EXPECT_EQ(plan["interface"], "ib0");
  EXPECT_EQ(plan["host_addresses"][0], "b=10.0.0.3");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nbind = \"10.0.0.2\"\n"), "(no error)");  // local: its own bind
}

TEST(Config, InvalidTomlGivesLineAndColumn) {
  const std::string e = error_of("name = \"x\"\n[train\n");
  EXPECT_EQ(e.rfind("exp.toml:2:", 0), 0u) << e;
}

TEST(Config, OverridesApplyAndAreChecked) {
  const ExperimentConfig c = parse_config("name = \"x\"\n", "e", {"optimizer.lr=0.5", "cluster.mode=ssp:2", "model.hidden=[8]"});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_EQ(c.cluster.mode, "ssp:2");
  EXPECT_EQ(c.model.hidden, std::vector<int>{8});
  EXPECT_NE(error_of("name = \"x\"\n", {"train.bach=3"}).find("train.bach: unknown key"), std::string::npos);
  // An error a --set caused names the --set, not the file alone.
  EXPECT_EQ(error_of("name = \"x\"\n", {"cluster.workers=2", "train.batch=0"}),
            "exp.toml (with --set train.batch=0): train.batch: must be >= 1");
  EXPECT_EQ(error_of("name = \"x\"\n[train]\nbatch = 0\n", {"cluster.workers=2"}), "exp.toml: train.batch: must be >= 1");
  std::vector<std::string> labels;
  try {
    expand_sweep("name = \"s\"\n[cluster]\nmode = [\"bsp\", \"asp\"]\n", "s.toml", labels, {"optimizer.lr=-1"});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "s.toml [mode=bsp] (with --set optimizer.lr=-1): optimizer.lr: must be > 0");
  }
}

TEST(Config, NumbersMustBeFinite) {
  // TOML has inf and nan; no key takes them (lr = inf used to pass and end the run "diverged").
  EXPECT_EQ(error_of("name = \"x\"\n[optimizer]\nlr = inf\n"), "exp.toml: optimizer.lr: must be a finite number, got inf");
  EXPECT_EQ(error_of("name = \"x\"\n[optimizer]\nlr = nan\n"), "exp.toml: optimizer.lr: must be a finite number, got nan");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\ntimeout_s = -inf\n"),
            "exp.toml: cluster.timeout_s: must be a finite number, got -inf");
  EXPECT_EQ(error_of("name = \"x\"\n[schedule]\nmilestones = [1.0, inf]\n"),
            "exp.toml: schedule.milestones: must be a finite number, got inf");
  EXPECT_EQ(error_of("name = \"x\"\n[schedule]\nkind = \"step\"\nmilestones = [2.0, -1.0]\n"),
            "exp.toml: schedule.milestones: each must be an epoch > 0, got -1");
}

TEST(Config, WrittenBackConfigReadsBackEqual) {
  ExperimentConfig c = parse_config("name = \"rt\"\nseed = 9\n[cluster]\nmode = \"ssp:4\"\nlauncher = \"ssh\"\nhosts = [\"a\", \"b\"]\n"
                                    "[schedule]\nmilestones = [3.0, 6.5]\n[straggler]\nworkers = [0]\n", "e");
  const std::string text = to_toml(c);
  const ExperimentConfig back = parse_config(text, "written");
  EXPECT_EQ(to_toml(back), text);
  EXPECT_EQ(back.seed, 9u);
  EXPECT_EQ(back.cluster.hosts, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(back.schedule.milestones, (std::vector<double>{3.0, 6.5}));
  EXPECT_NE(text.find("lr = 0.1"), std::string::npos) << "defaults are written out";
}

// [[variant]]: named sets of values, one run each, crossed with the swept keys that a variant
// does not set itself; --set has the last word.
TEST(Config, VariantsAreNamedRunsCrossedWithTheSweep) {
  const std::string text =
      "name = \"v\"\nseed = [1, 2]\n[cluster]\nmode = \"asp\"\nworkers = 2\n"
      "[[variant]]\nname = \"asp\"\n"
      "[[variant]]\nname = \"asp+topk\"\ncluster.codec = \"topk:0.01\"\n"
      "[[variant]]\nname = \"local\"\nseed = 7\n[variant.cluster]\nmode = \"local:4\"\n";
  std::vector<std::string> labels;
  const auto points = expand_sweep(text, "v.toml", labels);
  EXPECT_EQ(labels, (std::vector<std::string>{"variant=asp,seed=1", "variant=asp,seed=2", "variant=asp+topk,seed=1",
                                              "variant=asp+topk,seed=2", "variant=local"}));
  EXPECT_EQ(parse_config(points[2], "p").cluster.codec, "topk:0.01");
  EXPECT_EQ(parse_config(points[2], "p").cluster.mode, "asp");
  EXPECT_EQ(parse_config(points[4], "p").cluster.mode, "local:4");
  EXPECT_EQ(parse_config(points[4], "p").seed, 7u);
  EXPECT_EQ(parse_config(points[4], "p").cluster.workers, 2);
  const auto set = expand_sweep(text, "v.toml", labels, {"cluster.mode=bsp", "seed=3"});
  EXPECT_EQ(set.size(), 3u);
  EXPECT_EQ(parse_config(set[2], "p").cluster.mode, "bsp");
  EXPECT_EQ(parse_config(set[2], "p").seed, 3u);
  auto error = [&](const std::string& t) {
    try {
      expand_sweep(t, "v.toml", labels);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(error("name = \"v\"\n[[variant]]\ncluster.mode = \"asp\"\n"),
            "v.toml: variant: every [[variant]] needs name = \"...\" (it names the run)");
  EXPECT_EQ(error("name = \"v\"\n[[variant]]\nname = \"a\"\n[[variant]]\nname = \"a\"\n"),
            "v.toml: variant: two variants are named \"a\"");
  EXPECT_EQ(error("name = \"v\"\n[[variant]]\nname = \"a\"\ncluster.mdoe = \"asp\"\n").find(
                "v.toml [variant a]: cluster.mdoe: unknown key"),
            0u);
  EXPECT_EQ(error("name = \"v\"\n[[variant]]\nname = \"a\"\ncluster.mode = \"gossip\"\n").find(
                "v.toml [variant=a]: cluster.mode: "),
            0u);
}

TEST(Config, SweepExpandsToTheCrossProduct) {
  std::vector<std::string> labels;
  const auto points = expand_sweep(
      "name = \"s\"\n[model]\nhidden = [[64], [32, 16]]\n[cluster]\nmode = [\"allreduce\", \"bsp\", \"ssp:1\"]\nworkers = [1, 2]\n",
      "s.toml", labels);
  ASSERT_EQ(points.size(), 12u);
  EXPECT_EQ(labels.front(), "hidden=[64],mode=allreduce,workers=1");
  EXPECT_EQ(labels.back(), "hidden=[32,16],mode=ssp:1,workers=2");
  const ExperimentConfig last = parse_config(points.back(), "p");
  EXPECT_EQ(last.cluster.mode, "ssp:1");
  EXPECT_EQ(last.cluster.workers, 2);
  EXPECT_EQ(last.model.hidden, (std::vector<int>{32, 16}));
  // Overrides apply before expansion: a swept key set to one value is no longer swept, and a
  // point that only the override makes valid is accepted.
  auto one = expand_sweep("name = \"s\"\n[cluster]\nmode = [\"bsp\", \"asp\"]\nworkers = 2\n[straggler]\nworkers = [3]\n",
                          "s.toml", labels, {"cluster.mode=ssp:1", "cluster.workers=4"});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(parse_config(one[0], "p").cluster.mode, "ssp:1");
  EXPECT_EQ(parse_config(one[0], "p").cluster.workers, 4);
  // A list key given one list is not a sweep.
  EXPECT_EQ(expand_sweep("name = \"s\"\n[model]\nhidden = [64]\n", "s", labels).size(), 1u);
  // Each point is validated, naming the point.
  try {
    expand_sweep("name = \"s\"\n[cluster]\nmode = [\"bsp\", \"bogus\"]\n", "s.toml", labels);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("s.toml [mode=bogus]: cluster.mode:", 0), 0u) << e.what();
  }
}

// A label names a key by its last part where no key declared before it ends the same way: the
// summaries read "workers=" and "batch=" as the global batch's, so straggler.workers and
// eval.batch must not look like cluster.workers and train.batch.
TEST(Config, SweepLabelsTellApartKeysThatEndAlike) {
  std::vector<std::string> labels;
  expand_sweep("name = \"s\"\n[cluster]\nworkers = [4]\n[straggler]\nworkers = [[1], [2]]\n"
               "[train]\nbatch = [32]\n[eval]\nbatch = [100, 200]\n",
               "s.toml", labels, {"cluster.workers=[4, 8]"});
  EXPECT_EQ(labels.front(), "batch=32,workers=4,eval.batch=100,straggler.workers=[1]");
  EXPECT_EQ(labels.back(), "batch=32,workers=8,eval.batch=200,straggler.workers=[2]");
  expand_sweep("name = \"s\"\n[optimizer]\nkind = [\"sgd\", \"adam\"]\n[model]\nkind = [\"mlp\"]\n", "s.toml", labels);
  EXPECT_EQ(labels.front(), "kind=mlp,optimizer.kind=sgd");
}

TEST(Config, KeyListingCoversEverySection) {
  const std::string k = describe_keys();
  for (const char* key : {"optimizer.lr", "cluster.mode", "straggler.exp_delay_ms", "eval.target_acc"})
    EXPECT_NE(k.find(key), std::string::npos) << key;
}

// Defect: schedule_for_run set the cosine's length to train.epochs even when train.steps
// decided the run's length, so a steps-based run decayed on the wrong horizon.
// cluster.overlap: true, false or "auto", written back as it was given.
TEST(Config, OverlapIsTrueFalseOrAuto) {
  EXPECT_TRUE(parse_config("name = \"x\"\n", "exp.toml").cluster.overlap.is_auto());
  EXPECT_TRUE(parse_config("name = \"x\"\n[cluster]\noverlap = true\n", "exp.toml").cluster.overlap.is_on());
  const ExperimentConfig off = parse_config("name = \"x\"\n[cluster]\noverlap = false\n", "exp.toml");
  EXPECT_FALSE(off.cluster.overlap.is_on() || off.cluster.overlap.is_auto());
  EXPECT_TRUE(parse_config("name = \"x\"\n[cluster]\noverlap = \"auto\"\n", "exp.toml").cluster.overlap.is_auto());
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\noverlap = \"yes\"\n"),
            "exp.toml: cluster.overlap: expected true, false or \"auto\", got a string ('yes')");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\noverlap = 1\n"),
            "exp.toml: cluster.overlap: expected true, false or \"auto\", got an integer (1)");
  for (const char* v : {"true", "false", "\"auto\""}) {
    const ExperimentConfig c = parse_config(std::string("name = \"x\"\n[cluster]\noverlap = ") + v + "\n", "exp.toml");
    EXPECT_EQ(parse_config(to_toml(c), "back.toml").cluster.overlap, c.cluster.overlap) << v;
  }
}

// "auto" overlaps GPU workers that push gradients, and CPU workers where the cores suffice.
TEST(Setup, OverlapAutoIsDecidedPerDeviceAndHost) {
  auto cfg = [](const std::string& cluster, const std::string& train = "") {
    return parse_config("name = \"x\"\n[train]\n" + train + "[cluster]\n" + cluster, "exp.toml");
  };
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_TRUE(overlaps(cfg("mode = \"asp\"\n", "device = \"cuda\"\n"), 4 * cores));  // a GPU: whatever the cores
  EXPECT_TRUE(overlaps(cfg("mode = \"bsp\"\n", "device = \"cuda\"\n"), 1));
  EXPECT_FALSE(overlaps(cfg("mode = \"allreduce\"\ncollective = \"nccl\"\n", "device = \"cuda\"\n"), 1));  // not yet
  EXPECT_TRUE(overlaps(cfg("mode = \"allreduce\"\n", "device = \"cuda\"\n"), 1));  // if the rank's goes through host memory
  EXPECT_TRUE(overlaps(cfg("mode = \"allreduce\"\ncollective = \"gloo\"\n", "device = \"cuda\"\n"), 4 * cores));
  EXPECT_FALSE(overlaps(cfg("mode = \"local:4\"\n", "device = \"cuda\"\n"), 1));    // pushes models
  EXPECT_FALSE(overlaps(cfg("mode = \"bsp\"\n", "device = \"cuda\"\naccumulate = 2\n"), 1));
  EXPECT_TRUE(overlaps(cfg("mode = \"bsp\"\n"), cores));  // a CPU with a core per process
  EXPECT_TRUE(overlaps(cfg("mode = \"allreduce\"\n"), cores));
  EXPECT_FALSE(overlaps(cfg("mode = \"bsp\"\n"), cores + 1));  // fewer cores than processes
  EXPECT_FALSE(overlaps(cfg("mode = \"allreduce\"\nlauncher = \"virtual\"\n"), 1));  // simulated time
  EXPECT_FALSE(overlaps(cfg("mode = \"bsp\"\noverlap = false\n", "device = \"cuda\"\n"), 1));
  EXPECT_TRUE(overlaps(cfg("mode = \"bsp\"\noverlap = true\n"), cores + 1));
}

// cluster.server_threads = 0: a CPU run shares the cores among all processes; in a GPU run the
// workers and the evaluator keep a core each and the servers share the rest.
TEST(Setup, ServersShareTheCoresThatGpuProcessesLeave) {
  auto cfg = [](const std::string& train, const std::string& cluster = "") {
    return parse_config("name = \"x\"\n[train]\n" + train + "[cluster]\nmode = \"asp\"\n" + cluster, "exp.toml");
  };
  const ExperimentConfig cpu = cfg(""), gpu = cfg("device = \"cuda\"\n");
  EXPECT_EQ(server_threads(cpu, 7, 2, 16), 2);   // 4 workers, 2 servers, the evaluator: 16 / 7
  EXPECT_EQ(server_threads(gpu, 7, 2, 16), 5);   // (16 - 5 GPU processes) / 2 servers
  EXPECT_EQ(server_threads(gpu, 11, 2, 16), 3);  // 8 GPU workers and the evaluator
  EXPECT_EQ(server_threads(gpu, 2, 2, 16), 8);   // servers alone on their host
  EXPECT_EQ(server_threads(gpu, 7, 2, 2), 1);    // fewer cores than processes: at least one
  EXPECT_EQ(server_threads(gpu, 7, 9, 16), 2);   // more servers than processes said: the plain share
  EXPECT_EQ(server_threads(cfg("device = \"cuda\"\n", "server_threads = 3\n"), 7, 2, 16), 3);  // as set
  EXPECT_EQ(server_threads(cpu, 1), std::max(1, int(std::thread::hardware_concurrency())));  // defaults: this host
}

TEST(Setup, AScheduleSpansTheStepsThatRunWhenTrainStepsDecides) {
  const ExperimentConfig c = parse_config(
      "name = \"x\"\n[data]\nkind = \"logistic\"\ntrain_samples = 1024\n[train]\nbatch = 32\nsteps = 64\n"
      "epochs = 10\n[schedule]\nkind = \"cosine\"\n[cluster]\nmode = \"asp\"\nworkers = 2\n", "e");
  const long spe = steps_per_epoch(c, 2);
  ASSERT_EQ(spe, 16);  // 512 samples per worker, batch 32
  const ScheduleConfig s = schedule_for_run(c, spe);
  EXPECT_DOUBLE_EQ(s.total_epochs, 4.0);
  EXPECT_LT(learning_rate(s, 0.1, 32, 63.0 / 16), 1e-3) << "the last step's lr has decayed to ~0";
  ExperimentConfig by_epochs = c;
  by_epochs.train.steps = 0;
  EXPECT_DOUBLE_EQ(schedule_for_run(by_epochs, spe).total_epochs, 10.0);
}

// cluster.on_worker_loss: "auto" continues where the mode trains on without a worker (asp,
// ssp), and an explicit "continue" is refused where it cannot (bsp, allreduce).
TEST(Config, OnWorkerLossContinuesOnlyWhereTheModeCan) {
  auto resolved = [](const std::string& mode, const std::string& loss) {
    return continues_without_lost_workers(
        parse_config("name = \"x\"\n", "e", {"cluster.mode=" + mode, "cluster.on_worker_loss=" + loss}));
  };
  EXPECT_TRUE(resolved("asp", "auto"));
  EXPECT_TRUE(resolved("ssp:2", "auto"));
  EXPECT_FALSE(resolved("bsp", "auto"));
  EXPECT_FALSE(resolved("allreduce", "auto"));
  EXPECT_TRUE(resolved("asp", "continue"));
  EXPECT_FALSE(resolved("asp", "fail"));
  EXPECT_FALSE(resolved("ssp:2", "fail"));
  EXPECT_NE(error_of("name = \"x\"\n[cluster]\nmode = \"bsp\"\non_worker_loss = \"continue\"\n")
                .find("exp.toml: cluster.on_worker_loss: \"continue\" needs a mode that trains on without a lost worker"),
            std::string::npos);
  EXPECT_NE(error_of("name = \"x\"\n[cluster]\nmode = \"allreduce\"\non_worker_loss = \"continue\"\n")
                .find("cluster.on_worker_loss: "),
            std::string::npos);
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\non_worker_loss = \"ignore\"\n"),
            "exp.toml: cluster.on_worker_loss: expected \"auto\", \"continue\" or \"fail\", got \"ignore\"");
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nheartbeat_s = 0\n"), "exp.toml: cluster.heartbeat_s: must be in [0.05, 1e7] (a client beats at most every 10 ms)");
}

TEST(Config, OnServerLossRestartsOnlyAsyncModesTheLauncherOwns) {
  auto resolved = [](const std::string& mode, const std::string& transport, const std::string& loss) {
    return restarts_lost_servers(parse_config("name = \"x\"\n", "e", {"cluster.mode=" + mode, "cluster.transport=" + transport,
                                                                        "cluster.on_server_loss=" + loss}));
  };
  EXPECT_TRUE(resolved("asp", "tcp", "auto"));
  EXPECT_TRUE(resolved("ssp:1", "tcp", "restart"));
  EXPECT_TRUE(resolved("asp", "ipc", "auto"));
  EXPECT_FALSE(resolved("asp", "shm", "auto"));
  EXPECT_FALSE(resolved("asp", "auto", "auto"));  // shm on one host
  EXPECT_NE(error_of("name = \"x\"\n[cluster]\nmode = \"asp\"\ntransport = \"shm\"\non_server_loss = \"restart\"\n")
                .find("exp.toml: cluster.on_server_loss: \"restart\" needs cluster.transport = \"tcp\" or \"ipc\""),
            std::string::npos);
  EXPECT_FALSE(resolved("bsp", "tcp", "auto"));
  EXPECT_FALSE(resolved("asp", "tcp", "fail"));
  EXPECT_NE(error_of("name = \"x\"\n[cluster]\nmode = \"bsp\"\non_server_loss = \"restart\"\n")
                .find("exp.toml: cluster.on_server_loss: \"restart\" needs a mode that trains on when updates are lost"),
            std::string::npos);
  EXPECT_NE(error_of("name = \"x\"\n[cluster]\nmode = \"asp\"\nlauncher = \"slurm\"\non_server_loss = \"restart\"\n")
                .find("exp.toml: cluster.on_server_loss: \"restart\" needs the local or ssh launcher"),
            std::string::npos);
  EXPECT_FALSE(restarts_lost_servers(parse_config("name = \"x\"\n", "e", {"cluster.mode=\"asp\"", "cluster.launcher=\"slurm\""})));
  EXPECT_EQ(run_plan(parse_config("name = \"x\"\n", "e", {"cluster.mode=\"asp\""}))["on_server_loss"], "restart");
  EXPECT_EQ(run_plan(parse_config("name = \"x\"\n", "e"))["on_server_loss"], "fail");  // bsp by default
}

TEST(Config, AugmentationNeedsImages) {
  EXPECT_EQ(error_of("name = \"x\"\n[data]\naugment = \"mixup\"\n"),
            "exp.toml: data.augment: expected \"none\" or \"crop-flip\", got \"mixup\"");
  EXPECT_EQ(error_of("name = \"x\"\n[data]\naugment_pad = -1\n"), "exp.toml: data.augment_pad: must be in [0, 64]");
  EXPECT_EQ(error_of("name = \"x\"\n[model]\nkind = \"linear\"\n[data]\nkind = \"logistic\"\naugment = \"crop-flip\"\n"),
            "exp.toml: data.augment: crops and flips need images; this data set's samples are 1x1x32");
  EXPECT_EQ(error_of("name = \"x\"\n[data]\naugment = \"crop-flip\"\n"), "(no error)");  // Fashion-MNIST: 1x28x28
}

TEST(Config, PythonWorkersRunAScriptAgainstServers) {
  const std::string py = "name = \"x\"\n[worker]\nkind = \"python\"\nscript = \"/t/train.py\"\n";
  EXPECT_EQ(error_of("name = \"x\"\n[worker]\nkind = \"python\"\n"),
            "exp.toml: worker.script: worker.kind = \"python\" needs the script its workers run");
  EXPECT_EQ(error_of("name = \"x\"\n[worker]\nkind = \"java\"\n"), "exp.toml: worker.kind: expected \"builtin\" or \"python\", got \"java\"");
  EXPECT_EQ(error_of("name = \"x\"\n[worker]\nscript = \"a.py\"\n"),
            "exp.toml: worker.script: only worker.kind = \"python\" runs a script");
  EXPECT_NE(error_of(py + "[cluster]\nmode = \"allreduce\"\n").find("worker.kind: \"python\" workers talk to parameter servers"),
            std::string::npos);
  EXPECT_NE(error_of(py + "[cluster]\nlauncher = \"virtual\"\n").find("worker.kind: \"python\" workers are real processes"),
            std::string::npos);
  EXPECT_NE(error_of(py + "[byzantine]\nworkers = [0]\n").find("byzantine.workers: pushing garbage on purpose is pslab_worker's"),
            std::string::npos);
  // an external model whose sizes and θ0 the script gives at launch: planned with 0 parameters
  const auto plan = run_plan(parse_config(py + "[model]\nkind = \"external\"\n", "e"));
  EXPECT_EQ(plan["params"], 0);
  EXPECT_EQ(plan["model_kind"], "external");
  EXPECT_EQ(plan["worker"]["kind"], "python");
  EXPECT_EQ(plan["worker"]["script"], "/t/train.py");
  EXPECT_NE(error_of(py + "[model]\nkind = \"external\"\ntheta_file = \"t.f32\"\n").find("model.sizes: model.kind = \"external\" needs"),
            std::string::npos);
  // and the config as JSON, for workers in other languages
  const auto j = nlohmann::json::parse(to_json(parse_config(py, "e")));
  EXPECT_EQ(j["worker"]["script"], "/t/train.py");
  EXPECT_EQ(j["cluster"]["mode"], "bsp");
  EXPECT_EQ(j["train"]["batch"], 64);
}

TEST(Config, ReplicasGiveEachServerABackupProcessInThePlan) {
  const auto plan = run_plan(parse_config("name = \"x\"\n", "e", {"cluster.mode=\"asp\"", "cluster.servers=2", "cluster.workers=2", "cluster.replicas=2"}));
  EXPECT_EQ(plan["replicas"], 2);
  EXPECT_EQ(plan["on_server_loss"], "fail");  // the backup takes over instead of a restart
  std::vector<std::string> names;
  for (const auto& p : plan["processes"]) names.push_back(p["name"].get<std::string>() + "/" + p["role"].get<std::string>());
  EXPECT_EQ(names, (std::vector<std::string>{"server0/server", "server1/server", "backup0/backup", "backup1/backup",
                                             "worker0/worker", "worker1/worker", "evaluator/evaluator"}));
  EXPECT_EQ(error_of("name = \"x\"\n[cluster]\nreplicas = 3\n"), "exp.toml: cluster.replicas: must be 1 or 2");
  // an external model (its workers are the user's): its tensors' sizes, and only it takes them
  EXPECT_NE(error_of("name = \"x\"\n[model]\nkind = \"external\"\n").find("model.sizes: model.kind = \"external\" needs its"),
            std::string::npos);
  EXPECT_NE(error_of("name = \"x\"\n[model]\nkind = \"mlp\"\nsizes = [3]\n").find("model.sizes: only model.kind = \"external\""),
            std::string::npos);
  EXPECT_NE(error_of("name = \"x\"\n[model]\nkind = \"external\"\nsizes = [3, 0]\n").find("every size must be > 0"),
            std::string::npos);
  EXPECT_NE(error_of("name = \"x\"\n[cluster]\nmode = \"allreduce\"\nreplicas = 2\n").find("cluster.replicas: 2 needs a parameter-server mode"),
            std::string::npos);
  EXPECT_NE(error_of("name = \"x\"\n[cluster]\nmode = \"asp\"\nreplicas = 2\nlauncher = \"slurm\"\n")
                .find("cluster.replicas: 2 needs the local or ssh launcher: under Slurm, srun ends the whole step"),
            std::string::npos);
  EXPECT_NE(error_of("name = \"x\"\n[cluster]\nmode = \"asp\"\nreplicas = 2\non_server_loss = \"restart\"\n")
                .find("cluster.replicas: 2 replaces restarts"),
            std::string::npos);
}

TEST(Setup, ThePlanSaysWhatTheRunWillDo) {
  const ExperimentConfig c = parse_config(
      "name = \"p\"\n[data]\nkind = \"logistic\"\ntrain_samples = 1000\n[train]\nbatch = 32\nepochs = 2.5\n"
      "[cluster]\nmode = \"ssp:2\"\nworkers = 3\nservers = 2\n", "e");
  const auto p = run_plan(c);
  EXPECT_EQ(p["mode"], "ssp:2");
  EXPECT_EQ(p["uses_servers"], true);
  EXPECT_EQ(p["servers"], 2);
  EXPECT_EQ(p["data"]["train_samples"], 1000);
  EXPECT_EQ(p["data"]["test_samples"], 2048);
  EXPECT_EQ(p["steps_per_epoch"], 11);  // ceil(334 / 32)
  EXPECT_EQ(p["total_steps"], 28);      // ceil(2.5 * 11)
  EXPECT_EQ(p["on_worker_loss"], "continue");  // ssp trains on without a lost worker
  EXPECT_EQ(p["heartbeat_s"], 5.0);
  ASSERT_EQ(p["processes"].size(), 6u);
  EXPECT_EQ(p["processes"][0]["name"], "server0");
  EXPECT_EQ(p["processes"][2]["name"], "worker0");
  EXPECT_EQ(p["processes"][5]["role"], "evaluator");
  ExperimentConfig ar = c;
  ar.cluster.mode = "allreduce";
  const auto q = run_plan(ar);
  EXPECT_EQ(q["servers"], 0);
  EXPECT_EQ(q["processes"].size(), 4u);
  EXPECT_EQ(run_plan(parse_config("name = \"f\"\n", "e"))["data"]["test_samples"], 10000);
}

// A metrics line is stamped with now, or with the time given (an evaluation: when its θ was
// taken), always as the first key.
TEST(Metrics, LinesAreStampedWithNowOrTheTimeGiven) {
  const std::string path = ::testing::TempDir() + "pslab_metrics_stamp.jsonl";
  {
    MetricsWriter m(path, unix_now_s() - 100.0);  // the run started 100 s ago
    m.write({{"kind", "eval"}, {"step", 3}}, 12.25);
    m.write({{"kind", "train"}});
  }
  std::ifstream in(path);
  std::string a, b;
  std::getline(in, a);
  std::getline(in, b);
  EXPECT_EQ(a, "{\"t\":12.250000,\"kind\":\"eval\",\"step\":3}");
  const auto j = nlohmann::ordered_json::parse(b);
  EXPECT_EQ(j.begin().key(), "t");
  EXPECT_NEAR(j["t"].get<double>(), 100.0, 5.0);
  std::remove(path.c_str());
}

// A life killed mid-line left its last line cut; the next life (append) starts a line of its own,
// and a file that ends its lines is appended to as it is.
TEST(Metrics, AppendingAfterALineCutShortStartsANewLine) {
  const std::string path = ::testing::TempDir() + "pslab_metrics_cut.jsonl";
  std::ofstream(path) << "{\"t\":1.0,\"kind\":\"train\"}\n{\"t\":2.0,\"ki";
  for (int life = 0; life < 2; ++life) {
    MetricsWriter m(path, unix_now_s(), /*append=*/true);
    m.write({{"kind", "resumed"}, {"lost_pushes", 3}}, 5.0);
  }
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[1], "{\"t\":2.0,\"ki");
  EXPECT_EQ(lines[2], "{\"t\":5.000000,\"kind\":\"resumed\",\"lost_pushes\":3}");
  EXPECT_EQ(lines[3], lines[2]);
  std::remove(path.c_str());
}

// Metrics that cannot be written (a full disk) are an error naming the file, never cut silently.
TEST(Metrics, AWriteThatFailsIsAnErrorNamingTheFile) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  MetricsWriter m("/dev/full", 0.0);
  try {
    for (int i = 0; i < 100000; ++i) m.write({{"kind", "train"}, {"step", i}});
    m.flush();
    ADD_FAILURE() << "metrics were written to /dev/full";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "/dev/full: cannot write metrics: No space left on device");
  }
}

}  // namespace
