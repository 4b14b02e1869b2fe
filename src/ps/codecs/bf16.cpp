// bf16: the gradient as bfloat16 (float32's upper 16 bits: its range, an 8-bit significand),
// half the bytes of f32. Rounding to nearest, ties to even (relative error <= 2^-8 for normal
// values); infinities stay infinite, NaNs stay (quiet) NaNs.
#include <cstring>

#include "ps/codecs/codec.h"
#include "ps/errors.h"

namespace pslab {
namespace {

std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return std::uint16_t((u >> 16) | 0x0040u);  // NaN, quiet
  u += 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even (a carry into the exponent is right)
  return std::uint16_t(u >> 16);
}

class Bf16 final : public PushCodec {
 public:
  std::string name() const override { return "bf16"; }
  std::uint8_t wire_id() const override { return 2; }
  std::size_t max_bytes(std::size_t n) const override { return n * 2; }
  std::size_t encode(const float* grad, std::size_t n, std::byte* out) override {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t b = to_bf16(grad[i]);
      std::memcpy(out + 2 * i, &b, 2);
    }
    return n * 2;
  }
  void decode(std::span<const std::byte> payload, std::size_t n, float* out) const override {
    if (payload.size() != n * 2)
      throw PayloadError("bf16 payload of " + std::to_string(payload.size()) + " bytes for " + std::to_string(n) +
                         " floats (expected " + std::to_string(n * 2) + ")");
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t b;
      std::memcpy(&b, payload.data() + 2 * i, 2);
      const std::uint32_t u = std::uint32_t(b) << 16;
      std::memcpy(out + i, &u, sizeof u);
    }
  }
};

}  // namespace

std::unique_ptr<PushCodec> make_bf16(const std::string&) { return std::make_unique<Bf16>(); }

}  // namespace pslab
