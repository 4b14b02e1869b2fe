// The virtual cluster (src/sim/virtual_cluster.h): pslab's own runtime in simulated time. A run
// is deterministic, follows the cost model to the microsecond, and simulates every mode.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "ps/order_trace.h"
#include "sim/virtual_cluster.h"

using namespace pslab;
namespace fs = std::filesystem;

namespace {

// small_config, in the virtual cluster with a fixed cost model.
ExperimentConfig virtual_config(const std::string& mode, int workers, int servers, const std::vector<std::string>& more = {}) {
  std::vector<std::string> sets = {"cluster.launcher=\"virtual\"", "virtual.compute_ms=1.0", "eval.interval_s=0.01"};
  sets.insert(sets.end(), more.begin(), more.end());
  return parse_config(to_toml(test::small_config(mode, workers, servers)), "test", sets);
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The last "train" line of a worker's metrics.
nlohmann::json last_train_line(const fs::path& dir, int worker) {
  std::ifstream f(dir / "metrics" / ("worker" + std::to_string(worker) + ".jsonl"));
  nlohmann::json last;
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") last = j;
  }
  return last;
}

double run(const ExperimentConfig& cfg, const fs::path& dir) {
  VirtualOptions o;
  o.out_dir = dir.string();
  o.progress = false;
  return run_virtual_cluster(cfg, o);
}

}  // namespace

TEST(VirtualCluster, ARunIsDeterministicToTheByte) {
  const ExperimentConfig cfg = virtual_config("asp", 4, 2, {"straggler.exp_delay_ms=0.5"});
  const fs::path a = test::temp_dir("virtual_a"), b = test::temp_dir("virtual_b");
  EXPECT_EQ(run(cfg, a), run(cfg, b));
  for (const char* f : {"worker0.jsonl", "worker3.jsonl", "server1.jsonl", "evaluator.jsonl"}) {
    EXPECT_FALSE(read(a / "metrics" / f).empty()) << f << " not written (two missing files compare equal)";
    EXPECT_EQ(read(a / "metrics" / f), read(b / "metrics" / f)) << f;
  }
  fs::remove_all(a);
  fs::remove_all(b);
}

// One worker, one server, asp: each step is its compute (virtual.compute_ms), its push over the
// link (latency), the server's update (payload bytes / apply rate) and the reply (latency); the
// links' bandwidth is made so large that bytes cost nothing on them.
TEST(VirtualCluster, AStepTakesWhatTheCostModelSays) {
  const ExperimentConfig cfg = virtual_config("asp", 1, 1, {"virtual.latency_us=100", "virtual.bandwidth_gbps=1e9",
                                                             "virtual.apply_gbps=0.001292", "train.log_every=50"});
  const fs::path dir = test::temp_dir("virtual_costs");
  run(cfg, dir);
  const nlohmann::json last = last_train_line(dir, 0);
  EXPECT_NEAR(last["compute_ms"].get<double>(), 1.0, 1e-5);
  // 323 floats: 1292 bytes at 1.292 MB/s is 1 ms to apply; plus 2 x 100 us of latency.
  EXPECT_NEAR(last["comm_ms"].get<double>(), 1.2, 1e-5);
  fs::remove_all(dir);
}

// Every mode runs in the virtual cluster, through the same roles as a real run; with plain SGD
// all-reduce and bsp apply the same updates (the mean gradient of the same W batches).
TEST(VirtualCluster, EveryModeTrainsAndAllreduceEndsWhereBspDoes) {
  std::map<std::string, double> acc;
  for (const char* mode : {"allreduce", "bsp", "ssp:1", "asp", "dcasgd:0.1", "local:2", "easgd:0.3"}) {
    const fs::path dir = test::temp_dir("virtual_modes");
    acc[mode] = run(virtual_config(mode, 3, 2, {"optimizer.kind=\"sgd\""}), dir);
    EXPECT_TRUE(fs::exists(dir / "metrics" / "evaluator.jsonl")) << mode;
    EXPECT_GT(acc[mode], 0.6) << mode;
    fs::remove_all(dir);
  }
  EXPECT_NEAR(acc["allreduce"], acc["bsp"], 1e-9);
}

// A server killed mid-line and restarted appends on a line of its own: the trace is refused for
// its restart, as documented, not for the torn line.
TEST(OrderTraceFile, ATraceTornByAKillIsRefusedForItsRestart) {
  const std::string path = (std::filesystem::temp_directory_path() / ("pslab-torn-" + std::to_string(::getpid()) + ".txt")).string();
  std::ofstream(path) << "push 0 0 0 1\npull 0 1 1\npus";
  {
    OrderTrace trace(path, /*append=*/true);
    trace.event("resume");
    trace.push(1, 1, 1, 1);
  }
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text, "push 0 0 0 1\npull 0 1 1\npus\nresume\npush 1 1 1 1\n");
  try {
    read_order_trace(path);
    ADD_FAILURE() << "a trace with a restart was read";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), path + ":4: the run had a 'resume' (a lost worker, a restarted server, a resumed run, "
                                            "or a push+pull whose answer a cut connection lost, answered again later): "
                                            "its order cannot be replayed");
  }
  std::filesystem::remove(path);
}

// A pull served twice for one worker and clock (its first answer lost with a cut connection)
// is read where it was served last, the θ the worker took.
TEST(OrderTraceFile, APullServedAgainCountsWhereItWasServedLast) {
  const std::string path = (std::filesystem::temp_directory_path() / ("pslab-again-" + std::to_string(::getpid()) + ".txt")).string();
  std::ofstream(path) << "push 0 0 0 1\npull 0 1 1\npush 1 0 0 1\npull 0 1 2\npull 1 1 2\n";
  const std::vector<TraceOp> ops = read_order_trace(path);
  ASSERT_EQ(ops.size(), 4u);
  EXPECT_EQ(ops[1].kind, TraceOp::push);
  EXPECT_EQ(ops[2].kind, TraceOp::pull);
  EXPECT_EQ((std::vector<long>{ops[2].worker, ops[2].clock, ops[2].version}), (std::vector<long>{0, 1, 2}));
  std::filesystem::remove(path);
}

// A trace that cannot be written (a full disk) is an error naming the file, not a cut trace.
TEST(OrderTraceFile, AWriteThatFailsIsAnError) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  OrderTrace trace("/dev/full", false);
  try {
    for (int i = 0; i < 100000; ++i) trace.push(0, i, i, 1);
    trace.flush();
    ADD_FAILURE() << "writes to /dev/full succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("/dev/full: cannot write the order trace: No space left on device", 0), 0u) << e.what();
  }
}
