// Push codecs (ps/codecs/): the registry, f32 round trips and refusals, a misaligned dense
// payload, and the bytes a server counts per codec.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "comm/wire.h"
#include "harness.h"
#include "ps/codecs/codec.h"
#include "ps/shard_state.h"
#include "run/setup.h"

using namespace pslab;

namespace {

std::span<const std::byte> bytes_of(const std::vector<float>& v) { return std::as_bytes(std::span<const float>(v)); }

TEST(Codecs, TheRegistryMakesEachByNameAndEveryWireIdIsItsOwn) {
  EXPECT_EQ(make_codec("f32")->name(), "f32");
  EXPECT_EQ(make_codec("f32")->wire_id(), 0) << "0 is dense float32 on the wire";
  std::set<int> ids;
  for (const auto& e : codec_registry().entries()) {
    const auto c = e.make("");
    EXPECT_TRUE(ids.insert(c->wire_id()).second) << e.name << " reuses wire id " << int(c->wire_id());
  }
  try {
    make_codec("f8");
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("\"f8\" is not a push codec: expected \"f32\"", 0), 0u) << e.what();
  }
}

TEST(Codecs, F32RoundTripsBitwiseAndRefusesAPayloadOfTheWrongSize) {
  auto c = make_codec("f32");
  ASSERT_TRUE(c->dense_f32());
  const std::vector<float> g = {1.5f, -0.0f, 3e-38f, 7.25f, -1e30f};
  std::vector<std::byte> buf(c->max_bytes(g.size()));
  ASSERT_EQ(buf.size(), 20u);
  ASSERT_EQ(c->encode(g.data(), g.size(), buf.data()), 20u);
  std::vector<float> back(g.size());
  c->decode(buf, g.size(), back.data());
  EXPECT_EQ(std::memcmp(back.data(), g.data(), 20), 0);
  EXPECT_THROW(c->decode(std::span<const std::byte>(buf).first(19), g.size(), back.data()), PayloadError);
}

TEST(Codecs, AMisalignedDensePayloadIsAppliedAsAnAlignedOne) {
  auto cpu = make_cpu_backend(1);
  ShardState::Options o;
  o.mode = "asp";
  o.range = {0, 3};
  o.optimizer.lr = 1.0;
  ShardState aligned(*cpu, o, {1, 2, 3}), shifted(*cpu, o, {1, 2, 3});
  const std::vector<float> g = {0.5f, 0.25f, -1.0f};
  const std::uint64_t sum = wire::checksum(g.data(), g.size());
  aligned.push(0, 0, 0, 1, bytes_of(g), sum);
  std::vector<std::byte> raw(1 + 12);
  std::memcpy(raw.data() + 1, g.data(), 12);
  shifted.push(0, 0, 0, 1, std::span<const std::byte>(raw).subspan(1), sum);
  EXPECT_EQ(std::memcmp(aligned.current(), shifted.current(), 12), 0);
  EXPECT_EQ(shifted.current()[2], 4.0f);
  std::memcpy(raw.data() + 1 + 4, g.data(), 4);  // corrupt it: still refused
  EXPECT_THROW(shifted.push(0, 1, 1, 1, std::span<const std::byte>(raw).subspan(1), sum), ChecksumError);
}

TEST(Codecs, TheServerCountsAcceptedPushesAndTheirBytesPerCodec) {
  const ExperimentConfig cfg = test::small_config("asp", 2, 2);
  const auto dir = test::temp_dir("codec_bytes");
  test::Cluster cluster(cfg, false, /*wait_for_shutdown=*/true);
  test::run_ps_workers(cfg, cluster, dir);
  const std::size_t P = count_params(model_spec(cfg));
  PsClient probe(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::evaluator, wire::kEvaluator));
  probe.connect();
  long bytes = 0;
  for (int k = 0; k < 2; ++k) {
    const auto stats = nlohmann::json::parse(probe.stats(k));
    const auto& f32 = stats["pushed"]["f32"];
    EXPECT_EQ(f32["pushes"], 2 * cfg.train.steps) << stats.dump();
    bytes += f32["payload_bytes"].get<long>();
  }
  EXPECT_EQ(bytes, 2 * cfg.train.steps * long(P * sizeof(float))) << "every push carries the whole gradient once";
  probe.shutdown();
  cluster.join();
  cluster.rethrow();
  std::filesystem::remove_all(dir);
}

}  // namespace
