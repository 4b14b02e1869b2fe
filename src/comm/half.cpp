#include "comm/half.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pslab {
namespace {

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// float -> binary16, to nearest, ties to even, in integer arithmetic (compilers without
// hardware half conversion call a slow library routine for _Float16): the tail of a payload,
// or all of it where the CPU has no F16C.
std::uint16_t to_f16(float x) {
  std::uint32_t f = bits(x);
  const std::uint32_t sign = f & 0x80000000u;
  f ^= sign;
  std::uint16_t o;
  if (f >= (127u + 16u) << 23) {  // beyond binary16's range (finite ones were saturated): inf, NaN
    o = f > 255u << 23 ? 0x7e00 : 0x7c00;
  } else if (f < 113u << 23) {  // a binary16 subnormal or zero: let the FPU round it
    const float magic = from_bits(((127u - 15u) + (23u - 10u) + 1u) << 23);
    o = std::uint16_t(bits(from_bits(f) + magic) - bits(magic));
  } else {
    const std::uint32_t odd = (f >> 13) & 1u;
    f += ((15u - 127u) << 23) + 0xfffu + odd;  // rebias, round to nearest even
    o = std::uint16_t(f >> 13);
  }
  return std::uint16_t(o | (sign >> 16));
}

float from_f16(std::uint16_t h) {
  const std::uint32_t shifted_exp = 0x7c00u << 13;
  std::uint32_t o = (h & 0x7fffu) << 13;
  const std::uint32_t exp = shifted_exp & o;
  o += (127u - 15u) << 23;
  if (exp == shifted_exp) {
    o += (128u - 16u) << 23;  // inf, NaN
  } else if (exp == 0) {      // zero, subnormal: renormalise through the FPU
    o += 1u << 23;
    o = bits(from_bits(o) - from_bits(113u << 23));
  }
  return from_bits(o | (std::uint32_t(h & 0x8000u) << 16));
}

#if defined(__x86_64__)
// x86 with F16C (checked at run time): 8 conversions per instruction, the same IEEE rounding.
bool have_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return yes;
}

// Converts the first n - n % 8 floats; returns how many.
__attribute__((target("avx,f16c"))) std::size_t encode_f16c(const float* g, std::size_t n, std::byte* out) {
  const __m256 most = _mm256_set1_ps(65504.0f), least = _mm256_set1_ps(-65504.0f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(g + i);
    const __m256 finite = _mm256_cmp_ps(_mm256_and_ps(v, abs_mask), inf, _CMP_LT_OQ);
    const __m256 clamped = _mm256_max_ps(_mm256_min_ps(v, most), least);
    const __m128i h = _mm256_cvtps_ph(_mm256_blendv_ps(v, clamped, finite), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  return i;
}

__attribute__((target("avx,f16c"))) std::size_t decode_f16c(const std::byte* in, std::size_t n, float* out) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i))));
  return i;
}
#else
bool have_f16c() { return false; }
std::size_t encode_f16c(const float*, std::size_t, std::byte*) { return 0; }
std::size_t decode_f16c(const std::byte*, std::size_t, float*) { return 0; }
#endif

std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return std::uint16_t((u >> 16) | 0x0040u);  // NaN, quiet
  u += 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even (a carry into the exponent is right)
  return std::uint16_t(u >> 16);
}


float from_bf16(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

constexpr float kF16Most = 65504.0f;

}  // namespace

std::uint16_t to_half(HalfFormat f, float x) {
  if (f == HalfFormat::bf16) return to_bf16(x);
  return to_f16(std::isfinite(x) ? std::clamp(x, -kF16Most, kF16Most) : x);
}

float from_half(HalfFormat f, std::uint16_t h) { return f == HalfFormat::bf16 ? from_bf16(h) : from_f16(h); }

void encode_half(HalfFormat f, const float* in, std::size_t n, void* out) {
  std::byte* o = static_cast<std::byte*>(out);
  std::size_t i = f == HalfFormat::f16 && have_f16c() ? encode_f16c(in, n, o) : 0;
  for (; i < n; ++i) {
    const std::uint16_t h = to_half(f, in[i]);
    std::memcpy(o + 2 * i, &h, 2);
  }
}

void decode_half(HalfFormat f, const void* in, std::size_t n, float* out) {
  const std::byte* p = static_cast<const std::byte*>(in);
  std::size_t i = f == HalfFormat::f16 && have_f16c() ? decode_f16c(p, n, out) : 0;
  for (; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    out[i] = from_half(f, h);
  }
}

namespace {
constexpr std::size_t kBlock = 512;  // floats on the stack per pass of the block-wise functions
}  // namespace

void encode_half_scaled(HalfFormat f, const float* in, std::size_t n, float scale, void* out) {
  if (scale == 1.0f) return encode_half(f, in, n, out);
  float x[kBlock];
  for (std::size_t lo = 0; lo < n; lo += kBlock) {
    const std::size_t k = std::min(kBlock, n - lo);
    for (std::size_t i = 0; i < k; ++i) x[i] = in[lo + i] * scale;
    encode_half(f, x, k, static_cast<std::byte*>(out) + 2 * lo);
  }
}

void decode_half_scaled(HalfFormat f, const void* in, std::size_t n, float scale, float* out) {
  decode_half(f, in, n, out);
  if (scale == 1.0f) return;
  const float inv = 1.0f / scale;
  for (std::size_t i = 0; i < n; ++i) out[i] *= inv;
}

std::size_t saturated_half(HalfFormat f, const float* decoded, std::size_t n, float scale) {
  if (f != HalfFormat::f16) return 0;
  const float most = kF16Most / scale;  // (a power of two: exact)
  std::size_t k = 0;
  for (std::size_t i = 0; i < n; ++i) k += std::abs(decoded[i]) >= most && std::isfinite(decoded[i]);
  return k;
}

void add_half(HalfFormat f, const void* a, const void* b, std::size_t n, void* out) {
  float x[kBlock], y[kBlock];
  for (std::size_t lo = 0; lo < n; lo += kBlock) {
    const std::size_t k = std::min(kBlock, n - lo);
    decode_half(f, static_cast<const std::byte*>(a) + 2 * lo, k, x);
    decode_half(f, static_cast<const std::byte*>(b) + 2 * lo, k, y);
    for (std::size_t i = 0; i < k; ++i) x[i] += y[i];
    encode_half(f, x, k, static_cast<std::byte*>(out) + 2 * lo);
  }
}

}  // namespace pslab
