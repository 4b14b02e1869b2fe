// f16 and bf16: the gradient as 16-bit floats, half the bytes of f32, each value rounded to
// nearest, ties to even (comm/half.h):
//   f16   IEEE binary16: relative error <= 2^-11 for |g| in [2^-14, 65504]; smaller magnitudes
//         become subnormals or zero; finite values beyond ±65504 are saturated to it (an
//         infinity would make the update non-finite); infinities and NaNs stay what they are
//   bf16  bfloat16 (float32's upper 16 bits): float32's range, relative error <= 2^-8
#include "comm/half.h"
#include "ps/codecs/codec.h"
#include "ps/errors.h"

namespace pslab {
namespace {

class HalfCodec final : public PushCodec {
 public:
  HalfCodec(HalfFormat format, std::string name, std::uint8_t wire_id)
      : format_(format), name_(std::move(name)), wire_id_(wire_id) {}
  std::string name() const override { return name_; }
  std::uint8_t wire_id() const override { return wire_id_; }
  std::size_t max_bytes(std::size_t n) const override { return n * 2; }
  std::size_t encode(const float* grad, std::size_t n, std::byte* out) override {
    encode_half(format_, grad, n, out);
    return n * 2;
  }
  void decode(std::span<const std::byte> payload, std::size_t n, float* out) const override {
    if (payload.size() != n * 2)
      throw PayloadError(name_ + " payload of " + std::to_string(payload.size()) + " bytes for " + std::to_string(n) +
                         " floats (expected " + std::to_string(n * 2) + ")");
    decode_half(format_, payload.data(), n, out);
  }

 private:
  HalfFormat format_;
  std::string name_;
  std::uint8_t wire_id_;
};

}  // namespace

std::unique_ptr<PushCodec> make_f16(const std::string&) { return std::make_unique<HalfCodec>(HalfFormat::f16, "f16", 1); }
std::unique_ptr<PushCodec> make_bf16(const std::string&) { return std::make_unique<HalfCodec>(HalfFormat::bf16, "bf16", 2); }

}  // namespace pslab
