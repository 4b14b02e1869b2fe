// A batch's indices on a GPU (Replica::follow, core/replica.h), on a CPU backend whose uploads
// land late, as a GPU's copy engine's do (tests/support/lagging_backend.h): a replica that
// follows its sampler uploads each epoch's shard once, not each batch's indices, and trains to
// bitwise the θ of one that uploads every batch's; batches that are not views into the shard
// still upload their own.
#include <gtest/gtest.h>

#include <vector>

#include "core/replica.h"
#include "core/sampler.h"
#include "lagging_backend.h"

using namespace pslab;

namespace {

constexpr int kBatch = 16, kEpochs = 3;

struct Trained {
  std::vector<float> theta;
  std::size_t uploads = 0;
};

// kEpochs epochs of rank 1 of 2 (a shard that does not start at the permutation's start) on 50
// samples: steps of 16 and 9 samples, SGD between them. Every `own_every`-th step's indices
// are a copy of the batch, not a view into the sampler's shard.
Trained train(bool follow, int own_every) {
  Dataset d;
  d.n = 50, d.channels = 1, d.height = 4, d.width = 4, d.classes = 3;
  d.x.resize(std::size_t(d.n) * d.features());
  d.labels.resize(std::size_t(d.n));
  Rng rng(5);
  for (auto& v : d.x) v = float(rng.normal());
  for (auto& l : d.labels) l = std::int32_t(rng.below(3));
  ModelSpec spec;
  spec.kind = "mlp", spec.channels = 1, spec.height = 4, spec.width = 4, spec.outputs = 3, spec.hidden = {8};

  test::LaggingBackend be(1000);  // a copy lands only when waited for
  Replica replica(be, spec, d, kBatch);
  replica.model().init(3);
  ShardSampler sampler(std::size_t(d.n), 2, 1, 7);
  if (follow) replica.follow(sampler);
  const long spe = sampler.steps_per_epoch(kBatch);
  std::vector<std::uint32_t> own;
  for (long step = 0; step < kEpochs * spe; ++step) {
    sampler.set_epoch(step / spe);
    std::span<const std::uint32_t> idx = sampler.batch(step % spe, kBatch);
    if (own_every > 0 && step % own_every == own_every - 1) {
      own.assign(idx.begin(), idx.end());
      idx = own;
    }
    replica.compute_gradient(idx);
    be.axpy(replica.model().num_params(), -0.1f, replica.model().grads(), replica.model().params());
  }
  Trained r;
  r.theta.resize(replica.model().num_params());
  replica.model().store_params(r.theta.data());
  r.uploads = be.copies();
  return r;
}

}  // namespace

TEST(BatchIndices, AFollowedSamplersShardCrossesOncePerEpochAndTrainsAlike) {
  const Trained each = train(false, 0), followed = train(true, 0);
  EXPECT_EQ(each.uploads, std::size_t(kEpochs * 2)) << "without follow(): one upload per batch";
  EXPECT_EQ(followed.uploads, std::size_t(kEpochs)) << "following the sampler: one upload per epoch";
  EXPECT_EQ(followed.theta, each.theta) << "the same batches, so bitwise the same θ";
}

TEST(BatchIndices, IndicesThatAreNotTheShardsCrossThemselvesWhileFollowing) {
  const Trained each = train(false, 0), mixed = train(true, 3);  // steps 2 and 5 (epochs 1 and 2) their own
  EXPECT_EQ(mixed.uploads, std::size_t(kEpochs + 2));
  EXPECT_EQ(mixed.theta, each.theta);
}

// A batch larger than the replica's max_batch was gathered (and augmented) into buffers of
// max_batch rows, past their end, before the model refused it: refused before anything is written.
TEST(BatchIndices, ABatchLargerThanMaxBatchIsRefusedBeforeItIsGathered) {
  Dataset d;
  d.n = 50, d.channels = 1, d.height = 4, d.width = 4, d.classes = 3;
  d.x.assign(std::size_t(d.n) * d.features(), 0.5f);
  d.labels.assign(std::size_t(d.n), 1);
  ModelSpec spec;
  spec.kind = "mlp", spec.channels = 1, spec.height = 4, spec.width = 4, spec.outputs = 3, spec.hidden = {8};
  test::LaggingBackend be(0);
  Replica replica(be, spec, d, kBatch);
  std::vector<std::uint32_t> idx(kBatch + 1);
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = std::uint32_t(i);
  try {
    replica.compute_gradient(idx);
    ADD_FAILURE() << "a batch over max_batch was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "a batch of 17 samples for a replica of at most 16 (its max_batch)");
  }
}
