// cluster.pull_codec (f16, bf16): a shard's θ as workers pull it, encoded once per version.
// Pull replies reference an encoded buffer until the transport is done with it (as ParamVersions
// does for f32 θ): a new version is encoded into a buffer that no send references, so nothing
// is allocated per step once the pool has as many buffers as replies overlap. The evaluator
// always pulls f32.
//
// Sound for the codecs that round each value (f16, bf16): a worker computes on θ within the
// format's rounding of the servers' θ, which stays float32 and takes every update in full; the
// rounding does not accumulate. Codecs that drop values (topk, sign) or share a scale (int8)
// are refused for pulls (run/config.cpp).
//
// Threading: the server's event loop, except release() (the transport's I/O thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "ps/codecs/codec.h"

namespace pslab {

class EncodedVersions {
 public:
  struct Buffer {
    std::vector<std::byte> bytes;   // max_bytes(n), allocated once
    std::size_t size = 0;           // bytes of the encoding
    std::uint64_t checksum = 0;     // wire::checksum_bytes of them
    long version = -1;              // the shard version encoded (-1: none)
    std::atomic<int> in_flight{0};  // sends referencing it
  };
  // `codec`: the pull codec; `n`: the shard's floats.
  EncodedVersions(std::unique_ptr<PushCodec> codec, std::size_t n);
  // The encoding of `theta` (n floats) at `version`, encoded now unless the latest encoding is
  // of it, marked as referenced by one more send: pass it to release() when the send is done.
  Buffer* acquire(const float* theta, long version);
  static void release(Buffer* b) { b->in_flight.fetch_sub(1, std::memory_order_release); }
  std::uint8_t wire_id() const { return codec_->wire_id(); }
  std::size_t buffers() const { return pool_.size(); }

 private:
  std::unique_ptr<PushCodec> codec_;
  std::size_t n_;
  std::vector<std::unique_ptr<Buffer>> pool_;
  Buffer* latest_ = nullptr;
};

}  // namespace pslab
