// 16-bit floats on the wire: IEEE binary16 (f16) and bfloat16 (bf16), converted from and to
// float32 by rounding to nearest, ties to even. What the f16 / bf16 push codecs send and what an
// all-reduce in those formats carries (cluster.codec in allreduce mode).
//   f16   relative error <= 2^-11 for |x| in [2^-14, 65504]; smaller magnitudes become
//         subnormals or zero; finite values beyond ±65504 are saturated to it (an infinity
//         would make an update non-finite); infinities and NaNs stay what they are. F16C
//         instructions where the CPU has them (the same rounding), integer arithmetic elsewhere.
//   bf16  float32's range, relative error <= 2^-8 for normal values; infinities stay, NaNs stay
//         (quiet) NaNs.
// Buffers of 16-bit values may be unaligned (a payload inside a message).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pslab {

enum class HalfFormat { f16, bf16 };

std::uint16_t to_half(HalfFormat f, float x);
float from_half(HalfFormat f, std::uint16_t h);
// n floats -> n 16-bit values at `out` (2 n bytes).
void encode_half(HalfFormat f, const float* in, std::size_t n, void* out);
// n 16-bit values at `in` (2 n bytes) -> n floats.
void decode_half(HalfFormat f, const void* in, std::size_t n, float* out);
// As encode_half / decode_half for scale x the values: multiplied by `scale` before rounding, by
// 1 / scale after decoding (a power of two keeps both exact: values moved into the format's
// normal range, e.g. gradients averaged over a large batch, lose nothing more to the scaling).
void encode_half_scaled(HalfFormat f, const float* in, std::size_t n, float scale, void* out);
void decode_half_scaled(HalfFormat f, const void* in, std::size_t n, float scale, float* out);
// How many of n decoded values (times `scale` on the wire) sit at f16's largest magnitude, 65504:
// saturated on the way, or in a sum (a bf16 wire never saturates: 0).
std::size_t saturated_half(HalfFormat f, const float* decoded, std::size_t n, float scale);
// out[i] = the 16-bit value of a[i] + b[i] summed in float32 (n values each; out may be a or b).
void add_half(HalfFormat f, const void* a, const void* b, std::size_t n, void* out);

}  // namespace pslab
