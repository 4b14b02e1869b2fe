// f32: the gradient as dense float32, its bytes as they are in memory. pslab's default: sent
// zero-copy from the worker's gradient buffer, applied in place on the server.
#include <cstring>

#include "ps/codecs/codec.h"
#include "ps/errors.h"

namespace pslab {
namespace {

class F32 final : public PushCodec {
 public:
  std::string name() const override { return "f32"; }
  std::uint8_t wire_id() const override { return 0; }
  std::size_t max_bytes(std::size_t n) const override { return n * sizeof(float); }
  std::size_t encode(const float* grad, std::size_t n, std::byte* out) override {
    std::memcpy(out, grad, n * sizeof(float));
    return n * sizeof(float);
  }
  void decode(std::span<const std::byte> payload, std::size_t n, float* out) const override {
    if (payload.size() != n * sizeof(float))
      throw PayloadError("f32 payload of " + std::to_string(payload.size()) + " bytes for " + std::to_string(n) +
                         " floats (expected " + std::to_string(n * sizeof(float)) + ")");
    std::memcpy(out, payload.data(), payload.size());
  }
  bool dense_f32() const override { return true; }
};

}  // namespace

std::unique_ptr<PushCodec> make_f32(const std::string&) { return std::make_unique<F32>(); }

}  // namespace pslab
