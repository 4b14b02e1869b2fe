#include "core/sampler.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "core/rng.h"

namespace pslab {

ShardSampler::ShardSampler(std::size_t n, int world, int rank, std::uint64_t seed)
    : n_(n), world_(world), rank_(rank), seed_(seed) {
  if (world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("ShardSampler: rank " + std::to_string(rank) +
                                " is not in [0, " + std::to_string(world) + ")");
  if (n > UINT32_MAX) throw std::invalid_argument("ShardSampler: data set too large");
  begin_ = shard_begin(rank);
  end_ = shard_begin(rank + 1);
  perm_.resize(n);
}

void ShardSampler::set_epoch(long epoch) {
  if (epoch == epoch_) return;
  epoch_ = epoch;
  std::iota(perm_.begin(), perm_.end(), 0u);
  Rng rng = Rng::derive(seed_, {0x5A3u, std::uint64_t(epoch)});
  for (std::size_t i = n_; i > 1; --i) std::swap(perm_[i - 1], perm_[rng.below(i)]);  // Fisher-Yates
}

long ShardSampler::steps_per_epoch(std::size_t n, int world, int batch) {
  const std::size_t largest = (n + std::size_t(world) - 1) / std::size_t(world);
  return long((largest + std::size_t(batch) - 1) / std::size_t(batch));
}

int ShardSampler::batch_in_shard(std::size_t size, long step, int batch) {
  const std::size_t lo = std::size_t(step) * std::size_t(batch);
  return lo >= size ? 0 : int(std::min<std::size_t>(std::size_t(batch), size - lo));
}

int ShardSampler::batch_size(long step, int batch) const {
  return batch_in_shard(shard_size(), step, batch);
}

std::span<const std::uint32_t> ShardSampler::batch(long step, int batch) const {
  if (epoch_ < 0) throw std::logic_error("ShardSampler::batch before set_epoch");
  const std::size_t lo = std::size_t(step) * std::size_t(batch);
  return {perm_.data() + begin_ + std::min(lo, shard_size()), std::size_t(batch_size(step, batch))};
}

long ShardSampler::global_batch_size(long step, int batch) const {
  long total = 0;
  for (int r = 0; r < world_; ++r)
    total += batch_in_shard(shard_begin(r + 1) - shard_begin(r), step, batch);
  return total;
}

}  // namespace pslab
