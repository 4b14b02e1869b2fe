// Push codecs (ps/codecs/): the registry, f32 round trips and refusals, a misaligned dense
// payload, and the bytes a server counts per codec.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "comm/wire.h"
#include "core/rng.h"
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
    const auto c = e.make(e.takes_argument ? "0.5" : "");
    EXPECT_TRUE(ids.insert(c->wire_id()).second) << e.name << " reuses wire id " << int(c->wire_id());
  }
  try {
    make_codec("f8");
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("\"f8\" is not a push codec: expected \"f32\", \"f16\", \"bf16\", \"int8\", "
                                          "\"topk:<f>\" or \"sign\"", 0), 0u)
        << e.what();
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

// Each 16-bit codec: exact where the value is representable, within its rounding bound where
// it is not, half the bytes, and a payload of the wrong size refused.
TEST(Codecs, SixteenBitCodecsRoundWithinTheirBoundsInHalfTheBytes) {
  for (const auto& [name, bound, tiny] : {std::tuple{"f16", 0x1p-11, 0x1p-14}, std::tuple{"bf16", 0x1p-8, 0x1p-126}}) {
    auto c = make_codec(name);
    EXPECT_FALSE(c->dense_f32());
    std::vector<float> g = {1.5f, -0.25f, 0.0f, -2048.0f};  // exact in both
    Rng rng(7);
    for (int i = 0; i < 4000; ++i) g.push_back(float(rng.normal() * std::pow(10.0, rng.uniform() * 8 - 4)));
    std::vector<std::byte> buf(c->max_bytes(g.size()));
    ASSERT_EQ(buf.size(), g.size() * 2) << name;
    ASSERT_EQ(c->encode(g.data(), g.size(), buf.data()), buf.size());
    std::vector<float> back(g.size());
    c->decode(buf, g.size(), back.data());
    for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(back[i], g[i]) << name;
    long checked = 0;
    for (std::size_t i = 4; i < g.size(); ++i) {
      const double a = std::abs(double(g[i]));
      if (a < tiny || a > 60000) continue;  // subnormal or saturated range: not this bound
      EXPECT_LE(std::abs(double(back[i]) - g[i]), bound * a) << name << " " << g[i] << " -> " << back[i];
      ++checked;
    }
    EXPECT_GT(checked, 3000) << name;
    EXPECT_THROW(c->decode(std::span<const std::byte>(buf).first(buf.size() - 1), g.size(), back.data()), PayloadError);
    // non-finite stays so; f16 saturates large finite values instead of making them infinite
    const std::vector<float> odd = {std::numeric_limits<float>::infinity(), std::nanf(""), 1e6f, -1e6f};
    std::vector<std::byte> ob(c->max_bytes(4));
    c->encode(odd.data(), 4, ob.data());
    std::vector<float> ob_back(4);
    c->decode(ob, 4, ob_back.data());
    EXPECT_TRUE(std::isinf(ob_back[0])) << name;
    EXPECT_TRUE(std::isnan(ob_back[1])) << name;
    if (std::string(name) == "f16") EXPECT_EQ(ob_back[2], 65504.0f);
    else EXPECT_NEAR(ob_back[3], -1e6, 1e6 * 0x1p-8);
  }
  // f16's integer conversion is the compiler's IEEE conversion (_Float16), bit for bit, both
  // ways, across binary16's normal and subnormal ranges and its rounding ties
  auto c = make_codec("f16");
  Rng rng(11);
  std::vector<float> g;
  for (int i = 0; i < 20000; ++i) g.push_back(float(rng.normal() * std::pow(2.0, rng.uniform() * 44 - 30)));
  for (std::uint32_t h = 0; h < 0x7c00; h += 7) {  // just above each of many binary16 values: a rounding decision
    _Float16 v;
    const std::uint16_t b = std::uint16_t(h);
    std::memcpy(&v, &b, 2);
    g.push_back(float(v) * 1.0000001f);
  }
  std::vector<std::byte> buf(c->max_bytes(g.size()));
  c->encode(g.data(), g.size(), buf.data());
  std::vector<float> back(g.size());
  c->decode(buf, g.size(), back.data());
  long differ = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const _Float16 ref = static_cast<_Float16>(std::clamp(g[i], -65504.0f, 65504.0f));
    std::uint16_t mine, theirs;
    std::memcpy(&mine, buf.data() + 2 * i, 2);
    std::memcpy(&theirs, &ref, 2);
    differ += mine != theirs || back[i] != float(ref);
  }
  EXPECT_EQ(differ, 0);
}

// bsp with 16-bit pushes: θ within their rounding of the f32 run's, each push half the bytes.
TEST(Codecs, BspWithSixteenBitPushesTracksTheF32Run) {
  std::map<std::string, std::vector<float>> theta;
  for (const char* codec : {"f32", "f16", "bf16", "topk:1"}) {
    ExperimentConfig cfg = test::small_config("bsp", 2, 2);
    cfg.cluster.codec = codec;
    const auto dir = test::temp_dir(std::string("codec_") + codec);
    test::Cluster cluster(cfg, false, /*wait_for_shutdown=*/true);
    test::run_ps_workers(cfg, cluster, dir);
    PsClient probe(*cluster.transport, cluster.endpoints, client_options(cfg, wire::Role::evaluator, wire::kEvaluator));
    probe.connect();
    const std::size_t P = count_params(model_spec(cfg));
    long bytes = 0;
    for (int k = 0; k < 2; ++k) bytes += nlohmann::json::parse(probe.stats(k))["pushed"][codec]["payload_bytes"].get<long>();
    const std::string name = codec;
    const long per_push = name == "f32" ? long(P * 4) : name == "topk:1" ? long(P * 8 + 2 * 4) : long(P * 2);
    EXPECT_EQ(bytes, 2 * cfg.train.steps * per_push) << codec;
    probe.shutdown();
    cluster.join();
    cluster.rethrow();
    theta[codec] = cluster.params();
    std::filesystem::remove_all(dir);
  }
  double scale = 0;
  for (float v : theta["f32"]) scale = std::max(scale, double(std::abs(v)));
  // (How far the runs drift apart depends on the BLAS kernels too: OpenBLAS's Zen kernels left
  // f16 within 0.1% of f32, its Prescott kernels (an Intel VM whose CPU it does not recognise)
  // 0.67%; bf16 rounds 8x coarser than f16.)
  for (const auto& [codec, tol] : {std::pair{"f16", 1e-2}, std::pair{"bf16", 1e-2}}) {
    double worst = 0;
    for (std::size_t i = 0; i < theta["f32"].size(); ++i)
      worst = std::max(worst, std::abs(double(theta[codec][i]) - theta["f32"][i]));
    EXPECT_LT(worst, tol * scale) << codec << ": worst |Δθ| " << worst << " of max |θ| " << scale;
    EXPECT_GT(worst, 0.0) << codec << " gave f32's θ bit for bit: was it used?";
  }
  // topk:1 sends every entry: the servers apply f32's gradients, so θ is f32's bit for bit
  EXPECT_EQ(std::memcmp(theta["topk:1"].data(), theta["f32"].data(), theta["f32"].size() * sizeof(float)), 0);
}

std::vector<float> round_trip(PushCodec& c, const std::vector<float>& g) {
  std::vector<std::byte> buf(c.max_bytes(g.size()));
  const std::size_t n = c.encode(g.data(), g.size(), buf.data());
  EXPECT_LE(n, buf.size()) << c.name();
  std::vector<float> back(g.size());
  c.decode(std::span<const std::byte>(buf).first(n), g.size(), back.data());
  return back;
}

TEST(Codecs, TopKKeepsTheLargestEntriesAndRefusesAPayloadThatIsNotOne) {
  auto c = make_codec("topk:0.25");
  EXPECT_TRUE(c->wants_error_feedback());
  const std::vector<float> g = {0.1f, -5.0f, 0.2f, 3.0f, -0.3f, 0.0f, 1.0f, -0.05f};  // k = 2
  EXPECT_EQ(round_trip(*c, g), (std::vector<float>{0, -5.0f, 0, 3.0f, 0, 0, 0, 0}));
  EXPECT_EQ(round_trip(*make_codec("topk:1"), g), g);
  // topk:0.01 pushes at most 5% of f32's bytes (2% and a count)
  EXPECT_LE(make_codec("topk:0.01")->max_bytes(117573), std::size_t(0.05 * 4 * 117573));
  std::vector<std::byte> buf(c->max_bytes(g.size()));
  const std::size_t n = c->encode(g.data(), g.size(), buf.data());
  std::vector<float> out(g.size());
  auto refused = [&](std::vector<std::byte> bad) {
    EXPECT_THROW(c->decode(bad, g.size(), out.data()), PayloadError);
  };
  refused(std::vector<std::byte>(buf.begin(), buf.begin() + long(n) - 1));  // cut short
  std::vector<std::byte> far(buf.begin(), buf.begin() + long(n));
  const std::uint32_t nine = 9;  // an index past the slice
  std::memcpy(far.data() + 4, &nine, 4);
  refused(far);
  std::vector<std::byte> many(buf.begin(), buf.begin() + long(n));
  const std::uint32_t lots = 100;  // more pairs than entries
  std::memcpy(many.data(), &lots, 4);
  refused(many);
  EXPECT_THROW(make_codec("topk:0"), std::invalid_argument);
  EXPECT_THROW(make_codec("topk:1.5"), std::invalid_argument);
  // NaN counts as the largest (a comparator NaN made no ordering of was undefined behaviour): it
  // goes, and the server refuses the push for it.
  const float nan = std::nanf("");
  const std::vector<float> with_nan = {0.1f, nan, 0.2f, 3.0f, -0.3f, 0.0f, 1.0f, -0.05f};
  const auto kept = round_trip(*c, with_nan);
  EXPECT_TRUE(std::isnan(kept[1]));
  EXPECT_EQ(kept[3], 3.0f);
}

TEST(Codecs, Int8AndSignStayWithinTheirBounds) {
  Rng rng(3);
  std::vector<float> g(1000);
  for (float& x : g) x = float(rng.normal());
  float most = 0, mean = 0;
  for (float x : g) most = std::max(most, std::abs(x)), mean += std::abs(x) / float(g.size());
  const auto q = round_trip(*make_codec("int8"), g);
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_LE(std::abs(q[i] - g[i]), most / 127 / 2 * 1.0001f);
  const auto s = round_trip(*make_codec("sign"), g);
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_FLOAT_EQ(s[i], std::signbit(g[i]) ? -mean : mean);
  EXPECT_EQ(make_codec("sign")->max_bytes(1000), 4u + 125u);
  EXPECT_TRUE(make_codec("sign")->wants_error_feedback());
  EXPECT_FALSE(make_codec("int8")->wants_error_feedback());
  std::vector<std::byte> bad(4 + 1000);
  const float nan = std::nanf("");
  std::memcpy(bad.data(), &nan, 4);
  std::vector<float> out(1000);
  EXPECT_THROW(make_codec("int8")->decode(bad, 1000, out.data()), PayloadError);  // a scale that is not one
  EXPECT_THROW(make_codec("sign")->decode(bad, 1000, out.data()), PayloadError);  // the wrong size
  // Denormal gradients: most / 127 rounded to a scale of 0, which its own decode refused.
  const std::vector<float> tiny = {5e-44f, -2e-44f, 0.0f};
  EXPECT_NO_THROW(round_trip(*make_codec("int8"), tiny));
}

// Error feedback conserves mass exactly: what was sent, plus what the encoder still owes,
// equals every gradient added up (integer-valued, so every sum is exact in float).
TEST(Codecs, ErrorFeedbackConservesMassExactly) {
  for (const char* name : {"topk:0.25", "sign", "int8"}) {
    auto c = with_error_feedback(make_codec(name));
    EXPECT_EQ(c->name(), name);
    const std::size_t n = 16;
    std::vector<double> total(n, 0.0), sent(n, 0.0);
    Rng rng(5);
    for (int step = 0; step < 40; ++step) {
      std::vector<float> g(n);
      for (float& x : g) x = float(int(rng.uniform() * 17) - 8);
      for (std::size_t i = 0; i < n; ++i) total[i] += g[i];
      const auto out = round_trip(*c, g);
      for (std::size_t i = 0; i < n; ++i) sent[i] += out[i];
    }
    const std::vector<float>& owed = *c->residual();
    for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(sent[i] + owed[i], total[i], std::string(name) == "topk:0.25" ? 0.0 : 1e-3) << name << " " << i;
  }
  EXPECT_EQ(make_codec("topk:0.25")->residual(), nullptr);
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
