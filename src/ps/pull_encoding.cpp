#include "ps/pull_encoding.h"

#include "comm/wire.h"

namespace pslab {

EncodedVersions::EncodedVersions(std::unique_ptr<PushCodec> codec, std::size_t n) : codec_(std::move(codec)), n_(n) {}

EncodedVersions::Buffer* EncodedVersions::acquire(const float* theta, long version) {
  if (!latest_ || latest_->version != version) {
    Buffer* free = nullptr;
    for (auto& b : pool_)
      if (b->in_flight.load(std::memory_order_acquire) == 0) {
        free = b.get();
        break;
      }
    if (!free) {
      pool_.push_back(std::make_unique<Buffer>());
      free = pool_.back().get();
      free->bytes.resize(codec_->max_bytes(n_));
    }
    free->size = codec_->encode(theta, n_, free->bytes.data());
    free->checksum = wire::checksum_bytes(free->bytes.data(), free->size);
    free->version = version;
    latest_ = free;
  }
  latest_->in_flight.fetch_add(1, std::memory_order_relaxed);
  return latest_;
}

}  // namespace pslab
