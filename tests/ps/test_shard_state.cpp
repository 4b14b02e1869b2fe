// The update rule of one shard, without sockets: bsp averaging, ssp/asp gating, staleness,
// protocol errors that change nothing, and zero-copy-safe versions.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "ps/modes/mode.h"
#include "ps/checkpoint.h"
#include "ps/pieces.h"
#include "ps/shard_state.h"
#include "comm/wire.h"
#include "core/rng.h"
#include "roles/local_worker.h"

using namespace pslab;

namespace {

// Checksum of a gradient literal of 1 or 2 floats, as the worker would send it.
template <std::size_t N>
std::uint64_t sum(const float (&g)[N]) {
  return wire::checksum(g, N);
}

// A push of the dense f32 payload `g`, as the server hands it to the shard.
template <std::size_t N>
void push(ShardState& s, int worker, long clock, long version_pulled, int batch, const float (&g)[N],
          std::uint64_t checksum) {
  s.push(worker, clock, version_pulled, batch, std::as_bytes(std::span<const float>(g, N)), checksum);
}

// Pushes of the gradient {1} with batch 1, in order, each {worker, clock, version pulled}.
void push_ones(ShardState& s, std::initializer_list<std::array<long, 3>> pushes) {
  const float g[] = {1};
  for (const auto& [worker, clock, version_pulled] : pushes) push(s, int(worker), clock, version_pulled, 1, g, sum(g));
}

ShardState::Options options(const char* mode, int workers, std::size_t n) {
  ShardState::Options o;
  o.mode = mode;
  o.workers = workers;
  o.range = {0, n};
  o.optimizer.kind = "sgd";
  o.optimizer.lr = 1.0;
  o.train_size = 1000;
  o.batch = 1;
  o.record_pulls = true;
  return o;
}

TEST(ShardRange, BalancedAndContiguous) {
  std::size_t next = 0;
  for (int k = 0; k < 3; ++k) {
    const ShardRange r = shard_range(10, 3, k);
    EXPECT_EQ(r.offset, next);
    EXPECT_GE(r.length, 3u);
    EXPECT_LE(r.length, 4u);
    next = r.offset + r.length;
  }
  EXPECT_EQ(next, 10u);
  EXPECT_EQ(shard_range(0, 2, 1).length, 0u);
  EXPECT_THROW(shard_range(10, 2, 2), std::invalid_argument);
}

// With the model's layers (lars, lamb): shards of whole layers, each boundary the layer
// boundary nearest the balanced one, at least one layer each; fewer layers than shards refused.
TEST(ShardRange, WholeLayersWhenTheOptimizerNeedsThem) {
  const std::vector<std::size_t> layers = {6, 1, 1, 2};  // boundaries 0 6 7 8 10
  auto ranges = [&](int S) {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (int k = 0; k < S; ++k) out.emplace_back(shard_range(10, S, k, layers).offset, shard_range(10, S, k, layers).length);
    return out;
  };
  using R = std::vector<std::pair<std::size_t, std::size_t>>;
  EXPECT_EQ(ranges(1), (R{{0, 10}}));
  EXPECT_EQ(ranges(2), (R{{0, 6}, {6, 4}}));                  // 6 is nearest 5
  EXPECT_EQ(ranges(3), (R{{0, 6}, {6, 1}, {7, 3}}));          // nearest 3.3 is 6; then 7 (one layer left for the last)
  EXPECT_EQ(ranges(4), (R{{0, 6}, {6, 1}, {7, 1}, {8, 2}}));
  EXPECT_EQ(shard_range(10, 2, 0, {2, 2, 2, 2, 2}).length, 4u);  // (4 and 6 equally near 5: the first)
  EXPECT_THROW(shard_range(10, 5, 0, layers), std::invalid_argument);
  EXPECT_THROW(shard_range(11, 2, 0, layers), std::invalid_argument);  // layers of another model
}

TEST(ShardState, BspAveragesTheClockWeightedByBatchAndAppliesOnce) {
  auto cpu = make_cpu_backend(1);
  ShardState s(*cpu, options("bsp", 3, 2), {10.0f, 20.0f});
  const float g0[] = {1, 2}, g1[] = {4, 8}, g2[] = {7, 5};
  EXPECT_TRUE(s.pull_ready(0));
  push(s, 0, 0, 0, 1, g0, sum(g0));
  EXPECT_FALSE(s.pull_ready(1)) << "clock 1 opens only after every worker pushed clock 0";
  EXPECT_EQ(s.why_held(1), "bsp clock 0 still needs pushes from worker 1 (clock 0), worker 2 (clock 0)");
  push(s, 2, 0, 0, 2, g2, sum(g2));
  EXPECT_EQ(s.version(), 0);
  push(s, 1, 0, 0, 1, g1, sum(g1));
  // Mean over 4 samples: (1*g0 + 1*g1 + 2*g2) / 4 = (19/4, 20/4); lr 1.
  EXPECT_FLOAT_EQ(s.current()[0], 10.0f - 19.0f / 4);
  EXPECT_FLOAT_EQ(s.current()[1], 20.0f - 5.0f);
  EXPECT_EQ(s.version(), 1);
  EXPECT_EQ(s.samples_applied(), 4);
  EXPECT_TRUE(s.pull_ready(1));
  EXPECT_EQ(s.staleness_histogram()[0], std::vector<long>{1});
}

// An empty batch's push weighs nothing, whatever its payload, first of its clock or not (first,
// its payload times 0 was the sum: inf or NaN made the clock's mean NaN).
TEST(ShardState, BspTakesAnEmptyBatchsPushAsNothingWhereverItComes) {
  auto cpu = make_cpu_backend(1);
  ShardState s(*cpu, options("bsp", 2, 1), {10.0f});
  const float bad[] = {INFINITY}, one[] = {1};
  push(s, 0, 0, 0, 0, bad, sum(bad));
  push(s, 1, 0, 0, 1, one, sum(one));
  EXPECT_FLOAT_EQ(s.current()[0], 9.0f);
}

TEST(ShardState, BspRejectsDuplicatesAndSkippedClocksWithoutChangingAnything) {
  auto cpu = make_cpu_backend(1);
  ShardState s(*cpu, options("bsp", 2, 1), {5.0f});
  const float g[] = {1};
  push(s, 0, 0, 0, 1, g, sum(g));
  EXPECT_THROW(push(s, 0, 0, 0, 1, g, sum(g)), ProtocolError);  // second push of clock 0
  EXPECT_THROW(push(s, 1, 3, 0, 1, g, sum(g)), ProtocolError);  // not its next clock
  EXPECT_THROW(push(s, 1, 0, 7, 1, g, sum(g)), ProtocolError);  // a version the shard never had
  EXPECT_THROW(push(s, 5, 0, 0, 1, g, sum(g)), ProtocolError);  // not a worker
  EXPECT_EQ(s.version(), 0);
  EXPECT_EQ(s.clock_of(1), 0);
  push(s, 1, 0, 0, 1, g, sum(g));
  EXPECT_EQ(s.version(), 1);
  EXPECT_FLOAT_EQ(s.current()[0], 4.0f);
}

TEST(ShardState, SspGatesPullsOnTheSlowestWorker) {
  auto cpu = make_cpu_backend(1);
  ShardState s(*cpu, options("ssp:1", 2, 1), {0.0f});
  const float g[] = {1};
  // Worker 0 runs ahead; worker 1 stays at clock 0.
  EXPECT_TRUE(s.pull_ready(1));   // 1 - 1 <= min clock 0
  push(s, 0, 0, 0, 1, g, sum(g));
  EXPECT_FALSE(s.pull_ready(2));  // would be 2 clocks ahead of worker 1
  push(s, 1, 0, 0, 1, g, sum(g));          // worker 1 catches up one clock
  EXPECT_TRUE(s.pull_ready(2));
  EXPECT_EQ(s.version(), 2) << "ssp applies each push on arrival";
  EXPECT_FLOAT_EQ(s.current()[0], -2.0f);
}

// A lost worker (cluster.on_worker_loss = "continue"): its clock stops counting, so the pulls it
// held back are served; a later push from it is refused; bsp cannot drop anyone.
TEST(ShardState, ADroppedWorkerNoLongerHoldsSspAndCannotPush) {
  auto cpu = make_cpu_backend(1);
  ShardState s(*cpu, options("ssp:1", 3, 1), {0.0f});
  push_ones(s, {{0, 0, 0}, {1, 0, 1}, {0, 1, 2}});
  EXPECT_FALSE(s.pull_ready(2));  // worker 2 is at clock 0
  EXPECT_NE(s.why_held(2).find("worker 2 (clock 0)"), std::string::npos) << s.why_held(2);
  s.drop_worker(2);
  EXPECT_TRUE(s.dropped(2));
  EXPECT_EQ(s.min_clock(), 1) << "the slowest worker that counts is worker 1";
  EXPECT_TRUE(s.pull_ready(2));
  EXPECT_FALSE(s.pull_ready(3));
  EXPECT_EQ(s.why_held(3).find("worker 2"), std::string::npos) << "a dropped worker is not waited for: " << s.why_held(3);
  EXPECT_THROW(push_ones(s, {{2, 0, 0}}), ProtocolError);
  EXPECT_EQ(s.version(), 3) << "the refused push changed nothing";
  EXPECT_EQ(s.clock_of(2), 0);

  ShardState b(*cpu, options("bsp", 2, 1), {0.0f});
  EXPECT_FALSE(b.mode().trains_without_lost_workers());
  EXPECT_THROW(b.drop_worker(1), std::logic_error);
  EXPECT_TRUE(make_mode("asp")->trains_without_lost_workers());
  EXPECT_TRUE(make_mode("ssp:3")->trains_without_lost_workers());
}

// ---- checkpoints (ps/checkpoint.h) ----

std::string checkpoint_file(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string("pslab-test-") + name + "-" +
                                                    std::to_string(::getpid()) + ".ckpt")).string();
}

// A shard checkpointed mid-run (bsp: with its open clock half accumulated), written, read back
// and restored into a fresh shard with other parameters goes on bitwise like the original, in
// every mode, with a stateful optimizer (adam: m, v and the step count).
TEST(Checkpoint, AShardGoesOnBitwiseFromItsCheckpoint) {
  auto cpu = make_cpu_backend(1);
  for (const char* mode : {"bsp", "ssp:1", "asp"}) {
    SCOPED_TRACE(mode);
    ShardState::Options o = options(mode, 2, 2);
    o.optimizer.kind = "adam";
    o.optimizer.lr = 0.1;
    ShardState a(*cpu, o, {1.0f, -2.0f});
    const float g0[] = {0.5f, 1.5f}, g1[] = {-1.0f, 2.0f}, g2[] = {0.25f, -0.75f};
    push(a, 0, 0, 0, 1, g0, sum(g0));
    push(a, 1, 0, 0, 2, g1, sum(g1));
    push(a, 0, 1, a.version(), 1, g2, sum(g2));  // bsp: clock 1 is open, worker 0's part accumulated
    const std::string path = checkpoint_file("shard");
    ShardCheckpoint c = a.checkpoint();
    c.shard = 0;
    c.num_shards = 1;
    c.config_hash = 42;
    write_checkpoint(path, c);
    const ShardCheckpoint r = read_checkpoint(path);
    std::filesystem::remove(path);
    EXPECT_EQ(r.config_hash, 42u);
    EXPECT_EQ(r.version, a.version());
    EXPECT_EQ(r.optimizer.size(), 2u);
    ShardState b(*cpu, o, {7.0f, 7.0f});
    b.restore(r);
    EXPECT_EQ(b.version(), a.version());
    EXPECT_EQ(b.clock_of(0), 2);
    EXPECT_EQ(b.clock_of(1), 1);
    EXPECT_EQ(b.samples_applied(), a.samples_applied());
    EXPECT_EQ(b.staleness_histogram(), a.staleness_histogram());
    EXPECT_EQ(b.current_checksum(), a.current_checksum());
    for (ShardState* s : {&a, &b}) {  // the same pushes from here on
      push(*s, 1, 1, s->version(), 1, g2, sum(g2));
      push(*s, 0, 2, s->version(), 1, g1, sum(g1));
      push(*s, 1, 2, s->version(), 1, g0, sum(g0));
    }
    EXPECT_EQ(b.version(), a.version());
    EXPECT_EQ(std::memcmp(b.current(), a.current(), 2 * sizeof(float)), 0)
        << a.current()[0] << " " << a.current()[1] << " vs " << b.current()[0] << " " << b.current()[1];
  }
}

// Format 1 (before modes kept their state in the shard) held bsp's open clock as acc_samples and
// acc_empty where format 2 has the kept counts (samples, pushes): it is still read.
TEST(Checkpoint, AFormatOneFileIsReadWithItsOpenClock) {
  auto cpu = make_cpu_backend(1);
  ShardState a(*cpu, options("bsp", 2, 2), {1.0f, 2.0f});
  const float g[] = {0.5f, 1.5f};
  push(a, 0, 0, 0, 3, g, sum(g));  // clock 0 open: 3 samples from one push
  ShardCheckpoint c = a.checkpoint();
  EXPECT_EQ(c.kept_counts, (std::array<long, 2>{3, 1}));
  const std::string path = checkpoint_file("format1");
  for (const std::int64_t acc_empty : {0, 1}) {
    write_checkpoint(path, c);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const std::int64_t format = 1;
    f.seekp(1 * 8), f.write(reinterpret_cast<const char*>(&format), 8);
    f.seekp(13 * 8), f.write(reinterpret_cast<const char*>(&acc_empty), 8);
    std::vector<char> body(std::filesystem::file_size(path) - 256);  // formats 1 and 2: the body's checksum
    f.seekg(256), f.read(body.data(), std::streamsize(body.size()));
    const std::uint64_t body_sum = wire::checksum_bytes(body.data(), body.size());
    f.seekp(kCheckpointChecksumAt), f.write(reinterpret_cast<const char*>(&body_sum), 8);
    f.close();
    const ShardCheckpoint r = read_checkpoint(path);
    EXPECT_EQ(r.kept_counts[0], 3);
    EXPECT_EQ(r.kept_counts[1], acc_empty ? 0 : 1) << "format 1's acc_empty " << acc_empty;
  }
  std::filesystem::remove(path);
}

// A damaged or foreign file is refused, naming the file and what is wrong; a checkpoint of
// another shard or run does not fit.
TEST(Checkpoint, ADamagedOrForeignFileIsRefusedNamingIt) {
  auto cpu = make_cpu_backend(1);
  ShardState a(*cpu, options("asp", 2, 3), {1.0f, 2.0f, 3.0f});
  const std::string path = checkpoint_file("bad");
  write_checkpoint(path, a.checkpoint());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_EQ(::access((path + ".tmp").c_str(), F_OK), -1) << "the temporary file was left";
  auto error_of = [&](const std::string& content) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
    try {
      read_checkpoint(path);
      return std::string("no error");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
  };
  std::string flipped = bytes;
  flipped[flipped.size() - 5] ^= 0x10;
  EXPECT_EQ(error_of(flipped), "checkpoint " + path + ": checksum mismatch (the file is corrupt)");
  EXPECT_NE(error_of(bytes.substr(0, bytes.size() - 4)).find("bytes long, not " + std::to_string(bytes.size()) + " as its header says"),
            std::string::npos);
  EXPECT_EQ(error_of(bytes.substr(0, 100)), "checkpoint " + path + ": truncated header");
  EXPECT_EQ(error_of("PSLABCKQ" + bytes.substr(8)), "checkpoint " + path + ": not a pslab checkpoint");
  EXPECT_EQ(error_of(bytes), "no error");
  const ShardCheckpoint c = read_checkpoint(path);
  std::filesystem::remove(path);
  try {
    read_checkpoint(path);
    ADD_FAILURE() << "a missing file was read";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).find("checkpoint " + path + ": cannot open"), 0u) << e.what();
  }
  ShardState other_range(*cpu, options("asp", 2, 2), {0.0f, 0.0f});
  try {
    other_range.restore(c);
    ADD_FAILURE() << "a checkpoint of another range was restored";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "it holds floats [0, 3), this shard is [0, 2)");
  }
  ShardState other_workers(*cpu, options("asp", 3, 3), {0.0f, 0.0f, 0.0f});
  EXPECT_THROW(other_workers.restore(c), std::invalid_argument);
  EXPECT_EQ(other_workers.version(), 0) << "a refused checkpoint changed nothing";
}

// Every byte of a checkpoint is covered: flipping any one bit of any byte (header, body, padding
// of the header) is refused with an error naming the file; nothing resumes silently different.
TEST(Checkpoint, EveryFlippedByteIsRefused) {
  auto cpu = make_cpu_backend(1);
  ShardState::Options o = options("bsp", 2, 3);
  o.optimizer.kind = "adam";
  ShardState a(*cpu, o, {1.0f, 2.0f, 3.0f});
  const float g[] = {0.5f, 1.5f, -1.0f};
  push(a, 0, 0, 0, 3, g, sum(g));
  const std::vector<char> bytes = encode_checkpoint(a.checkpoint());
  ASSERT_GT(bytes.size(), 256u + 3 * 4 * 3);
  EXPECT_NO_THROW(decode_checkpoint(bytes.data(), bytes.size(), "small.ckpt"));
  for (const unsigned char bit : {0x01, 0x80}) {
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      std::vector<char> flipped = bytes;
      flipped[i] = char(flipped[i] ^ bit);
      try {
        decode_checkpoint(flipped.data(), flipped.size(), "small.ckpt");
        ADD_FAILURE() << "byte " << i << " flipped (bit " << int(bit) << ") was read as a checkpoint";
      } catch (const std::runtime_error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("checkpoint small.ckpt: ", 0), 0u) << e.what();
      }
    }
  }
}

TEST(ShardState, AspNeverHoldsAndMeasuresStaleness) {
  auto cpu = make_cpu_backend(1);
  ShardState s(*cpu, options("asp", 2, 1), {0.0f});
  const float g[] = {1};
  EXPECT_TRUE(s.pull_ready(1000));
  push(s, 0, 0, 0, 1, g, sum(g));  // applied at version 0 on version 0: staleness 0
  push(s, 0, 1, 1, 1, g, sum(g));  // staleness 0
  push(s, 1, 0, 0, 1, g, sum(g));  // computed on version 0, applied at version 2: staleness 2
  EXPECT_EQ(s.staleness_histogram()[0], (std::vector<long>{2}));
  EXPECT_EQ(s.staleness_histogram()[1], (std::vector<long>{0, 0, 1}));
  EXPECT_EQ(s.version(), 3);
}

TEST(ShardState, ACorruptedPushChangesNothingWithEitherKindOfOptimizer) {
  auto cpu = make_cpu_backend(1);
  for (const char* kind : {"sgd", "momentum"}) {
    for (const char* mode : {"asp", "bsp"}) {
      auto o = options(mode, 1, 3);
      o.optimizer.kind = kind;
      ShardState s(*cpu, o, {1.0f, 2.0f, 3.0f});
      const std::uint64_t before = s.current_checksum();
      const float g[] = {1, 1, 1};
      EXPECT_THROW(push(s, 0, 0, 0, 1, g, sum(g) ^ 1), PayloadError) << kind << " " << mode;
      EXPECT_EQ(s.version(), 0);
      EXPECT_EQ(s.clock_of(0), 0);
      EXPECT_EQ(s.current()[0], 1.0f);
      EXPECT_EQ(s.current_checksum(), before);
      // The next good push applies as if the bad one never came (momentum state untouched).
      push(s, 0, 0, 0, 1, g, sum(g));
      EXPECT_FLOAT_EQ(s.current()[0], 0.0f) << kind << " " << mode;
      EXPECT_EQ(s.current_checksum(), wire::checksum(s.current(), 3));
    }
  }
}

// A large shard's update split over threads: bitwise the same θ, checksums and optimizer state
// as one thread, and a corrupted push still changes nothing.
TEST(ShardState, AnUpdateSplitOverThreadsIsBitwiseTheOneThreadUpdate) {
  auto cpu = make_cpu_backend(1);
  const std::size_t n = (std::size_t(1) << 19) + 5;  // 4 slices of whole lines and a ragged end
  std::vector<float> theta(n), g(n);
  Rng r(3);
  for (std::size_t i = 0; i < n; ++i) theta[i] = float(r.uniform() - 0.5), g[i] = float(r.uniform() - 0.5);
  const auto bytes = std::as_bytes(std::span<const float>(g));
  for (const char* kind : {"sgd", "momentum", "adam"}) {
    std::vector<std::vector<float>> results;
    for (int threads : {1, 3, 4}) {
      auto o = options("asp", 1, n);
      o.optimizer.kind = kind;
      o.optimizer.lr = 0.01;
      o.threads = threads;
      ShardState s(*cpu, o, theta);
      EXPECT_EQ(s.current_checksum(), wire::checksum(theta.data(), n));
      EXPECT_THROW(s.push(0, 0, 0, 1, bytes, wire::checksum(g.data(), n) ^ 1), PayloadError);
      EXPECT_EQ(s.version(), 0);
      for (long c = 0; c < 3; ++c) s.push(0, c, c, 1, bytes, wire::checksum(g.data(), n));
      EXPECT_EQ(s.current_checksum(), wire::checksum(s.current(), n)) << kind << " threads " << threads;
      results.emplace_back(s.current(), s.current() + n);
    }
    EXPECT_EQ(results[1], results[0]) << kind;
    EXPECT_EQ(results[2], results[0]) << kind;
    EXPECT_NE(results[0], theta);
  }
}

TEST(Rules, TheRegistryMakesEachModeFromItsName) {
  EXPECT_EQ(make_mode("bsp")->name(), "bsp");
  EXPECT_EQ(make_mode("ssp:3")->name(), "ssp:3");
  EXPECT_EQ(make_mode("asp")->name(), "asp");
  EXPECT_EQ(make_mode("dcasgd:0.04")->name(), "dcasgd:0.04");
  EXPECT_THROW(make_mode("dcasgd:-1"), std::invalid_argument);
  EXPECT_THROW(make_mode("dcasgd:x"), std::invalid_argument);
  EXPECT_THROW(make_mode("ssp"), std::invalid_argument);
  EXPECT_THROW(make_mode("ssp:x"), std::invalid_argument);
  EXPECT_THROW(make_mode("bsp:1"), std::invalid_argument);
  EXPECT_EQ(make_mode("local:4")->name(), "local:4");
  EXPECT_EQ(make_mode("local:4")->worker_protocol().local_steps, 4);
  EXPECT_EQ(make_mode("easgd:0.25")->name(), "easgd:0.25");
  EXPECT_EQ(make_mode("easgd:0.25")->worker_protocol().alpha, 0.25);
  EXPECT_EQ(make_mode("asp")->worker_protocol().kind, WorkerProtocol::Kind::gradient);
  EXPECT_EQ(make_mode("allreduce")->worker_protocol().kind, WorkerProtocol::Kind::allreduce);
  EXPECT_FALSE(make_mode("allreduce")->uses_servers());
  EXPECT_TRUE(make_mode("bsp")->uses_servers());
  for (const char* bad : {"local:0", "local:x", "local", "easgd:0", "easgd:1", "easgd:-0.1", "easgd"})
    EXPECT_THROW(make_mode(bad), std::invalid_argument) << bad;
  try {
    make_mode("gossip");
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "\"gossip\" is not a mode: expected \"allreduce\", \"bsp\", \"ssp:<s>\", \"asp\", \"dcasgd:<lambda>\", "
              "\"local:<H>\" or \"easgd:<alpha>\"");
  }
}

// optimizer.staleness_lr (Zhang et al. 2016): each update's step divided by max(1, staleness).
TEST(ShardState, StalenessAwareStepsDivideEachUpdateByItsStaleness) {
  auto cpu = make_cpu_backend(1);
  for (const char* mode : {"asp", "ssp:5"}) {
    for (bool aware : {false, true}) {
      ShardState::Options o = options(mode, 3, 1);
      o.optimizer.lr = 0.5;
      o.optimizer.staleness_lr = aware;
      ShardState s(*cpu, o, {0.0f});
      const float g[] = {1};
      push(s, 0, 0, 0, 1, g, sum(g));  // staleness 0: -0.5
      push(s, 1, 0, 0, 1, g, sum(g));  // staleness 1: -0.5
      push(s, 2, 0, 0, 1, g, sum(g));  // staleness 2: -0.25 (aware)
      push(s, 0, 1, 1, 1, g, sum(g));  // staleness 2: -0.25 (aware)
      push(s, 1, 1, 4, 1, g, sum(g));  // staleness 0: -0.5
      EXPECT_EQ(s.current()[0], aware ? -2.0f : -2.5f) << mode;
    }
  }
}

// dcasgd:λ (Zheng et al. 2017): g + λ g⊙g⊙(θ now - θ as served to the pusher), by hand.
TEST(ShardState, DcAsgdCompensatesAGradientForTheUpdatesItMissed) {
  auto cpu = make_cpu_backend(1);
  ShardState::Options o = options("dcasgd:0.5", 2, 2);
  o.optimizer.lr = 0.5;
  ShardState s(*cpu, o, {1.0f, 2.0f});
  EXPECT_EQ(s.mode().name(), "dcasgd:0.5");
  s.record_pull(0, 0);
  s.record_pull(1, 0);
  EXPECT_EQ(s.pulled_params_bytes(), 2 * 2 * sizeof(float));  // one shard's copy per worker
  const float g0[] = {2.0f, -1.0f}, g1[] = {1.0f, 1.0f};
  push(s, 0, 0, 0, 1, g0, sum(g0));  // nothing missed: θ = {1, 2} - 0.5 {2, -1} = {0, 2.5}
  EXPECT_EQ(s.current()[0], 0.0f);
  EXPECT_EQ(s.current()[1], 2.5f);
  // worker 1 missed that update: Δ = {-1, 0.5}, g' = {1 + 0.5 (-1), 1 + 0.5 (0.5)} = {0.5, 1.25}
  push(s, 1, 0, 0, 1, g1, sum(g1));
  EXPECT_EQ(s.current()[0], -0.25f);
  EXPECT_EQ(s.current()[1], 1.875f);
  // a push computed on a version this shard did not last serve that worker is refused, unchanged
  s.record_pull(0, 1);  // worker 0 is served version 2
  EXPECT_THROW(push(s, 0, 1, 1, 1, g0, sum(g0)), ProtocolError);
  EXPECT_EQ(s.version(), 2);
  EXPECT_EQ(s.clock_of(0), 1);
  EXPECT_NO_THROW(push(s, 0, 1, 2, 1, g0, sum(g0)));
}

// A copy made from the shard's checkpoint (a backup that joins) holds no served copies: once the
// primary forgets its own, both apply each worker's next push alike (the primary corrected it and
// the backup did not: the two copies of the shard parted).
TEST(ShardState, DcAsgdCopyFromACheckpointAppliesThePushesAsTheOriginal) {
  auto cpu = make_cpu_backend(1);
  ShardState::Options o = options("dcasgd:0.5", 2, 2);
  o.optimizer.lr = 0.5;
  ShardState p(*cpu, o, {1.0f, 2.0f}), b(*cpu, o, {1.0f, 2.0f});
  p.record_pull(0, 0);
  p.record_pull(1, 0);
  const float g0[] = {2.0f, -1.0f}, g1[] = {1.0f, 1.0f};
  push(p, 1, 0, 0, 1, g1, sum(g1));
  b.restore(p.checkpoint());
  p.forget_served();
  push(p, 0, 0, 0, 1, g0, sum(g0));
  push(b, 0, 0, 0, 1, g0, sum(g0));
  EXPECT_EQ(std::memcmp(p.current(), b.current(), 2 * sizeof(float)), 0)
      << p.current()[0] << "," << p.current()[1] << " against " << b.current()[0] << "," << b.current()[1];
}

TEST(ShardState, DcAsgdWithLambdaZeroIsAspBitForBit) {
  auto cpu = make_cpu_backend(1);
  const std::size_t n = 5;
  std::vector<float> init(n);
  for (std::size_t i = 0; i < n; ++i) init[i] = 0.1f * float(i) - 0.3f;
  ShardState a(*cpu, options("asp", 3, n), init), d(*cpu, options("dcasgd:0", 3, n), init);
  long clock[3] = {0, 0, 0}, pulled[3] = {0, 0, 0};
  for (int r = 0; r < 3; ++r) d.record_pull(r, 0);
  for (int step = 0; step < 12; ++step) {
    const int r = (step * 7) % 3;
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(float(step * 13 + int(i))) * 0.7f;
    const auto bytes = std::as_bytes(std::span<const float>(g));
    const auto c = wire::checksum(g.data(), n);
    a.push(r, clock[r], pulled[r], 2, bytes, c);
    d.push(r, clock[r], pulled[r], 2, bytes, c);
    ++clock[r];
    pulled[r] = a.version();
    d.record_pull(r, clock[r]);
  }
  EXPECT_EQ(a.current_checksum(), d.current_checksum());
  EXPECT_EQ(std::memcmp(a.current(), d.current(), n * sizeof(float)), 0);
}

// local:H: a clock's pushes are changes of θ; once all W have arrived the shard adds their
// batch-weighted mean (no optimizer, no learning rate); pulls wait for the average.
TEST(ShardState, LocalSgdAddsTheBatchWeightedMeanOfTheWorkersChanges) {
  auto cpu = make_cpu_backend(1);
  ShardState::Options o = options("local:4", 2, 2);
  o.optimizer.kind = "momentum";  // the servers' optimizer never runs under local:H
  o.optimizer.lr = 7.0;
  ShardState s(*cpu, o, {1.0f, 2.0f});
  const float d0[] = {0.5f, -1.0f}, d1[] = {-0.25f, 2.0f};
  push(s, 0, 0, 0, 1, d0, sum(d0));
  EXPECT_FALSE(s.pull_ready(1));
  EXPECT_EQ(s.current()[0], 1.0f);
  EXPECT_THROW(push(s, 0, 1, 0, 1, d0, sum(d0)), ProtocolError);  // clock 0 is still open
  push(s, 1, 0, 0, 3, d1, sum(d1));  // weights 1 and 3: {1 + (0.5 - 0.75) / 4, 2 + (-1 + 6) / 4}
  EXPECT_TRUE(s.pull_ready(1));
  EXPECT_EQ(s.version(), 1);
  EXPECT_EQ(s.current()[0], 0.9375f);
  EXPECT_EQ(s.current()[1], 3.25f);
  EXPECT_EQ(s.samples_applied(), 4);
  EXPECT_EQ(s.current_checksum(), wire::checksum(s.current(), 2));
  // A corrupted change is refused and changes nothing.
  EXPECT_THROW(push(s, 0, 1, 1, 1, d0, sum(d0) ^ 1), ChecksumError);
  EXPECT_EQ(s.clock_of(0), 1);
}

// easgd (Zhang, Choromanska & LeCun 2015), by hand: two workers, alpha = 0.25, one float.
// Centre c = 1; worker 0 holds θ0 = 3, worker 1 θ1 = -1.
//   worker 0 pulls c = 1:  e0 = 0.25 (3 - 1) = 0.5;   θ0 = 2.5;    the shard: c = 1.5
//   worker 1 pulls c = 1.5: e1 = 0.25 (-1 - 1.5) = -0.625; θ1 = -0.375; c = 0.875
//   worker 0 pulls c = 0.875: e0 = 0.25 (2.5 - 0.875) = 0.40625; θ0 = 2.09375; c = 1.28125
TEST(ShardState, EasgdMovesTheCentreAndEachWorkerTowardEachOther) {
  auto cpu = make_cpu_backend(1);
  ShardState::Options o = options("easgd:0.25", 2, 1);
  o.optimizer.lr = 7.0;  // never used: the pushes are elastic differences
  ShardState s(*cpu, o, {1.0f});
  const float alpha = float(s.mode().worker_protocol().alpha);
  float theta[2] = {3.0f, -1.0f};
  long clock[2] = {0, 0};
  auto exchange = [&](int r) {
    EXPECT_TRUE(s.pull_ready(clock[r]));
    float e[1] = {s.current()[0]};
    const long version = s.version();
    elastic_exchange(&theta[r], e, 1, alpha, 8);
    push(s, r, clock[r]++, version, 8, e, sum(e));
  };
  exchange(0);
  EXPECT_EQ(theta[0], 2.5f);
  EXPECT_EQ(s.current()[0], 1.5f);
  exchange(1);
  EXPECT_EQ(theta[1], -0.375f);
  EXPECT_EQ(s.current()[0], 0.875f);
  exchange(0);
  EXPECT_EQ(theta[0], 2.09375f);
  EXPECT_EQ(s.current()[0], 1.28125f);
  EXPECT_EQ(s.version(), 3);
  EXPECT_EQ(s.samples_applied(), 24);
  // An elastic exchange moves θ and c by opposite amounts: θ0 + θ1 + c is what it was.
  EXPECT_EQ(theta[0] + theta[1] + s.current()[0], 3.0f);
  // ... also at a period of empty batches (an uneven shard's epoch end), which the shard applies as
  // nothing: the worker moved by e, c did not.
  float e[1] = {s.current()[0]};
  elastic_exchange(&theta[1], e, 1, alpha, 0);
  push(s, 1, clock[1]++, s.version(), 0, e, sum(e));
  EXPECT_EQ(theta[0] + theta[1] + s.current()[0], 3.0f);
}

TEST(Rules, TheLearningRatesBatchIsWhatOneUpdateAverages) {
  EXPECT_EQ(make_mode("bsp")->update_batch(64, 4), 256);
  EXPECT_EQ(make_mode("local:4")->update_batch(64, 4), 256);
  EXPECT_EQ(make_mode("easgd:0.2")->update_batch(64, 4), 64);
  EXPECT_EQ(make_mode("ssp:2")->update_batch(64, 4), 64);
  EXPECT_EQ(make_mode("asp")->update_batch(64, 4), 64);
}

TEST(Rules, AHeldSspPullNamesTheWorkersBehind) {
  auto cpu = make_cpu_backend(1);
  ShardState s(*cpu, options("ssp:1", 3, 1), {0.0f});
  push_ones(s, {{0, 0, 0}, {0, 1, 1}, {1, 0, 0}});
  EXPECT_FALSE(s.pull_ready(2));
  EXPECT_EQ(s.why_held(2), "ssp:1 needs every worker at clock >= 1; behind: worker 2 (clock 0)");
}

// A mode is made once per process and shared (it is immutable: what changes lives in the shard);
// a mode without servers makes no shard.
TEST(Rules, AModeIsMadeOnceAndAModeWithoutServersMakesNoShard) {
  EXPECT_EQ(&mode_of("ssp:2"), &mode_of("ssp:2"));
  EXPECT_NE(&mode_of("ssp:2"), &mode_of("ssp:3"));
  EXPECT_THROW(mode_of("ssp:x"), std::invalid_argument);
  EXPECT_THROW(mode_of("ssp:x"), std::invalid_argument) << "a failed spec is not kept";
  auto cpu = make_cpu_backend(1);
  EXPECT_THROW(ShardState(*cpu, options("allreduce", 2, 1), {0.0f}), std::invalid_argument);
}

// Defect: a push of an empty batch (possible at the end of an epoch, sampler.h) used to be
// applied like any other, so momentum, Adam or weight decay moved θ and the version advanced.
TEST(ShardState, AnEmptyBatchPushChangesNothingButTheWorkersClock) {
  auto cpu = make_cpu_backend(1);
  for (const char* mode : {"asp", "ssp:1"}) {
    auto o = options(mode, 1, 2);
    o.optimizer.kind = "momentum";
    o.optimizer.momentum = 0.9;
    ShardState s(*cpu, o, {1.0f, 2.0f});
    const float g[] = {1, 1}, zero[] = {0, 0};
    push(s, 0, 0, 0, 1, g, sum(g));  // momentum now holds a velocity
    const std::vector<float> before(s.current(), s.current() + 2);
    push(s, 0, 1, 1, 0, zero, sum(zero));
    EXPECT_EQ(std::vector<float>(s.current(), s.current() + 2), before) << mode;
    EXPECT_EQ(s.version(), 1) << mode;
    EXPECT_EQ(s.clock_of(0), 2) << mode;
    EXPECT_EQ(s.samples_applied(), 1) << mode;
    EXPECT_THROW(push(s, 0, 2, 1, 0, zero, sum(zero) ^ 1), PayloadError) << "an empty push is still checked";
  }
}

TEST(ShardState, ABspClockWithoutSamplesAdvancesTheVersionButNotTheta) {
  auto cpu = make_cpu_backend(1);
  auto o = options("bsp", 2, 1);
  o.optimizer.kind = "momentum";
  ShardState s(*cpu, o, {1.0f});
  const float g[] = {1}, zero[] = {0};
  push(s, 0, 0, 0, 1, g, sum(g));
  push(s, 1, 0, 0, 1, g, sum(g));
  ASSERT_EQ(s.version(), 1);
  const float after_one = s.current()[0];
  push(s, 0, 1, 1, 0, zero, sum(zero));
  push(s, 1, 1, 1, 0, zero, sum(zero));
  EXPECT_EQ(s.version(), 2) << "the clock advances, so pulls for clock 2 are served";
  EXPECT_TRUE(s.pull_ready(2));
  EXPECT_EQ(s.current()[0], after_one);
}

TEST(ParamVersions, UpdatesNeverWriteABufferThatASendStillReferences) {
  ParamVersions v({1.0f, 2.0f});
  ParamVersions::Buffer* sent = v.acquire_current();  // a pull reply in flight
  const float* old = v.current();
  float* next = v.next();
  EXPECT_NE(next, old);
  next[0] = 9.0f, next[1] = 9.0f;
  v.publish();
  EXPECT_EQ(old[0], 1.0f) << "the in-flight version is untouched";
  ParamVersions::Buffer* sent2 = v.acquire_current();
  float* third = v.next();  // both older buffers are referenced: a third is allocated
  EXPECT_NE(third, old);
  EXPECT_NE(third, v.current());
  EXPECT_EQ(v.buffers(), 3u);
  ParamVersions::release(sent);
  ParamVersions::release(sent2);
  v.publish();
  EXPECT_EQ(v.next(), old) << "released buffers are reused";
}

// ---- pushes in pieces (ps/pieces.h) ----

// Pushes in pieces of 16 floats (a shard of 100: 7 pieces, the last of 4).
ShardState::Options in_pieces(ShardState::Options o) {
  o.pieces = Pieces{16};
  return o;
}

// What the shard told its listener, in order.
struct Heard : ShardState::Listener {
  std::vector<std::pair<int, std::size_t>> pieces;  // (worker, piece) applied
  std::vector<ShardState::Done> ended;
  void piece_applied(int worker, std::size_t piece) override { pieces.emplace_back(worker, piece); }
  void push_ended(const ShardState::Done& d) override { ended.push_back(d); }
  // The pushes that ended, applied, in order; rethrows the first refusal.
  std::vector<int> applied() const {
    std::vector<int> w;
    for (const auto& d : ended) {
      if (d.error) std::rethrow_exception(d.error);
      if (!d.abandoned) w.push_back(d.worker);
    }
    return w;
  }
};

// Pieces [from, to) of one push, as the server hands them over (the payload stays valid: `g`).
void push_in_pieces(ShardState& s, Heard& heard, int worker, long clock, long version_pulled, int batch,
                    const std::vector<float>& g, std::size_t from = 0, std::size_t to = std::size_t(-1)) {
  const Pieces cut = s.options().pieces;
  const std::size_t n = s.options().range.length, P = s.pieces();
  for (std::size_t q = from; q < std::min(to, P); ++q) {
    const std::span<const float> piece(g.data() + cut.begin(n, q), cut.size(n, q));
    s.push_piece({worker, clock, version_pulled, batch, q, P}, std::as_bytes(piece), wire::checksum(piece.data(), piece.size()),
                 heard);
  }
}

std::vector<float> gradient(int worker, long clock, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(float(i * 7 + std::size_t(worker) * 13 + std::size_t(clock) * 3)) * 0.1f;
  return g;
}

// Every mode, with a stateless and a stateful optimizer: a push in pieces (streamed or
// gathered) leaves the shard bit for bit as the same push whole, with the same version,
// clocks, samples and checksums.
TEST(Pieces, EveryModeEqualsWholePushesBitForBit) {
  for (const char* mode : {"asp", "ssp:1", "dcasgd:0.5", "easgd:0.25", "bsp", "local:2"})
    for (const char* opt : {"sgd", "momentum", "adam"}) {
      ShardState::Options o = options(mode, 2, 100);
      o.optimizer.kind = opt;
      o.optimizer.lr = 0.05;
      auto cpu = make_cpu_backend(1);
      std::vector<float> init(100);
      for (std::size_t i = 0; i < 100; ++i) init[i] = float(i) * 0.01f;
      ShardState whole(*cpu, o, init), cut(*cpu, in_pieces(o), init);
      ASSERT_EQ(cut.pieces(), 7u);
      for (long c = 0; c < 6; ++c)
        for (int w = 0; w < 2; ++w) {
          const std::vector<float> g = gradient(w, c, 100);
          const int batch = c == 3 ? 0 : 1 + w;  // an empty batch too
          whole.record_pull(w, c), cut.record_pull(w, c);
          whole.push(w, c, whole.version(), batch, std::as_bytes(std::span<const float>(g)), wire::checksum(g.data(), 100));
          Heard heard;
          push_in_pieces(cut, heard, w, c, cut.version(), batch, g);
          ASSERT_EQ(heard.applied(), std::vector<int>{w}) << mode;
          EXPECT_EQ(heard.pieces.size(), 7u) << mode;
        }
      EXPECT_EQ(std::memcmp(whole.current(), cut.current(), 400), 0) << mode << " " << opt;
      EXPECT_EQ(whole.version(), cut.version()) << mode;
      EXPECT_EQ(whole.samples_applied(), cut.samples_applied()) << mode;
      EXPECT_EQ(whole.clock_of(1), cut.clock_of(1)) << mode;
      EXPECT_EQ(whole.current_checksum(), cut.current_checksum()) << mode;
      EXPECT_EQ(cut.current_checksum(), wire::checksum(cut.current(), 100)) << mode;
      for (std::size_t q = 0; q < 7; ++q)
        EXPECT_EQ(cut.piece_checksum(q), wire::checksum(cut.current() + q * 16, q < 6 ? 16 : 4)) << mode << " piece " << q;
      EXPECT_EQ(whole.checkpoint().optimizer_steps, cut.checkpoint().optimizer_steps) << mode;
    }
}

// Worker 0's push streams; worker 1's pieces, interleaved with it, wait (held, not copied) and
// are applied after it. Pulls in between see the version before, whole; the result is the two
// pushes applied whole in that order.
TEST(Pieces, InterleavedPushesApplyInOrderAndNoPullSeesATornVersion) {
  auto cpu = make_cpu_backend(1);
  const std::vector<float> init(100, 1.0f);
  ShardState whole(*cpu, options("asp", 2, 100), init), cut(*cpu, in_pieces(options("asp", 2, 100)), init);
  const std::vector<float> g0 = gradient(0, 0, 100), g1 = gradient(1, 0, 100);
  Heard heard;
  push_in_pieces(cut, heard, 0, 0, 0, 1, g0, 0, 3);
  EXPECT_EQ(cut.applying(), 0);
  push_in_pieces(cut, heard, 1, 0, 0, 1, g1, 0, 7);
  EXPECT_TRUE(heard.ended.empty()) << "worker 1's push waits for worker 0's";
  EXPECT_EQ(heard.pieces.size(), 3u) << "worker 0's pieces are applied as they come";
  EXPECT_EQ(cut.version(), 0);
  EXPECT_EQ(std::vector<float>(cut.current(), cut.current() + 100), init) << "the current version is untouched";
  EXPECT_EQ(cut.current_checksum(), wire::checksum(init.data(), 100));
  push_in_pieces(cut, heard, 0, 0, 0, 1, g0, 3);
  EXPECT_EQ(heard.applied(), (std::vector<int>{0, 1}));
  whole.push(0, 0, 0, 1, std::as_bytes(std::span<const float>(g0)), wire::checksum(g0.data(), 100));
  whole.push(1, 0, 0, 1, std::as_bytes(std::span<const float>(g1)), wire::checksum(g1.data(), 100));
  EXPECT_EQ(std::memcmp(whole.current(), cut.current(), 400), 0);
  EXPECT_EQ(cut.version(), 2);
  EXPECT_EQ(cut.staleness_histogram(), whole.staleness_histogram());
}

// bsp (applied once every piece came, each checked as it came): a bad piece refuses the push
// before anything changed.
TEST(Pieces, APushAppliedWholeIsCheckedPieceByPiece) {
  auto cpu = make_cpu_backend(1);
  ShardState s(*cpu, in_pieces(options("bsp", 2, 100)), std::vector<float>(100, 1.0f));
  Heard heard;
  push_in_pieces(s, heard, 0, 0, 0, 1, gradient(0, 0, 100), 0, 6);
  EXPECT_TRUE(heard.pieces.empty()) << "nothing applied before the last piece";
  const float bad[4] = {};
  s.push_piece({0, 0, 0, 1, 6, 7}, std::as_bytes(std::span<const float>(bad)), 12345, heard);
  ASSERT_FALSE(heard.ended.empty());
  EXPECT_THROW(heard.applied(), ChecksumError);
  EXPECT_EQ(s.clock_of(0), 0);
  EXPECT_EQ(s.checkpoint().kept_counts[1], 0) << "the clock's sum untouched";
}

// A piece beyond its push's count (a whole push is piece 0 of 1), from a worker whose whole push
// waits behind another's in pieces: refused, nothing written past the push's pieces, and the
// pushes go on as if it had not come.
TEST(Pieces, APieceBeyondItsPushsCountIsRefused) {
  auto cpu = make_cpu_backend(1);
  const std::vector<float> init(100, 1.0f);
  ShardState s(*cpu, in_pieces(options("asp", 2, 100)), init), whole(*cpu, options("asp", 2, 100), init);
  const std::vector<float> g0 = gradient(0, 0, 100), g1 = gradient(1, 0, 100);
  const auto bytes1 = std::as_bytes(std::span<const float>(g1));
  Heard heard;
  push_in_pieces(s, heard, 0, 0, 0, 1, g0, 0, 3);
  s.push_piece({1, 0, 0, 1, 0, 1}, bytes1, wire::checksum(g1.data(), 100), heard);  // whole: waits
  ASSERT_TRUE(heard.ended.empty());
  for (std::size_t piece : {std::size_t(1), std::size_t(9), std::size_t(1) << 31}) {
    heard = Heard{};
    s.push_piece({1, 0, 0, 1, piece, 1}, bytes1, wire::checksum(g1.data(), 100), heard);
    EXPECT_THROW(heard.applied(), ProtocolError) << "piece " << piece << " of 1";
  }
  s.push_piece({1, 0, 0, 1, 3, 2}, bytes1, wire::checksum(g1.data(), 100), heard);
  EXPECT_THROW(heard.applied(), ProtocolError) << "piece 3 of 2";
  heard = Heard{};
  push_in_pieces(s, heard, 0, 0, 0, 1, g0, 3);
  EXPECT_EQ(heard.applied(), std::vector<int>{0}) << "worker 1's whole push was abandoned with its bad piece";
  s.push_piece({1, 0, 0, 1, 0, 1}, bytes1, wire::checksum(g1.data(), 100), heard);  // sent again: applied
  EXPECT_EQ(heard.applied(), (std::vector<int>{0, 1}));
  whole.push(0, 0, 0, 1, std::as_bytes(std::span<const float>(g0)), wire::checksum(g0.data(), 100));
  whole.push(1, 0, 0, 1, bytes1, wire::checksum(g1.data(), 100));
  EXPECT_EQ(std::memcmp(whole.current(), s.current(), 400), 0);
}

// A bad piece, a piece out of order, or a lost worker abandons its push: nothing of it applied,
// and pushes waiting behind it go on.
TEST(Pieces, AnAbandonedPushLeavesNoTrace) {
  auto cpu = make_cpu_backend(1);
  const std::vector<float> init(100, 1.0f);
  ShardState s(*cpu, in_pieces(options("asp", 2, 100)), init);
  std::vector<float> g = gradient(0, 0, 100);
  Heard heard;
  push_in_pieces(s, heard, 0, 0, 0, 1, g, 0, 3);
  const float bad[16] = {};
  s.push_piece({0, 0, 0, 1, 3, 7}, std::as_bytes(std::span<const float>(bad)), 12345, heard);
  EXPECT_THROW(heard.applied(), ChecksumError);
  EXPECT_EQ(s.applying(), -1);
  EXPECT_EQ(s.version(), 0);
  EXPECT_EQ(s.clock_of(0), 0);
  EXPECT_EQ(std::vector<float>(s.current(), s.current() + 100), init);
  heard = Heard{};
  push_in_pieces(s, heard, 0, 0, 0, 1, g, 1, 2);
  EXPECT_THROW(heard.applied(), ProtocolError) << "a piece without its first";
  heard = Heard{};
  push_in_pieces(s, heard, 0, 0, 0, 1, g, 0, 2);
  push_in_pieces(s, heard, 0, 0, 0, 1, g, 3, 4);
  EXPECT_THROW(heard.applied(), ProtocolError) << "piece 3 after piece 1";
  EXPECT_EQ(s.version(), 0);
  heard = Heard{};
  push_in_pieces(s, heard, 0, 0, 0, 1, g);
  EXPECT_EQ(heard.applied(), std::vector<int>{0}) << "the push sent again from its first piece";
  EXPECT_EQ(s.version(), 1);
  // Worker 1 streams and is lost half-way; worker 0's push waiting behind it is applied then.
  heard = Heard{};
  const std::vector<float> g1 = gradient(1, 0, 100), g01 = gradient(0, 1, 100);
  push_in_pieces(s, heard, 1, 0, 1, 1, g1, 0, 4);
  push_in_pieces(s, heard, 0, 1, 1, 1, g01);
  EXPECT_TRUE(heard.ended.empty());
  s.abandon_push(1, heard);
  s.drop_worker(1);
  ASSERT_EQ(heard.ended.size(), 2u);
  EXPECT_TRUE(heard.ended[0].abandoned);
  EXPECT_EQ(heard.applied(), std::vector<int>{0});
  EXPECT_EQ(s.version(), 2);
  EXPECT_EQ(s.clock_of(1), 0);
}

}  // namespace
