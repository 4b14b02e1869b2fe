#include "comm/wire.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "wire_generated.h"

namespace pslab::wire {

const char* error_code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::malformed: return "malformed";
    case ErrorCode::unknown_type: return "unknown_type";
    case ErrorCode::unknown_peer: return "unknown_peer";
    case ErrorCode::wrong_shard: return "wrong_shard";
    case ErrorCode::wrong_size: return "wrong_size";
    case ErrorCode::bad_checksum: return "bad_checksum";
    case ErrorCode::protocol: return "protocol";
    case ErrorCode::timeout: return "timeout";
    case ErrorCode::config: return "config";
    case ErrorCode::bad_payload: return "bad_payload";
    case ErrorCode::backup: return "backup";
  }
  return "unknown";
}

const char* body_name(const Body& b) {
  static constexpr const char* names[] = {"Hello", "Welcome", "Pull", "PullReply", "Push", "PushAck",
                                          "Bye", "Shutdown", "Ack", "Stats", "StatsReply", "Error",
                                          "KvSet", "KvGet", "KvValue", "Beat", "GroupStatus", "Replicate", "Replicated"};
  static_assert(std::size(names) == std::variant_size_v<Body>);
  return names[b.index()];
}

namespace {

using FBB = flatbuffers::FlatBufferBuilder;
using Off = flatbuffers::Offset<void>;

struct BodyEncoder {
  FBB& f;
  std::pair<fb::Body, Off> operator()(const Hello& m) const {
    return {fb::Body_Hello, fb::CreateHello(f, fb::Role(m.role), m.rank, m.param_count, m.config_hash, m.rejoin_clock).Union()};
  }
  std::pair<fb::Body, Off> operator()(const Welcome& m) const {
    return {fb::Body_Welcome, fb::CreateWelcome(f, m.shard, m.num_shards, m.offset, m.length, m.workers,
                                                f.CreateString(m.mode), m.version, m.worker_clock).Union()};
  }
  std::pair<fb::Body, Off> operator()(const Pull& m) const {
    return {fb::Body_Pull, fb::CreatePull(f, m.clock, m.progress_only).Union()};
  }
  std::pair<fb::Body, Off> operator()(const PullReply& m) const {
    return {fb::Body_PullReply, fb::CreatePullReply(f, m.clock, m.version, m.min_clock, m.samples_applied,
                                                    m.held_us, m.training_done, m.checksum, m.offset,
                                                    m.length, m.codec, m.bytes, m.piece, m.pieces).Union()};
  }
  std::pair<fb::Body, Off> operator()(const Push& m) const {
    return {fb::Body_Push, fb::CreatePush(f, m.clock, m.version_pulled, m.batch, m.checksum, m.offset,
                                          m.length, m.then_pull, m.codec, m.bytes, m.piece, m.pieces).Union()};
  }
  std::pair<fb::Body, Off> operator()(const Replicate& m) const {
    const wire::Push& p = m.push;
    const auto push = fb::CreatePush(f, p.clock, p.version_pulled, p.batch, p.checksum, p.offset, p.length, p.then_pull, p.codec,
                                     p.bytes, p.piece, p.pieces);
    return {fb::Body_Replicate, fb::CreateReplicate(f, m.seq, std::uint8_t(m.event), m.worker, m.clock, push).Union()};
  }
  std::pair<fb::Body, Off> operator()(const Replicated& m) const {
    return {fb::Body_Replicated, fb::CreateReplicated(f, m.seq, m.version).Union()};
  }
  std::pair<fb::Body, Off> operator()(const PushAck& m) const {
    return {fb::Body_PushAck, fb::CreatePushAck(f, m.clock, m.version).Union()};
  }
  std::pair<fb::Body, Off> operator()(const Bye& m) const {
    return {fb::Body_Bye, fb::CreateBye(f, m.clock).Union()};
  }
  std::pair<fb::Body, Off> operator()(const Shutdown&) const {
    return {fb::Body_Shutdown, fb::CreateShutdown(f).Union()};
  }
  std::pair<fb::Body, Off> operator()(const Ack&) const { return {fb::Body_Ack, fb::CreateAck(f).Union()}; }
  std::pair<fb::Body, Off> operator()(const Stats&) const {
    return {fb::Body_Stats, fb::CreateStats(f).Union()};
  }
  std::pair<fb::Body, Off> operator()(const StatsReply& m) const {
    return {fb::Body_StatsReply, fb::CreateStatsReply(f, f.CreateString(m.json)).Union()};
  }
  std::pair<fb::Body, Off> operator()(const Error& m) const {
    return {fb::Body_Error, fb::CreateError(f, fb::ErrorCode(m.code), f.CreateString(m.message)).Union()};
  }
  std::pair<fb::Body, Off> operator()(const KvSet& m) const {
    return {fb::Body_KvSet, fb::CreateKvSet(f, f.CreateString(m.key), bytes(m.value)).Union()};
  }
  std::pair<fb::Body, Off> operator()(const KvGet& m) const {
    return {fb::Body_KvGet, fb::CreateKvGet(f, f.CreateString(m.key), m.wait_ms).Union()};
  }
  std::pair<fb::Body, Off> operator()(const KvValue& m) const {
    return {fb::Body_KvValue, fb::CreateKvValue(f, f.CreateString(m.key), bytes(m.value), m.found).Union()};
  }
  std::pair<fb::Body, Off> operator()(const Beat& m) const {
    return {fb::Body_Beat, fb::CreateBeat(f, m.step).Union()};
  }
  std::pair<fb::Body, Off> operator()(const GroupStatus&) const {
    return {fb::Body_GroupStatus, fb::CreateGroupStatus(f).Union()};
  }
  flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>> bytes(const std::string& s) const {
    return f.CreateVector(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
  }
};

std::string str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }
std::string str(const flatbuffers::Vector<std::uint8_t>* v) {
  return v ? std::string(reinterpret_cast<const char*>(v->data()), v->size()) : std::string();
}

}  // namespace

std::span<const std::byte> Encoder::encode(const Header& h) {
  fbb_.Clear();
  const auto [type, body] = std::visit(BodyEncoder{fbb_}, h.body);
  fb::FinishMessageBuffer(fbb_, fb::CreateMessage(fbb_, kMagic, kProtocol, h.sender, h.shard, type, body));
  return {reinterpret_cast<const std::byte*>(fbb_.GetBufferPointer()), fbb_.GetSize()};
}

namespace {

// The message in a header frame, verified (structure, magic, protocol, a body present), or null
// with `error` saying why not. `aligned`: where an unaligned frame is copied (the verifier
// reads at aligned offsets; ZeroMQ frames are not guaranteed to be aligned).
const fb::Message* verified_message(const void* data, std::size_t size, std::string& error,
                                    std::unique_ptr<std::uint8_t[]>& aligned, std::uint8_t* local, std::size_t local_size) {
  if (size < 8 || size > (1u << 20)) {
    error = "header frame of " + std::to_string(size) + " bytes (expected 8 B to 1 MiB)";
    return nullptr;
  }
  const std::uint8_t* buf = static_cast<const std::uint8_t*>(data);
  if (reinterpret_cast<std::uintptr_t>(buf) % 8 != 0) {
    std::uint8_t* dst = size <= local_size ? local : (aligned.reset(new std::uint8_t[size + 8]), aligned.get());
    std::memcpy(dst, buf, size);
    buf = dst;
  }
  flatbuffers::Verifier v(buf, size, /*max_depth=*/8, /*max_tables=*/16);
  if (!fb::VerifyMessageBuffer(v)) {
    error = "header does not verify as a pslab message (FlatBuffers verifier, identifier PSLB)";
    return nullptr;
  }
  const fb::Message* m = fb::GetMessage(buf);
  if (m->magic() != kMagic) {
    char b[96];
    std::snprintf(b, sizeof b, "wrong magic 0x%08x (expected 0x%08x)", m->magic(), kMagic);
    error = b;
    return nullptr;
  }
  if (m->protocol() != kProtocol) {
    error = "protocol version " + std::to_string(m->protocol()) + " (this build speaks " + std::to_string(kProtocol) + ")";
    return nullptr;
  }
  // The verifier accepts a union whose value is absent: every body is a table, even an empty one.
  if (!m->body()) {
    error = "a header whose body (type " + std::to_string(int(m->body_type())) + ") is missing";
    return nullptr;
  }
  return m;
}

// The body of a verified message, one case per message type (a table); false with `error` for
// an unknown type or value.
bool decode_body(const fb::Message* m, Body& body, std::string& error) {
  switch (m->body_type()) {
    case fb::Body_Hello: {
      const auto* b = m->body_as_Hello();
      body = Hello{Role(b->role()), b->rank(), b->param_count(), b->config_hash(), b->rejoin_clock()};
      break;
    }
    case fb::Body_Welcome: {
      const auto* b = m->body_as_Welcome();
      body = Welcome{b->shard(), b->num_shards(), b->offset(), b->length(), b->workers(), str(b->mode()), b->version(),
                        b->worker_clock()};
      break;
    }
    case fb::Body_Pull: body = Pull{m->body_as_Pull()->clock(), m->body_as_Pull()->progress_only()}; break;
    case fb::Body_PullReply: {
      const auto* b = m->body_as_PullReply();
      body = PullReply{b->clock(),         b->version(),  b->min_clock(), b->samples_applied(),
                         b->held_us(),       b->training_done(), b->checksum(), b->offset(),
                         b->length(),        b->codec(),    b->bytes(),     b->piece(), b->pieces()};
      break;
    }
    case fb::Body_Push: {
      const auto* b = m->body_as_Push();
      body = Push{b->clock(),  b->version_pulled(), b->batch(),     b->checksum(), b->offset(),
                    b->length(), b->then_pull(),      b->codec(),     b->bytes(),    b->piece(), b->pieces()};
      break;
    }
    case fb::Body_PushAck: body = PushAck{m->body_as_PushAck()->clock(), m->body_as_PushAck()->version()}; break;
    case fb::Body_Bye: body = Bye{m->body_as_Bye()->clock()}; break;
    case fb::Body_Shutdown: body = Shutdown{}; break;
    case fb::Body_Ack: body = Ack{}; break;
    case fb::Body_Stats: body = Stats{}; break;
    case fb::Body_StatsReply: body = StatsReply{str(m->body_as_StatsReply()->json())}; break;
    case fb::Body_Error: {
      const auto* b = m->body_as_Error();
      const int code = b->code();
      if (code < 0 || code > int(ErrorCode::backup)) {
        error = "Error message with unknown code " + std::to_string(code);
        return false;
      }
      body = Error{ErrorCode(code), str(b->message())};
      break;
    }
    case fb::Body_KvSet: body = KvSet{str(m->body_as_KvSet()->key()), str(m->body_as_KvSet()->value())}; break;
    case fb::Body_KvGet: body = KvGet{str(m->body_as_KvGet()->key()), m->body_as_KvGet()->wait_ms()}; break;
    case fb::Body_KvValue: {
      const auto* b = m->body_as_KvValue();
      body = KvValue{str(b->key()), str(b->value()), b->found()};
      break;
    }
    case fb::Body_Beat: body = Beat{m->body_as_Beat()->step()}; break;
    case fb::Body_GroupStatus: body = GroupStatus{}; break;
    case fb::Body_Replicate: {
      const auto* b = m->body_as_Replicate();
      if (b->event() > std::uint8_t(ReplicaEvent::snapshot)) {
        error = "Replicate message with unknown event " + std::to_string(int(b->event()));
        return false;
      }
      Replicate r{b->seq(), ReplicaEvent(b->event()), b->worker(), b->clock(), {}};
      if (const auto* p = b->push())
        r.push = Push{p->clock(), p->version_pulled(), p->batch(), p->checksum(), p->offset(),
                      p->length(), p->then_pull(), p->codec(), p->bytes(), p->piece(), p->pieces()};
      body = r;
      break;
    }
    case fb::Body_Replicated: body = Replicated{m->body_as_Replicated()->seq(), m->body_as_Replicated()->version()}; break;
    default:
      error = "unknown message type " + std::to_string(int(m->body_type()));
      return false;
  }
  return true;
}

}  // namespace

std::optional<Header> decode(const void* data, std::size_t size, std::string& error) {
  alignas(8) std::uint8_t local[512];
  std::unique_ptr<std::uint8_t[]> heap;
  const fb::Message* m = verified_message(data, size, error, heap, local, sizeof local);
  if (!m) return std::nullopt;
  Header h;
  h.sender = m->sender();
  h.shard = m->shard();
  if (!decode_body(m, h.body, error)) return std::nullopt;
  return h;
}

namespace {
#if defined(__x86_64__)
// The lane loop below, 16 words (4 rounds of the 4 lanes) per iteration in AVX2 registers
// (lane l in 64-bit element l): with X0..X3 the rounds' words, widened,
//   a' = a + X0 + X1 + X2 + X3,   b' = b + 4a + 4 X0 + 3 X1 + 2 X2 + X3,
// which is what four scalar rounds compute (all mod 2^64): bitwise the same sums, ~1.6x the
// speed. `rounds16` iterations; a and b are the 4 lanes' sums.
__attribute__((target("avx2"))) void lanes_avx2(const std::byte* src, std::size_t rounds16, std::uint64_t* a_io,
                                                std::uint64_t* b_io) {
  __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a_io));
  __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b_io));
  for (std::size_t r = 0; r < rounds16; ++r, src += 64) {
    const __m128i* in = reinterpret_cast<const __m128i*>(src);
    const __m256i x0 = _mm256_cvtepu32_epi64(_mm_loadu_si128(in));  // 4 words widened to 64 bits
    const __m256i t2 = _mm256_add_epi64(x0, _mm256_cvtepu32_epi64(_mm_loadu_si128(in + 1)));  // running sums
    const __m256i t3 = _mm256_add_epi64(t2, _mm256_cvtepu32_epi64(_mm_loadu_si128(in + 2)));
    const __m256i t4 = _mm256_add_epi64(t3, _mm256_cvtepu32_epi64(_mm_loadu_si128(in + 3)));
    b = _mm256_add_epi64(b, _mm256_add_epi64(_mm256_slli_epi64(a, 2),
                                             _mm256_add_epi64(_mm256_add_epi64(x0, t2), _mm256_add_epi64(t3, t4))));
    a = _mm256_add_epi64(a, t4);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(a_io), a);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(b_io), b);
}
const bool kHaveAvx2 = __builtin_cpu_supports("avx2");
#endif
}  // namespace

// Lanes: word i of the payload goes to lane i % 4; a[l] sums the words of lane l, b[l] sums
// the running a[l] (position-weighted), so word order matters too. A last partial word is
// zero-padded, and the byte count is folded in, so that padding cannot collide.
void Checksum::words(const std::byte* src, std::size_t n) {
  std::size_t i = 0;
  auto one = [&](std::size_t k) {
    std::uint32_t x;
    std::memcpy(&x, src + 4 * k, 4);
    const std::size_t l = (words_ + k) & 3;
    a_[l] += x;
    b_[l] += a_[l];
  };
  for (; i < n && ((words_ + i) & 3) != 0; ++i) one(i);  // up to the next lane-0 word
#if defined(__x86_64__)
  if (kHaveAvx2 && n - i >= 16) {
    const std::size_t rounds16 = (n - i) / 16;
    lanes_avx2(src + 4 * i, rounds16, a_, b_);
    i += 16 * rounds16;
  }
#endif
  std::uint64_t a0 = a_[0], a1 = a_[1], a2 = a_[2], a3 = a_[3], b0 = b_[0], b1 = b_[1], b2 = b_[2], b3 = b_[3];
  for (; i + 4 <= n; i += 4) {
    std::uint32_t x[4];
    std::memcpy(x, src + 4 * i, 16);
    a0 += x[0], a1 += x[1], a2 += x[2], a3 += x[3];
    b0 += a0, b1 += a1, b2 += a2, b3 += a3;
  }
  a_[0] = a0, a_[1] = a1, a_[2] = a2, a_[3] = a3, b_[0] = b0, b_[1] = b1, b_[2] = b2, b_[3] = b3;
  for (; i < n; ++i) one(i);
  words_ += n;
}

void Checksum::update_bytes(const void* data, std::size_t n) {
  const auto* p = static_cast<const std::byte*>(data);
  bytes_ += n;
  if (tail_n_) {  // complete the partial word of the previous piece
    const std::size_t take = std::min(n, 4 - tail_n_);
    std::memcpy(tail_ + tail_n_, p, take);
    tail_n_ += take, p += take, n -= take;
    if (tail_n_ < 4) return;
    words(tail_, 1);
    tail_n_ = 0;
  }
  words(p, n / 4);
  tail_n_ = n % 4;
  std::memcpy(tail_, p + n - tail_n_, tail_n_);
}

std::uint64_t Checksum::value() const {
  Checksum c = *this;
  if (c.tail_n_) {
    std::memset(c.tail_ + c.tail_n_, 0, 4 - c.tail_n_);
    c.words(c.tail_, 1);
  }
  // Combine lanes with odd multipliers (invertible mod 2^64) and fold in the length.
  std::uint64_t h = std::uint64_t(c.bytes_) * 0x9E3779B97F4A7C15ull;
  for (std::uint64_t v : {c.a_[0], c.a_[1], c.a_[2], c.a_[3], c.b_[0], c.b_[1], c.b_[2], c.b_[3]})
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  return h ^ (h >> 31);
}

void Checksum::append(const Checksum& next) {
  if (bytes_ % 16 != 0) throw std::logic_error("Checksum::append: the first piece is not a multiple of 16 bytes");
  // Word j of `next` is lane j % 4 here too; each of a's words adds to b once per later word
  // of its lane: b = b1 + b2 + a1 * (words of `next` in the lane).
  for (std::size_t l = 0; l < 4; ++l) {
    const std::uint64_t later = next.words_ / 4 + (l < next.words_ % 4 ? 1 : 0);
    b_[l] += next.b_[l] + a_[l] * later;
    a_[l] += next.a_[l];
  }
  words_ += next.words_;
  bytes_ += next.bytes_;
  std::memcpy(tail_, next.tail_, sizeof tail_);
  tail_n_ = next.tail_n_;
}

std::uint64_t checksum_bytes(const void* data, std::size_t bytes) {
  Checksum c;
  c.update_bytes(data, bytes);
  return c.value();
}

std::uint64_t checksum(const float* data, std::size_t n) { return checksum_bytes(data, n * sizeof(float)); }

std::uint64_t copy_with_checksum(float* dst, const float* src, std::size_t n) {
  // Piece by piece: checksum a piece while it is read into cache, then copy it with memcpy
  // (faster than copying inside the checksum loop).
  constexpr std::size_t kPiece = 8192;
  Checksum c;
  for (std::size_t lo = 0; lo < n; lo += kPiece) {
    const std::size_t m = std::min(kPiece, n - lo);
    c.update(src + lo, m);
    std::memcpy(dst + lo, src + lo, m * sizeof(float));
  }
  return c.value();
}

}  // namespace pslab::wire
