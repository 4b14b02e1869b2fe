// f16: the gradient as IEEE binary16, half the bytes of f32. Rounding to nearest, ties to even
// (relative error <= 2^-11 for |g| in [2^-14, 65504]); smaller magnitudes become binary16's
// subnormals or zero; finite values beyond ±65504 are saturated to it (an infinity would make
// the update non-finite); infinities and NaNs stay what they are.
#include "comm/half.h"
#include "ps/codecs/codec.h"
#include "ps/errors.h"

namespace pslab {
namespace {

class F16 final : public PushCodec {
 public:
  std::string name() const override { return "f16"; }
  std::uint8_t wire_id() const override { return 1; }
  std::size_t max_bytes(std::size_t n) const override { return n * 2; }
  std::size_t encode(const float* grad, std::size_t n, std::byte* out) override {
    encode_half(HalfFormat::f16, grad, n, out);
    return n * 2;
  }
  void decode(std::span<const std::byte> payload, std::size_t n, float* out) const override {
    if (payload.size() != n * 2)
      throw PayloadError("f16 payload of " + std::to_string(payload.size()) + " bytes for " + std::to_string(n) +
                         " floats (expected " + std::to_string(n * 2) + ")");
    decode_half(HalfFormat::f16, payload.data(), n, out);
  }
};

}  // namespace

std::unique_ptr<PushCodec> make_f16(const std::string&) { return std::make_unique<F16>(); }

}  // namespace pslab
