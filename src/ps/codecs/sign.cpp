// sign: one bit per entry (its sign) and one float32 scale, the mean |g| of the slice (signSGD
// with scaling, as in Karimireddy et al. 2019's EF-SignSGD): 1/32 of f32's bytes. With error
// feedback (on by default for sign) what the signs leave out goes into the next push.
#include <cmath>
#include <cstring>

#include "ps/codecs/codec.h"
#include "ps/errors.h"

namespace pslab {
namespace {

class Sign final : public PushCodec {
 public:
  std::string name() const override { return "sign"; }
  std::uint8_t wire_id() const override { return 5; }
  std::size_t max_bytes(std::size_t n) const override { return 4 + (n + 7) / 8; }
  bool wants_error_feedback() const override { return true; }
  std::size_t encode(const float* grad, std::size_t n, std::byte* out) override {
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += std::abs(double(grad[i]));
    const float scale = n ? float(sum / double(n)) : 0.0f;
    std::memcpy(out, &scale, 4);
    std::memset(out + 4, 0, (n + 7) / 8);
    for (std::size_t i = 0; i < n; ++i)
      if (std::signbit(grad[i])) out[4 + i / 8] |= std::byte(1u << (i % 8));
    return 4 + (n + 7) / 8;
  }
  void decode(std::span<const std::byte> payload, std::size_t n, float* out) const override {
    if (payload.size() != 4 + (n + 7) / 8)
      throw PayloadError("sign payload of " + std::to_string(payload.size()) + " bytes for " + std::to_string(n) +
                         " floats (expected " + std::to_string(4 + (n + 7) / 8) + ")");
    float scale;
    std::memcpy(&scale, payload.data(), 4);
    if (!std::isfinite(scale) || scale < 0) throw PayloadError("sign payload with scale " + std::to_string(scale));
    for (std::size_t i = 0; i < n; ++i)
      out[i] = (std::to_integer<unsigned>(payload[4 + i / 8]) >> (i % 8)) & 1u ? -scale : scale;
  }
};

}  // namespace

std::unique_ptr<PushCodec> make_sign(const std::string&) { return std::make_unique<Sign>(); }

}  // namespace pslab
