// bf16: the gradient as bfloat16 (float32's upper 16 bits: its range, an 8-bit significand),
// half the bytes of f32. Rounding to nearest, ties to even (comm/half.h).
#include "comm/half.h"
#include "ps/codecs/codec.h"
#include "ps/errors.h"

namespace pslab {
namespace {

class Bf16 final : public PushCodec {
 public:
  std::string name() const override { return "bf16"; }
  std::uint8_t wire_id() const override { return 2; }
  std::size_t max_bytes(std::size_t n) const override { return n * 2; }
  std::size_t encode(const float* grad, std::size_t n, std::byte* out) override {
    encode_half(HalfFormat::bf16, grad, n, out);
    return n * 2;
  }
  void decode(std::span<const std::byte> payload, std::size_t n, float* out) const override {
    if (payload.size() != n * 2)
      throw PayloadError("bf16 payload of " + std::to_string(payload.size()) + " bytes for " + std::to_string(n) +
                         " floats (expected " + std::to_string(n * 2) + ")");
    decode_half(HalfFormat::bf16, payload.data(), n, out);
  }
};

}  // namespace

std::unique_ptr<PushCodec> make_bf16(const std::string&) { return std::make_unique<Bf16>(); }

}  // namespace pslab
