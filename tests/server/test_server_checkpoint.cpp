// A server's checkpoints (ServerOptions' checkpoint and resume paths), servers and workers as
// threads in one process: a server writes its shard when it stops and goes on from it, a resumed
// worker catches up a server that missed its last push, and a worker rejoins a restarted server.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>

#include "expect.h"
#include "harness.h"
#include "ps/checkpoint.h"
#include "ps/client.h"
#include "run/config.h"
#include "run/setup.h"
#include "server.h"

using namespace pslab;
using test::Cluster;
using test::expect_refused;

namespace {

// ---- checkpoints: a server writes its shard when it stops and goes on from it ----

TEST(Checkpoint, AServerResumesWhereItsCheckpointLeftOff) {
  ExperimentConfig cfg = test::small_config("ssp:1", 1, 2);
  cfg.optimizer.kind = "momentum";
  const std::string dir = test::temp_dir("ckpt").string();
  auto paths = [&](bool resume) {
    return [&, resume](ServerOptions& o) {
      o.checkpoint_path = dir + "/server" + std::to_string(o.shard) + ".ckpt";
      if (resume) o.resume_path = o.checkpoint_path;
    };
  };
  const std::size_t P = count_params(model_spec(cfg));
  std::vector<float> theta(P), grad(P);
  for (std::size_t i = 0; i < P; ++i) grad[i] = 0.01f * float(int(i % 7) - 3);
  {
    Cluster cluster(cfg, false, false, nullptr, paths(false));
    PsClient w(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
    w.connect();
    w.pull(0, theta.data());
    for (long c = 0; c < 3; ++c) w.push(c, 4, grad.data(), theta.data());
    cluster.stop = true;  // stopped mid-run (a worker that said Bye would stay done after a resume)
    cluster.join();
  }
  std::vector<float> resumed(P);
  {
    Cluster cluster(cfg, false, false, nullptr, paths(true));
    for (const auto& s : cluster.servers) {
      EXPECT_EQ(s->state().version(), 3);
      EXPECT_EQ(s->state().clock_of(0), 3);
      EXPECT_EQ(s->state().samples_applied(), 12);
    }
    PsClient w(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
    w.connect();
    const PullResult r = w.pull(3, resumed.data());
    EXPECT_EQ(r.min_version, 3);
    EXPECT_EQ(std::memcmp(resumed.data(), theta.data(), P * sizeof(float)), 0) << "θ after resuming differs";
    w.push(3, 4, grad.data(), resumed.data());  // clock 3 is the next one: taken
    w.bye(4);
    cluster.join();
    cluster.rethrow();
  }
  // The same config resumed by the wrong shard is refused, naming the file.
  expect_refused(
      [&] {
        Cluster cluster(cfg, false, false, nullptr, [&](ServerOptions& o) {
          o.resume_path = dir + "/server" + std::to_string(1 - o.shard) + ".ckpt";
        });
      },
      "server 0: cannot resume from " + dir + "/server1.ckpt: it is shard 1 of 2",
      "a server resumed from another shard's checkpoint");
  std::filesystem::remove_all(dir);
}

// A stop between one shard's push and the next's leaves the checkpoints holding a worker at
// different clocks: the resumed worker brings the server behind up with an empty push (it
// changes nothing there) and goes on from the furthest clock, counting the push as lost.
TEST(Checkpoint, AResumedWorkerCatchesUpAServerThatMissedItsLastPush) {
  ExperimentConfig cfg = test::small_config("asp", 1, 2);
  const std::string dir = test::temp_dir("ckpt_catch_up").string();
  auto path = [&](int k) { return dir + "/server" + std::to_string(k) + ".ckpt"; };
  const std::size_t P = count_params(model_spec(cfg));
  std::vector<float> theta(P), grad(P, 0.25f);
  {
    Cluster cluster(cfg, false, false, nullptr, [&](ServerOptions& o) { o.checkpoint_path = path(o.shard); });
    PsClient w(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
    w.connect();
    w.pull(0, theta.data());
    for (long c = 0; c < 3; ++c) w.push(c, 4, grad.data(), c < 2 ? theta.data() : nullptr);
    cluster.stop = true;  // stopped mid-run
    cluster.join();
  }
  // Server 1 as if clock 2's push had not reached it: its checkpoint from one push earlier.
  ShardCheckpoint behind = read_checkpoint(path(1));
  ASSERT_EQ(behind.clocks[0], 3);
  behind.clocks[0] = 2;
  write_checkpoint(path(1), behind);
  Cluster cluster(cfg, false, false, nullptr, [&](ServerOptions& o) {
    o.checkpoint_path = path(o.shard);
    o.resume_path = path(o.shard);
  });
  PsClient w(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, 0));
  w.connect();
  const ResumePoint r = w.catch_up();
  EXPECT_EQ(r.clock, 3);
  EXPECT_EQ(r.lost_pushes, 1);
  EXPECT_EQ(cluster.servers[0]->state().clock_of(0), 3);
  EXPECT_EQ(cluster.servers[1]->state().clock_of(0), 3);
  EXPECT_EQ(cluster.servers[1]->state().version(), behind.version) << "the empty push changed θ";
  w.pull(3, theta.data());
  w.push(3, 4, grad.data(), nullptr);  // and the next clock is taken by both
  w.bye(4);
  cluster.join();
  cluster.rethrow();
  std::filesystem::remove_all(dir);
}

// bsp, a server whose checkpoint is 3 clocks behind the others' (killed, its last periodic one):
// every worker brings it up with empty pushes, each answered with the next clock once every
// worker's push of this one came. A worker that caught up first pushed clock 3 while clock 2
// was open, and was refused.
TEST(Checkpoint, BspWorkersCatchUpAServerClocksBehindTogether) {
  ExperimentConfig cfg = test::small_config("bsp", 2, 2);
  const std::string dir = test::temp_dir("ckpt_bsp_catch_up").string();
  auto path = [&](int k) { return dir + "/server" + std::to_string(k) + ".ckpt"; };
  const std::size_t P = count_params(model_spec(cfg));
  auto train = [&](bool resume, long from, long to) {  // both workers, clocks [from, to), then stopped
    Cluster cluster(cfg, false, false, nullptr, [&](ServerOptions& o) {
      o.checkpoint_path = path(o.shard);
      if (resume) o.resume_path = path(o.shard);
    });
    test::run_threads(2, [&](int r) {
      PsClient w(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, r));
      w.connect();
      std::vector<float> theta(P), grad(P, 0.25f);
      w.pull(from, theta.data());
      for (long c = from; c < to; ++c) w.push(c, 4, grad.data(), c + 1 < to ? theta.data() : nullptr);
    });
    cluster.stop = true;
    cluster.join();
  };
  train(false, 0, 2);
  const ShardCheckpoint older = read_checkpoint(path(1));
  train(true, 2, 5);
  ASSERT_EQ(read_checkpoint(path(1)).clocks[0], 5);
  write_checkpoint(path(1), older);  // server 1's from clock 2
  Cluster cluster(cfg, false, false, nullptr, [&](ServerOptions& o) {
    o.checkpoint_path = path(o.shard);
    o.resume_path = path(o.shard);
  });
  std::vector<ResumePoint> at(2);
  test::run_threads(2, [&](int r) {
    PsClient w(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::worker, r));
    w.connect();
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // worker 0 catches up first
    at[std::size_t(r)] = w.catch_up();
    w.bye(5);
  });
  cluster.join();
  cluster.rethrow();
  for (const ResumePoint& r : at) {
    EXPECT_EQ(r.clock, 5);
    EXPECT_EQ(r.lost_pushes, 3);
  }
  EXPECT_EQ(cluster.servers[1]->state().version(), 5);
  std::filesystem::remove_all(dir);
}

// cluster.on_server_loss = "restart": a server that goes away comes back from its checkpoint on
// the same address; the worker rejoins it with its clock and sends its request again. The
// checkpoint here is 2 clocks older than the worker: the server counts 2 updates lost.
// dcasgd: the restarted server holds no θ it served the worker (not in the checkpoint), so the
// push sent again is taken as computed on θ now, uncorrected; the worker failed on it.
void rejoin_a_restarted_server(const std::string& mode) {
  ExperimentConfig cfg = test::small_config(mode, 1, 1);
  cfg.cluster.heartbeat_s = 0.3;
  ASSERT_TRUE(restarts_lost_servers(cfg));
  const std::string dir = test::temp_dir("ckpt_rejoin").string(), path = dir + "/server0.ckpt";
  const auto transport = comm::make_transport("tcp");
  ServerOptions so;
  so.endpoint = transport->local_address("server0");
  so.checkpoint_path = path;
  std::atomic<bool> stop{false};
  so.stop = &stop;
  auto serve = [](Server& s) {
    try {
      s.run();
    } catch (const std::runtime_error&) {  // "stopped by a signal"
    }
  };
  auto first = std::make_unique<Server>(*transport, cfg, so);
  std::thread t1(serve, std::ref(*first));
  const std::size_t P = count_params(model_spec(cfg));
  std::vector<float> theta(P), grad(P, 0.5f);
  PsClient::Options co = client_options(cfg, wire::Role::worker, 0);
  ASSERT_TRUE(co.rejoin);
  PsClient w(*transport, {so.endpoint}, co);
  w.connect();
  w.pull(0, theta.data());
  for (long c = 0; c < 3; ++c) w.push(c, 2, grad.data(), theta.data());
  stop = true;  // the server goes (writing its checkpoint at clock 3)
  t1.join();
  first.reset();
  ShardCheckpoint older = read_checkpoint(path);
  ASSERT_EQ(older.clocks[0], 3);
  older.clocks[0] = 1;  // as if written two clocks earlier
  write_checkpoint(path, older);
  stop = false;
  so.resume_path = path;
  // (The first server's socket closes on ZeroMQ's I/O thread, after its destructor: the port may
  // still be held for a moment in this process. A restarted server is a new process: not there.)
  std::unique_ptr<Server> restarted;
  for (int tries = 0; !restarted; ++tries) {
    try {
      restarted = std::make_unique<Server>(*transport, cfg, so);
    } catch (const std::runtime_error& e) {
      if (tries == 100 || std::string(e.what()).find("Address already in use") == std::string::npos) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  Server& second = *restarted;
  std::thread t2(serve, std::ref(second));
  std::string error;
  try {
    w.push(3, 2, grad.data(), theta.data());  // reaches the new server: rejoin, then sent again
    w.bye(4);
  } catch (const std::runtime_error& e) {
    error = e.what();
    stop = true;  // (the server waits for the worker's Bye)
  }
  t2.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(second.state().clock_of(0), 4);
  EXPECT_EQ(second.updates_lost(), 2);
  std::filesystem::remove_all(dir);
}

TEST(Checkpoint, AWorkerRejoinsARestartedServer) {
  for (const char* mode : {"asp", "dcasgd:0.04"}) {
    SCOPED_TRACE(mode);
    rejoin_a_restarted_server(mode);
  }
}

}  // namespace
