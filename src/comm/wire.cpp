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
// The lane loops below add the words as they are, in 32-bit sums, and fold those into the
// 64-bit lanes every block of at most kBlockSteps steps: one add per word and per sum, no
// widening. A step reads S = `phases` rounds of the 4 lanes (16 S bytes) into 32-bit elements
// e = 4 p + l (round p of the step, lane l), and for each element
//   A += x,  B += A         (A = Σ x,  B = Σ (M − k) x_k over the block's M steps)
//   Ah += x >> 16, Bh += Ah (the same sums of the high halves)
// all modulo 2^32. The high halves' sums are exact (Bh ≤ 65535 M (M + 1) / 2 < 2^32 for
// M ≤ 361), and so are those of the low halves, recovered as A − 2^16 Ah (mod 2^32); hence the
// exact A and B. Round p of step k is round S k + p of the block in its lane, so over the block
//   a' = a + Σ_p A_p,   b' = b + S M a + Σ_p (S B_p − p A_p)
// which is what the scalar rounds compute (all mod 2^64): bitwise the same sums.
constexpr std::size_t kBlockSteps = 256;

void fold_block(int phases, std::size_t steps, const std::uint32_t* A, const std::uint32_t* Ah, const std::uint32_t* B,
                const std::uint32_t* Bh, std::uint64_t* a, std::uint64_t* b) {
  auto exact = [](std::uint32_t sum, std::uint32_t high) {  // the high halves' sum is exact
    return std::uint64_t(std::uint32_t(sum - (high << 16))) + (std::uint64_t(high) << 16);
  };
  const std::uint64_t S = std::uint64_t(phases);
  for (int l = 0; l < 4; ++l) {
    std::uint64_t da = 0, db = 0;
    for (int p = 0; p < phases; ++p) {
      const int e = 4 * p + l;
      const std::uint64_t ap = exact(A[e], Ah[e]), bp = exact(B[e], Bh[e]);
      da += ap;
      db += S * bp - std::uint64_t(p) * ap;
    }
    b[l] += S * steps * a[l] + db;
    a[l] += da;
  }
}

// Steps of 64 bytes (4 rounds) in two AVX2 registers; `steps` steps from src.
__attribute__((target("avx2"))) void lanes_avx2(const std::byte* src, std::size_t steps, std::uint64_t* a,
                                                std::uint64_t* b) {
  while (steps) {
    const std::size_t m = std::min(steps, kBlockSteps);
    __m256i A0 = _mm256_setzero_si256(), A1 = A0, Ah0 = A0, Ah1 = A0, B0 = A0, B1 = A0, Bh0 = A0, Bh1 = A0;
    for (std::size_t k = 0; k < m; ++k, src += 64) {
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
      A0 = _mm256_add_epi32(A0, x0), A1 = _mm256_add_epi32(A1, x1);
      Ah0 = _mm256_add_epi32(Ah0, _mm256_srli_epi32(x0, 16)), Ah1 = _mm256_add_epi32(Ah1, _mm256_srli_epi32(x1, 16));
      B0 = _mm256_add_epi32(B0, A0), B1 = _mm256_add_epi32(B1, A1);
      Bh0 = _mm256_add_epi32(Bh0, Ah0), Bh1 = _mm256_add_epi32(Bh1, Ah1);
    }
    alignas(32) std::uint32_t s[4][16];
    const __m256i sums[4][2] = {{A0, A1}, {Ah0, Ah1}, {B0, B1}, {Bh0, Bh1}};
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h) _mm256_store_si256(reinterpret_cast<__m256i*>(s[j] + 8 * h), sums[j][h]);
    fold_block(4, m, s[0], s[1], s[2], s[3], a, b);
    steps -= m;
  }
}

// x >> 16 per 32-bit element (GCC 12's _mm512_srli_epi32 warns of an undefined passthrough).
__attribute__((target("avx512f"))) inline __m512i high16(__m512i x) { return __m512i(__v16su(x) >> 16); }

// Steps of 128 bytes (8 rounds) in two AVX-512 registers.
__attribute__((target("avx512f"))) void lanes_avx512(const std::byte* src, std::size_t steps, std::uint64_t* a,
                                                     std::uint64_t* b) {
  while (steps) {
    const std::size_t m = std::min(steps, kBlockSteps);
    __m512i A0 = _mm512_setzero_si512(), A1 = A0, Ah0 = A0, Ah1 = A0, B0 = A0, B1 = A0, Bh0 = A0, Bh1 = A0;
    for (std::size_t k = 0; k < m; ++k, src += 128) {
      const __m512i x0 = _mm512_loadu_si512(src), x1 = _mm512_loadu_si512(src + 64);
      A0 = _mm512_add_epi32(A0, x0), A1 = _mm512_add_epi32(A1, x1);
      Ah0 = _mm512_add_epi32(Ah0, high16(x0)), Ah1 = _mm512_add_epi32(Ah1, high16(x1));
      B0 = _mm512_add_epi32(B0, A0), B1 = _mm512_add_epi32(B1, A1);
      Bh0 = _mm512_add_epi32(Bh0, Ah0), Bh1 = _mm512_add_epi32(Bh1, Ah1);
    }
    alignas(64) std::uint32_t s[4][32];
    const __m512i sums[4][2] = {{A0, A1}, {Ah0, Ah1}, {B0, B1}, {Bh0, Bh1}};
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h) _mm512_store_si512(s[j] + 16 * h, sums[j][h]);
    fold_block(8, m, s[0], s[1], s[2], s[3], a, b);
    steps -= m;
  }
}
const bool kHaveAvx2 = __builtin_cpu_supports("avx2");
const bool kHaveAvx512 = __builtin_cpu_supports("avx512f");
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
  if (kHaveAvx512 && simd_ == Simd::best && n - i >= 32) {
    const std::size_t steps = (n - i) / 32;
    lanes_avx512(src + 4 * i, steps, a_, b_);
    i += 32 * steps;
  }
  if (kHaveAvx2 && simd_ != Simd::none && n - i >= 16) {
    const std::size_t steps = (n - i) / 16;
    lanes_avx2(src + 4 * i, steps, a_, b_);
    i += 16 * steps;
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
