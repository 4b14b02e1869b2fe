// int8: a slice as one float32 scale (max |g| / 127) and one signed byte per entry, rounded to
// nearest: about a quarter of f32's bytes, each entry within scale / 2 of the gradient.
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>

#include "ps/codecs/codec.h"
#include "ps/errors.h"

namespace pslab {
namespace {

class Int8 final : public PushCodec {
 public:
  std::string name() const override { return "int8"; }
  std::uint8_t wire_id() const override { return 4; }
  std::size_t max_bytes(std::size_t n) const override { return 4 + n; }
  std::size_t encode(const float* grad, std::size_t n, std::byte* out) override {
    float most = 0.0f;
    for (std::size_t i = 0; i < n; ++i) most = std::max(most, std::abs(grad[i]));  // NaN is not > : skipped
    // (at least the smallest normal float: most / 127 of a denormal |g| rounds to 0, not a scale)
    const float scale = most > 0 && std::isfinite(most) ? std::max(most / 127.0f, std::numeric_limits<float>::min())
                                                        : (std::isfinite(most) ? 1.0f : most);
    std::memcpy(out, &scale, 4);
    for (std::size_t i = 0; i < n; ++i) {
      const float q = std::nearbyint(std::clamp(grad[i] / scale, -127.0f, 127.0f));
      out[4 + i] = std::byte(std::uint8_t(std::int8_t(std::isfinite(q) ? q : 0.0f)));
    }
    return 4 + n;
  }
  void decode(std::span<const std::byte> payload, std::size_t n, float* out) const override {
    if (payload.size() != 4 + n)
      throw PayloadError("int8 payload of " + std::to_string(payload.size()) + " bytes for " + std::to_string(n) +
                         " floats (expected " + std::to_string(4 + n) + ")");
    float scale;
    std::memcpy(&scale, payload.data(), 4);
    if (!std::isfinite(scale) || scale <= 0) throw PayloadError("int8 payload with scale " + std::to_string(scale));
    for (std::size_t i = 0; i < n; ++i) out[i] = scale * float(std::int8_t(std::uint8_t(payload[4 + i])));
  }
};

}  // namespace

std::unique_ptr<PushCodec> make_int8(const std::string&) { return std::make_unique<Int8>(); }

}  // namespace pslab
