// Which training samples each worker sees, step by step.
//
// Every epoch the whole index range [0, n) is permuted from (seed, epoch) and cut into
// `world` contiguous, balanced shards (sizes differ by at most one); worker `rank` reads its
// shard in batches. The union of the shards is the whole set, every epoch, and the shards
// are disjoint. All ranks run the same number of steps per epoch: a rank whose shard is one
// sample shorter may get a smaller (possibly empty) last batch, which the synchronous modes
// weight by its size.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace pslab {

class ShardSampler {
 public:
  ShardSampler(std::size_t n, int world, int rank, std::uint64_t seed);

  // Draws the permutation of `epoch` (0-based). Call before batch() in each epoch.
  void set_epoch(long epoch);
  long epoch() const { return epoch_; }

  std::size_t shard_size() const { return end_ - begin_; }
  // Steps per epoch, identical for every rank: ceil(largest shard / batch).
  long steps_per_epoch(int batch) const { return steps_per_epoch(n_, world_, batch); }
  static long steps_per_epoch(std::size_t n, int world, int batch);
  // Samples in the batch of `step` (0-based within the epoch) for this rank; 0 past the end.
  int batch_size(long step, int batch) const;
  // The global sample indices of that batch (a view into the permutation).
  std::span<const std::uint32_t> batch(long step, int batch) const;
  // This rank's shard of the epoch's permutation, which every batch() views: the same memory
  // for the sampler's life, its contents those of epoch() (set_epoch() rewrites them).
  std::span<const std::uint32_t> shard() const { return {perm_.data() + begin_, end_ - begin_}; }
  // Samples in step `step` summed over all ranks (the global batch), without communication.
  long global_batch_size(long step, int batch) const;

 private:
  std::size_t shard_begin(int r) const { return n_ * std::size_t(r) / std::size_t(world_); }
  // Samples of batch `step` in a shard of `size` samples.
  static int batch_in_shard(std::size_t size, long step, int batch);
  std::size_t n_;
  int world_, rank_;
  std::uint64_t seed_;
  long epoch_ = -1;
  std::size_t begin_, end_;
  std::vector<std::uint32_t> perm_;
};

}  // namespace pslab
