// A push codec: how a slice of ∇θ travels as payload bytes. One class per encoding, one file
// each (f32.cpp), created from cluster.codec by codec_registry(). The worker encodes each
// shard's slice; the server decodes it into a dense view and updates θ with it.
//
// Integrity is the header's business, not the codec's: the checksum covers the payload bytes
// (wire::checksum_bytes), checked by the server before it decodes (for dense f32, in the same
// pass as the update). The header also carries the codec's wire id, the element count and the
// byte length, so that a payload the run's codec cannot decode is refused like any bad input.
//
// Error feedback wraps a codec (with_error_feedback); encode() may therefore keep state (the
// client keeps one codec object per shard), decode() keeps none.
// Threading: one thread per codec object.
#pragma once

#include <vector>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/registry.h"

namespace pslab {

class PushCodec {
 public:
  virtual ~PushCodec() = default;
  // As cluster.codec names it, e.g. "f32".
  virtual std::string name() const = 0;
  // On the wire (Push.codec). 0 is dense float32; each codec has its own.
  virtual std::uint8_t wire_id() const = 0;
  // Payload bytes for n floats: exact for fixed-size encodings, an upper bound otherwise.
  virtual std::size_t max_bytes(std::size_t n) const = 0;
  // Encodes grad (n floats) into out (max_bytes(n) bytes); returns the bytes written.
  virtual std::size_t encode(const float* grad, std::size_t n, std::byte* out) = 0;
  // Decodes a payload into out (n floats). Throws PayloadError (ps/errors.h) when the bytes
  // are not an encoding of n floats.
  virtual void decode(std::span<const std::byte> payload, std::size_t n, float* out) const = 0;
  // Whether the payload is the dense float32 gradient itself: then the worker sends its buffer
  // as is (no encode), and the server reads it in place (no decode, no copy).
  virtual bool dense_f32() const { return false; }
  // Whether cluster.error_feedback = "auto" wraps it in error feedback (lossy codecs that drop
  // much of each push: topk, sign).
  virtual bool wants_error_feedback() const { return false; }
  // With error feedback: what this encoder still owes (its slice's residual); else null.
  virtual const std::vector<float>* residual() const { return nullptr; }
};

// `inner` with error feedback (error_feedback.cpp): each encode sends inner's encoding of the
// slice plus what earlier encodes left out, and keeps what this one leaves out. One object
// per slice (a worker's shard).
std::unique_ptr<PushCodec> with_error_feedback(std::unique_ptr<PushCodec> inner);

// cluster.codec -> codec. Built-ins: f32, f16, bf16, int8, topk:<f>, sign (ps/codecs/registry.cpp).
Registry<PushCodec>& codec_registry();
inline std::unique_ptr<PushCodec> make_codec(const std::string& name) { return codec_registry().make(name); }

}  // namespace pslab
