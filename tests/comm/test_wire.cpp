// Wire headers: every message type round-trips; malformed frames are refused with a reason;
// the payload checksum catches flipped bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "core/rng.h"
#include "comm/wire.h"
#include "wire_generated.h"

using namespace pslab;
using namespace pslab::wire;

namespace {

// Encodes and decodes `h` into `out`. A failed decode is a fatal test failure: the caller
// stops (ROUND_TRIP), it never reads a header that is not there.
void round_trip(const Header& h, Header& out) {
  Encoder enc;
  const auto m = enc.encode(h);
  std::string why;
  auto back = decode(m, why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->sender, h.sender);
  EXPECT_EQ(back->shard, h.shard);
  ASSERT_EQ(back->body.index(), h.body.index());
  out = *back;
}
#define ROUND_TRIP(out, ...) \
  Header out;                \
  ASSERT_NO_FATAL_FAILURE(round_trip(__VA_ARGS__, out))

TEST(Wire, EveryMessageTypeRoundTrips) {
  {
    ROUND_TRIP(r1, Header{3, -1, Hello{Role::evaluator, 3, 235146, 0xABCDEF0123456789ull}});
    auto b = std::get<Hello>(r1.body);
    EXPECT_EQ(b.role, Role::evaluator);
    EXPECT_EQ(b.rank, 3);
    EXPECT_EQ(b.param_count, 235146u);
    EXPECT_EQ(b.config_hash, 0xABCDEF0123456789ull);
  }
  {
    ROUND_TRIP(r2, Header{kServer, 1, Welcome{1, 2, 100, 50, 4, "ssp:3", 17}});
    auto b = std::get<Welcome>(r2.body);
    EXPECT_EQ(b.shard, 1);
    EXPECT_EQ(b.num_shards, 2);
    EXPECT_EQ(b.offset, 100u);
    EXPECT_EQ(b.length, 50u);
    EXPECT_EQ(b.workers, 4);
    EXPECT_EQ(b.mode, "ssp:3");
    EXPECT_EQ(b.version, 17);
  }
  {
    ROUND_TRIP(r7, Header{0, 1, Pull{42}});
    EXPECT_EQ(std::get<Pull>(r7.body).clock, 42);
    EXPECT_FALSE(std::get<Pull>(r7.body).progress_only);
    ROUND_TRIP(r7p, Header{kEvaluator, 1, Pull{0, true}});
    EXPECT_TRUE(std::get<Pull>(r7p.body).progress_only);
  }
  {
    ROUND_TRIP(r3, Header{kServer, 0, PullReply{5, 6, 4, 999, 1234, true, 77, 8, 9}});
    auto b = std::get<PullReply>(r3.body);
    EXPECT_EQ(b.clock, 5);
    EXPECT_EQ(b.version, 6);
    EXPECT_EQ(b.min_clock, 4);
    EXPECT_EQ(b.samples_applied, 999);
    EXPECT_EQ(b.held_us, 1234);
    EXPECT_TRUE(b.training_done);
    EXPECT_EQ(b.checksum, 77u);
    EXPECT_EQ(b.offset, 8u);
    EXPECT_EQ(b.length, 9u);
    EXPECT_EQ(b.piece, 0u);  // whole, unless it says otherwise
    EXPECT_EQ(b.pieces, 1u);
    ROUND_TRIP(r3p, Header{kServer, 0, PullReply{5, 6, 4, 999, 1234, true, 77, 8, 9, 0, 36, 6, 7}});
    EXPECT_EQ(std::get<PullReply>(r3p.body).piece, 6u);
    EXPECT_EQ(std::get<PullReply>(r3p.body).pieces, 7u);
  }
  {
    ROUND_TRIP(r4, Header{2, 0, Push{11, 10, 64, 0xFFFFFFFFFFFFFFFFull, 0, 117573, true}});
    auto b = std::get<Push>(r4.body);
    EXPECT_EQ(b.clock, 11);
    EXPECT_EQ(b.version_pulled, 10);
    EXPECT_EQ(b.batch, 64);
    EXPECT_EQ(b.checksum, 0xFFFFFFFFFFFFFFFFull);
    EXPECT_EQ(b.length, 117573u);
    EXPECT_TRUE(b.then_pull);
    EXPECT_EQ(b.pieces, 1u);
    ROUND_TRIP(r4p, Header{2, 0, Push{11, 10, 64, 5, 4096, 4096, true, 0, 16384, 3, 9}});
    EXPECT_EQ(std::get<Push>(r4p.body).piece, 3u);
    EXPECT_EQ(std::get<Push>(r4p.body).pieces, 9u);
  }
  {
    ROUND_TRIP(r5, Header{kServer, 0, PushAck{3, 4}});
    auto b = std::get<PushAck>(r5.body);
    EXPECT_EQ(b.clock, 3);
    EXPECT_EQ(b.version, 4);
  }
  {
    ROUND_TRIP(r8, Header{1, -1, Bye{200}});
    EXPECT_EQ(std::get<Bye>(r8.body).clock, 200);
  }
  {
    ROUND_TRIP(r11, Header{kTool, -1, Shutdown{}});
  }
  {
    ROUND_TRIP(r12, Header{kServer, -1, Ack{}});
  }
  {
    ROUND_TRIP(r13, Header{kTool, 0, Stats{}});
  }
  {
    ROUND_TRIP(r9, Header{kServer, 0, StatsReply{"{\"a\":1}"}});
    EXPECT_EQ(std::get<StatsReply>(r9.body).json, "{\"a\":1}");
  }
  {
    const std::string binary("\0\1\2\xff", 4);
    ROUND_TRIP(rs, Header{2, -1, KvSet{"gloo/0", binary}});
    auto s = std::get<KvSet>(rs.body);
    EXPECT_EQ(s.key, "gloo/0");
    EXPECT_EQ(s.value, binary);
    ROUND_TRIP(rg, Header{2, -1, KvGet{"nccl_id", 1500}});
    auto g = std::get<KvGet>(rg.body);
    EXPECT_EQ(g.key, "nccl_id");
    EXPECT_EQ(g.wait_ms, 1500);
    ROUND_TRIP(rv, Header{kServer, -1, KvValue{"k", binary, true}});
    auto v = std::get<KvValue>(rv.body);
    EXPECT_EQ(v.value, binary);
    EXPECT_TRUE(v.found);
    {
      ROUND_TRIP(r10, Header{3, -1, Beat{99}});
      EXPECT_EQ(std::get<Beat>(r10.body).step, 99);
    }
    {
      ROUND_TRIP(r14, Header{0, -1, GroupStatus{}});
    }
    {  // chain replication: a push's piece as the primary forwards it, and the backup's answer
      ROUND_TRIP(r15, Header{kServer, 1, Replicate{42, ReplicaEvent::piece, 3, 0, Push{7, 6, 32, 0xfeed, 66, 66, true, 0, 264, 2, 3}}});
      const auto& f = std::get<Replicate>(r15.body);
      EXPECT_EQ(f.seq, 42);
      EXPECT_EQ(f.event, ReplicaEvent::piece);
      EXPECT_EQ(f.worker, 3);
      EXPECT_EQ(f.push.clock, 7);
      EXPECT_EQ(f.push.checksum, 0xfeedu);
      EXPECT_EQ(f.push.piece, 2u);
      EXPECT_EQ(f.push.pieces, 3u);
      EXPECT_TRUE(f.push.then_pull);
      ROUND_TRIP(r16, Header{kServer, 1, Replicate{43, ReplicaEvent::drop, 2, 11, {}}});
      EXPECT_EQ(std::get<Replicate>(r16.body).event, ReplicaEvent::drop);
      EXPECT_EQ(std::get<Replicate>(r16.body).clock, 11);
      ROUND_TRIP(r17, Header{kServer, 1, Replicated{43, 900}});
      EXPECT_EQ(std::get<Replicated>(r17.body).seq, 43);
      EXPECT_EQ(std::get<Replicated>(r17.body).version, 900);
      ROUND_TRIP(r18, Header{kServer, 1, Hello{Role::replica, 1, 132, 0x1234}});
      EXPECT_EQ(std::get<Hello>(r18.body).role, Role::replica);
      ROUND_TRIP(r20, Header{kServer, 1, Error{ErrorCode::backup, "a backup"}});
      EXPECT_EQ(std::get<Error>(r20.body).code, ErrorCode::backup);
    }
  }
  {
    ROUND_TRIP(r6, Header{kServer, 0, Error{ErrorCode::bad_checksum, "flipped"}});
    auto b = std::get<Error>(r6.body);
    EXPECT_EQ(b.code, ErrorCode::bad_checksum);
    EXPECT_EQ(b.message, "flipped");
  }
}

TEST(Wire, RefusesMalformedFramesWithAReason) {
  std::string why;
  EXPECT_FALSE(decode("", 0, why));
  EXPECT_NE(why.find("0 bytes"), std::string::npos) << why;

  const char garbage[] = "this is not a flatbuffer at all, just some bytes....";
  EXPECT_FALSE(decode(garbage, sizeof garbage, why));
  EXPECT_NE(why.find("does not verify"), std::string::npos) << why;

  Encoder enc;
  const auto encoded = enc.encode({0, 0, Push{1, 1, 1, 1, 0, 10, false}});
  const std::vector<std::byte> good(encoded.begin(), encoded.end());
  for (std::size_t cut : {good.size() - 1, good.size() / 2, std::size_t(9)}) {
    EXPECT_FALSE(decode(good.data(), cut, why)) << "truncated to " << cut;
  }
  // Unaligned frames (ZeroMQ does not promise alignment) still decode.
  std::vector<std::byte> shifted(good.size() + 1);
  std::memcpy(shifted.data() + 1, good.data(), good.size());
  EXPECT_TRUE(decode(shifted.data() + 1, good.size(), why)) << why;
}

TEST(Wire, RefusesWrongMagicProtocolAndUnknownTypes) {
  auto build = [](std::uint32_t magic, std::uint16_t protocol, std::uint8_t type) {
    flatbuffers::FlatBufferBuilder f;
    auto body = fb::CreatePull(f, 1).Union();
    fb::FinishMessageBuffer(f, fb::CreateMessage(f, magic, protocol, 0, 0, fb::Body(type), body));
    return std::vector<std::uint8_t>(f.GetBufferPointer(), f.GetBufferPointer() + f.GetSize());
  };
  std::string why;
  auto ok = build(kMagic, kProtocol, fb::Body_Pull);
  EXPECT_TRUE(decode(ok.data(), ok.size(), why)) << why;
  auto magic = build(0xDEADBEEF, kProtocol, fb::Body_Pull);
  EXPECT_FALSE(decode(magic.data(), magic.size(), why));
  EXPECT_NE(why.find("wrong magic 0xdeadbeef"), std::string::npos) << why;
  auto proto = build(kMagic, 99, fb::Body_Pull);
  EXPECT_FALSE(decode(proto.data(), proto.size(), why));
  EXPECT_NE(why.find("protocol version 99"), std::string::npos) << why;
  auto type = build(kMagic, kProtocol, 77);
  EXPECT_FALSE(decode(type.data(), type.size(), why));
  EXPECT_NE(why.find("unknown message type 77"), std::string::npos) << why;
}

TEST(Wire, ChecksumCatchesEveryFlippedByteAndCopyAgrees) {
  for (std::size_t n : {0u, 1u, 3u, 4u, 5u, 1000u}) {
    std::vector<float> x(n);
    Rng r(n);
    for (auto& v : x) v = float(r.normal());
    const std::uint64_t sum = checksum(x.data(), n);
    std::vector<float> y(n);
    EXPECT_EQ(copy_with_checksum(y.data(), x.data(), n), sum);
    EXPECT_EQ(std::memcmp(x.data(), y.data(), n * sizeof(float)), 0);
    auto* bytes = reinterpret_cast<unsigned char*>(y.data());
    for (std::size_t b = 0; b < n * sizeof(float); b += (n > 10 ? 37 : 1)) {
      for (unsigned char bit : {0x01, 0x80}) {
        bytes[b] ^= bit;
        EXPECT_NE(checksum(y.data(), n), sum) << "byte " << b << " of " << n << " floats";
        bytes[b] ^= bit;
      }
    }
  }
  // Piece by piece, in any split, equals all at once.
  {
    std::vector<float> x(1003);
    Rng r(5);
    for (auto& v : x) v = float(r.normal());
    for (std::size_t piece : {1u, 3u, 4u, 64u, 1000u}) {
      Checksum c;
      for (std::size_t lo = 0; lo < x.size(); lo += piece) c.update(x.data() + lo, std::min(piece, x.size() - lo));
      EXPECT_EQ(c.value(), checksum(x.data(), x.size())) << "pieces of " << piece;
    }
  }
  // Swapping two words changes it (position-weighted).
  std::vector<float> a = {1, 2, 3, 4, 5, 6, 7, 8}, b = {5, 2, 3, 4, 1, 6, 7, 8};
  EXPECT_NE(checksum(a.data(), 8), checksum(b.data(), 8));
}

TEST(Wire, ChecksumCoversBytesInAnyPiecesAndFloatsAreTheirBytes) {
  std::vector<unsigned char> x(1001);
  Rng r(7);
  for (auto& v : x) v = static_cast<unsigned char>(r.below(256));
  for (std::size_t n : {0u, 1u, 2u, 3u, 5u, 7u, 1001u}) {
    const std::uint64_t sum = checksum_bytes(x.data(), n);
    for (std::size_t piece : {1u, 2u, 3u, 5u, 64u}) {
      Checksum c;
      for (std::size_t lo = 0; lo < n; lo += piece) c.update_bytes(x.data() + lo, std::min(piece, n - lo));
      EXPECT_EQ(c.value(), sum) << n << " bytes in pieces of " << piece;
    }
    for (std::size_t b = 0; b < n; b += (n > 10 ? 53 : 1)) {
      x[b] ^= 0x04;
      EXPECT_NE(checksum_bytes(x.data(), n), sum) << "byte " << b << " of " << n;
      x[b] ^= 0x04;
    }
  }
  // A trailing zero byte is not the same payload as none (the byte count is folded in).
  const unsigned char one[] = {9}, two[] = {9, 0};
  EXPECT_NE(checksum_bytes(one, 1), checksum_bytes(two, 2));
  const float f[] = {1.5f, -2.0f, 3.25f};
  EXPECT_EQ(checksum(f, 3), checksum_bytes(f, sizeof f));
}

// The checksum's definition, written plainly: word i (little-endian, a last partial word
// zero-padded) goes to lane i % 4; a[l] += word, b[l] += a[l]; the byte count and the 8 sums
// are mixed at the end. The library's (vectorised where the CPU can) must give the same value
// for every length, alignment and split: a change of definition breaks every peer of an older
// build, so it must be deliberate.
std::uint64_t reference_checksum(const unsigned char* p, std::size_t n) {
  std::uint64_t a[4] = {}, b[4] = {};
  for (std::size_t i = 0; 4 * i < n; ++i) {
    std::uint32_t w = 0;
    for (std::size_t k = 0; k < 4 && 4 * i + k < n; ++k) w |= std::uint32_t(p[4 * i + k]) << (8 * k);
    a[i % 4] += w;
    b[i % 4] += a[i % 4];
  }
  std::uint64_t h = std::uint64_t(n) * 0x9E3779B97F4A7C15ull;
  for (std::uint64_t v : {a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]}) h = (h ^ v) * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  return h ^ (h >> 31);
}

TEST(Wire, ChecksumMatchesItsPlainDefinitionAtEveryLengthAlignmentAndSplit) {
  std::vector<unsigned char> x(70000 + 64);
  Rng r(13);
  for (auto& v : x) v = static_cast<unsigned char>(r.below(256));
  for (std::size_t align : {0u, 1u, 4u, 12u}) {
    for (std::size_t n : {0u, 1u, 15u, 63u, 64u, 65u, 127u, 128u, 255u, 1000u, 4099u, 70000u}) {
      const unsigned char* p = x.data() + align;
      const std::uint64_t want = reference_checksum(p, n);
      EXPECT_EQ(checksum_bytes(p, n), want) << n << " bytes at offset " << align;
      for (std::size_t piece : {7u, 60u, 68u, 4096u}) {  // splits inside and across the 64-byte blocks
        for (Checksum::Simd simd : {Checksum::Simd::best, Checksum::Simd::avx2, Checksum::Simd::none}) {
          Checksum c(simd);
          for (std::size_t lo = 0; lo < n; lo += piece) c.update_bytes(p + lo, std::min(piece, n - lo));
          EXPECT_EQ(c.value(), want) << n << " bytes at offset " << align << " in pieces of " << piece << ", simd "
                                     << int(simd);
        }
      }
    }
  }
  // Every word at its largest, over several of the vector loops' blocks (their 32-bit sums
  // hold 256 steps of 64 or 128 bytes before they are folded into the 64-bit lanes).
  const std::vector<unsigned char> ones(3 * 32768 + 4 * 128 + 20, 0xFF);
  for (std::size_t n : {ones.size(), std::size_t(32768), std::size_t(65536 + 64)}) {
    const std::uint64_t want = reference_checksum(ones.data(), n);
    for (Checksum::Simd simd : {Checksum::Simd::best, Checksum::Simd::avx2, Checksum::Simd::none}) {
      Checksum c(simd);
      c.update_bytes(ones.data(), n);
      EXPECT_EQ(c.value(), want) << n << " bytes of 0xFF, simd " << int(simd);
    }
  }
  std::vector<float> f(70001), g(70001);
  for (auto& v : f) v = float(r.normal());
  EXPECT_EQ(copy_with_checksum(g.data(), f.data(), f.size()),
            reference_checksum(reinterpret_cast<const unsigned char*>(f.data()), f.size() * sizeof(float)));
}

// Slices checksummed apart (by a server's threads) and appended in order give the checksum of
// the whole; a first piece that is not whole 16-byte rounds is refused.
TEST(Wire, ChecksumsOfSlicesAppendToTheWhole) {
  std::vector<unsigned char> x(4099);
  Rng r(11);
  for (auto& v : x) v = static_cast<unsigned char>(r.below(256));
  for (std::size_t n : {0u, 16u, 17u, 100u, 4099u}) {
    for (std::size_t piece : {16u, 32u, 48u, 1024u}) {
      Checksum whole;
      for (std::size_t lo = 0; lo < n; lo += piece) {
        Checksum c;
        c.update_bytes(x.data() + lo, std::min(piece, n - lo));
        if (lo == 0) whole = c; else whole.append(c);
      }
      EXPECT_EQ(whole.value(), checksum_bytes(x.data(), n)) << n << " bytes in slices of " << piece;
    }
  }
  Checksum odd, next;
  odd.update_bytes(x.data(), 20);
  EXPECT_THROW(odd.append(next), std::logic_error);
}

}  // namespace

// The fuzzer's seed corpus (tests/fuzz/corpus/wire/): one encoded header of every body type, so
// that fuzzing starts from every branch of the decoder. This test keeps it in step with the
// schema; PSLAB_WRITE_SEEDS=1 rewrites it.
TEST(FuzzSeeds, OneDecodingSeedForEveryBodyType) {
  const std::filesystem::path dir = std::filesystem::path(PSLAB_SOURCE_DIR) / "tests/fuzz/corpus/wire";
  const std::vector<Header> seeds = {
      {0, -1, Hello{Role::worker, 0, 132, 0x1234}},
      {kServer, 0, Welcome{0, 2, 0, 66, 2, "ssp:2", 3}},
      {1, 0, Pull{7}},
      {kServer, 1, PullReply{7, 9, 5, 640, 12, false, 0xabcdef, 66, 66, 0, 264, 1, 3}},
      {1, 1, Push{7, 6, 32, 0xfeed, 66, 66, true, 0, 264, 2, 3}},
      {kServer, 0, PushAck{7, 8}},
      {0, -1, Bye{500}},
      {kEvaluator, -1, Shutdown{}},
      {kServer, -1, Ack{}},
      {kTool, -1, Stats{}},
      {kServer, -1, StatsReply{"{\"shard\":0}"}},
      {kServer, -1, Error{ErrorCode::bad_checksum, "push payload checksum mismatch"}},
      {1, -1, KvSet{"gloo/rank1", std::string("\x01\x02" "address", 9)}},
      {2, -1, KvGet{"gloo/rank1", 1000}},
      {kServer, -1, KvValue{"gloo/rank1", "x", true}},
      {3, -1, Beat{41}},
      {0, -1, GroupStatus{}},
      {kServer, 0, Replicate{5, ReplicaEvent::piece, 1, 0, Push{7, 6, 32, 0xfeed, 66, 66, true, 0, 264, 2, 3}}},
      {kServer, 0, Replicated{5, 9}},
  };
  ASSERT_EQ(seeds.size(), std::variant_size_v<Body>);
  Encoder enc;
  if (std::getenv("PSLAB_WRITE_SEEDS")) {
    std::filesystem::create_directories(dir);
    for (const Header& h : seeds) {
      const auto b = enc.encode(h);
      std::ofstream(dir / (std::string(body_name(h.body)) + ".bin"), std::ios::binary)
          .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    }
  }
  std::set<std::string> decoded;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string why;
    const auto h = decode(bytes.data(), bytes.size(), why);
    if (e.path().filename().string().rfind("crash-", 0) == 0) {  // what the fuzzer found, kept: refused
      EXPECT_FALSE(h) << e.path();
      EXPECT_FALSE(why.empty()) << e.path();
      continue;
    }
    ASSERT_TRUE(h) << e.path() << ": " << why;
    decoded.insert(body_name(h->body));
  }
  for (const Header& h : seeds) EXPECT_TRUE(decoded.count(body_name(h.body))) << "no seed for " << body_name(h.body);
}

// Found by the fuzzer: a header whose union says PullReply but holds no body passed the
// FlatBuffers verifier, and reading it dereferenced a null pointer (a 94-byte message from any
// peer could crash a server). Now it is refused with a reason.
TEST(Wire, AHeaderWhoseBodyIsMissingIsRefused) {
  std::ifstream in(std::filesystem::path(PSLAB_SOURCE_DIR) / "tests/fuzz/corpus/wire/crash-body-type-without-body.bin",
                   std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 94u);
  std::string why;
  EXPECT_FALSE(decode(bytes.data(), bytes.size(), why));
  EXPECT_NE(why.find("is missing"), std::string::npos) << why;
}
