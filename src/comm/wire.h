// The wire: message headers (FlatBuffers, schema in wire.fbs) and payload checksums.
//
// A message on a socket is [header frame][payload frame]? — the payload (pull replies and
// pushes only) is float32 or encoded by the codec the header names (float32 is sent zero-copy),
// checked against the header's length and checksum. This file is the one encoder and the one
// decoder of headers: every body type has a C++ struct here, and encode()/decode() handle each
// of them (round-trip tested).
//
// decode() never throws on bad input: a frame that fails the FlatBuffers verifier, carries
// the wrong magic or protocol version, or has no known body returns nullopt with the reason.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include <span>

#include <flatbuffers/flatbuffers.h>

namespace pslab::wire {

constexpr std::uint32_t kMagic = 0x50534C42;  // "PSLB"
constexpr std::uint16_t kProtocol = 3;  // 3: pushes and pull replies in pieces
// Sender ids that are not worker ranks.
constexpr int kEvaluator = -1, kServer = -2, kTool = -3;

enum class Role : std::int8_t { worker = 0, evaluator = 1, replica = 2 };  // replica: a backup server (to its primary)
enum class ErrorCode : std::int16_t {
  malformed = 0, unknown_type, unknown_peer, wrong_shard, wrong_size, bad_checksum, protocol,
  timeout, config, bad_payload, backup
};
const char* error_code_name(ErrorCode c);

struct Hello { Role role = Role::worker; int rank = 0; std::uint64_t param_count = 0; std::uint64_t config_hash = 0;
               std::int64_t rejoin_clock = -1; };
struct Welcome { int shard = 0; int num_shards = 0; std::uint64_t offset = 0, length = 0; int workers = 0;
                 std::string mode; std::int64_t version = 0; std::int64_t worker_clock = 0; };
struct Pull { std::int64_t clock = 0; bool progress_only = false; };  // see wire.fbs
// Payloads: `length` floats (elements) of the shard starting at `offset`, encoded by codec
// `codec` into `bytes` bytes, whose checksum_bytes is `checksum`; piece `piece` of `pieces`
// (ps/pieces.h; 1 piece: the whole shard).
struct PullReply { std::int64_t clock = 0, version = 0, min_clock = 0, samples_applied = 0, held_us = 0;
                   bool training_done = false; std::uint64_t checksum = 0, offset = 0, length = 0;
                   std::uint8_t codec = 0; std::uint64_t bytes = 0; std::uint32_t piece = 0, pieces = 1; };
struct Push { std::int64_t clock = 0, version_pulled = 0; int batch = 0; std::uint64_t checksum = 0, offset = 0,
              length = 0; bool then_pull = false; std::uint8_t codec = 0; std::uint64_t bytes = 0;
              std::uint32_t piece = 0, pieces = 1; };
struct PushAck { std::int64_t clock = 0, version = 0; };
struct Bye { std::int64_t clock = 0; };
struct Shutdown {};
struct Ack {};
struct Stats {};
struct StatsReply { std::string json; };
struct Error { ErrorCode code = ErrorCode::malformed; std::string message; };
struct KvSet { std::string key; std::string value; };
struct KvGet { std::string key; std::int64_t wait_ms = 0; };
struct KvValue { std::string key; std::string value; bool found = false; };
struct Beat { std::int64_t step = 0; };
struct GroupStatus {};
// Chain replication (wire.fbs): the primary's inputs to its backup, and the backup's answer.
enum class ReplicaEvent : std::uint8_t { piece = 0, abandon, drop, readmit, bye, barrier, shutdown, pulled, snapshot };
struct Replicate { std::int64_t seq = 0; ReplicaEvent event = ReplicaEvent::piece; int worker = 0; std::int64_t clock = 0;
                   Push push; };
struct Replicated { std::int64_t seq = 0, version = 0; };

using Body = std::variant<Hello, Welcome, Pull, PullReply, Push, PushAck, Bye, Shutdown, Ack, Stats,
                          StatsReply, Error, KvSet, KvGet, KvValue, Beat, GroupStatus, Replicate, Replicated>;
// Name of the body type, e.g. "Push" (for messages and logs).
const char* body_name(const Body& b);

struct Header {
  int sender = 0;   // worker rank, or kEvaluator / kServer / kTool
  int shard = -1;   // -1: not about a shard
  Body body;
};

// Encodes headers. Holds one FlatBufferBuilder that is reused, so no allocation happens per
// message once it has grown. Threading: one thread per Encoder.
class Encoder {
 public:
  // The encoded header, valid until the next encode().
  std::span<const std::byte> encode(const Header& h);

 private:
  flatbuffers::FlatBufferBuilder fbb_{256};
};

// Verifies and decodes a header frame. Returns nullopt and sets `error` on anything malformed.
std::optional<Header> decode(const void* data, std::size_t size, std::string& error);
inline std::optional<Header> decode(std::span<const std::byte> frame, std::string& error) {
  return decode(frame.data(), frame.size(), error);
}

// ---- payload checksum ----
// A 64-bit Fletcher-style sum over the payload's bytes, read as 32-bit words in 4 independent
// lanes (a last partial word zero-padded), mixed with the byte count into 64 bits at the end:
// a change confined to one word always changes the lane sums (and the result, but for a 2^-64
// chance), and it runs at memory speed (no table, no division). Integrity against corruption,
// not against an adversary. Floats are checksummed as their bytes: checksum(p, n) ==
// checksum_bytes(p, 4 n).
std::uint64_t checksum_bytes(const void* data, std::size_t bytes);
std::uint64_t checksum(const float* data, std::size_t n);
// Copies n floats from src to dst and returns the checksum of the data, in one pass.
std::uint64_t copy_with_checksum(float* dst, const float* src, std::size_t n);

// The same checksum computed piece by piece (e.g. chunk by chunk while the chunk is still in
// cache after an update): update() in order over consecutive pieces, then value().
class Checksum {
 public:
  // The vector instructions the sums may use: the best this CPU has, or (for tests: every
  // choice gives the same value) at most AVX2, or none.
  enum class Simd { best, avx2, none };
  explicit Checksum(Simd simd = Simd::best) : simd_(simd) {}
  void update_bytes(const void* data, std::size_t bytes);
  void update(const float* data, std::size_t n) { update_bytes(data, n * sizeof(float)); }
  std::uint64_t value() const;
  // Appends the checksum of the bytes that follow: afterwards this is the checksum of both
  // pieces in order (e.g. slices checksummed by different threads). This one's bytes must be
  // a multiple of 16 (whole rounds of the 4 lanes).
  void append(const Checksum& next);

 private:
  void words(const std::byte* src, std::size_t n);  // n whole 32-bit words
  std::uint64_t a_[4] = {0, 0, 0, 0}, b_[4] = {0, 0, 0, 0};
  std::size_t words_ = 0;  // words so far; word i goes to lane i % 4
  std::size_t bytes_ = 0;
  std::byte tail_[4] = {};  // a partial word waiting for the next piece
  std::size_t tail_n_ = 0;
  Simd simd_;
};

}  // namespace pslab::wire
