// Overlap on a GPU worker: ∇θ leaves the device piece by piece as backward finishes it
// (GradStager), and θ goes back piece by piece (Replica::upload_params_async); a GPU rank's
// all-reduce through host memory reduces ∇θ's buckets on the host as they land. Run here on a
// backend whose copies land late (LaggingBackend), so that reading a copy's bytes before it
// landed would be seen; tests/gpu.sh runs the same worker on a GPU against overlap off.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "collectives.h"
#include "comm/bucketed_allreduce.h"
#include "core/replica.h"
#include "core/sampler.h"
#include "grad_stager.h"
#include "lagging_backend.h"
#include "run/config.h"
#include "run/setup.h"

using namespace pslab;

namespace {

ExperimentConfig mlp_config() {
  return parse_config("name = \"t\"\n[data]\nkind = \"logistic\"\ndim = 16\noutputs = 3\ntrain_samples = 256\n"
                      "test_samples = 32\n[model]\nkind = \"mlp\"\nhidden = [300, 200]\n[train]\nbatch = 16\n",
                      "stager");
}

// The MLP's replica on a backend whose copies land late (after 1000 questions, or a wait).
struct LaggingReplica {
  ExperimentConfig cfg = mlp_config();
  DataSplit data = load_data(cfg);
  test::LaggingBackend be{1000};
  Replica replica{be, model_spec(cfg), data.train, cfg.train.batch};
  LaggingReplica() { replica.model().init(cfg.seed); }
};

// What the client would hear: each lo, checked against the device's ∇θ when it is told.
struct CheckedTails final : GradListener {
  const float* dev;
  const float* host;
  std::size_t P;
  std::vector<std::size_t> heard;
  CheckedTails(const float* d, const float* h, std::size_t n) : dev(d), host(h), P(n) {}
  void ready(std::size_t lo) override {
    ASSERT_LE(lo, P);
    EXPECT_TRUE(std::equal(dev + lo, dev + P, host + lo)) << "∇θ[" << lo << ", " << P << ") passed on before its copy landed";
    heard.push_back(lo);
  }
};

}  // namespace

// Every tail passed on has landed in host memory, in decreasing order, ending with the whole;
// the host copy equals the device's ∇θ bit for bit, step after step; copies are at least
// min_floats but the last.
TEST(GradStager, PassesOnOnlyWhatLandedTheLastLayersFirst) {
  const ExperimentConfig cfg = mlp_config();
  const DataSplit data = load_data(cfg);
  for (const int lag : {1, 3, 1000}) {
    test::LaggingBackend be(lag);
    Replica r(be, model_spec(cfg), data.train, cfg.train.batch);
    r.model().init(cfg.seed);
    const std::size_t P = r.model().num_params(), min_floats = 256;
    ASSERT_NE(r.host_grads(), r.model().grads());
    CheckedTails tails(r.model().grads(), r.host_grads(), P);
    GradStager stager(be, r.model().grads(), r.host_grads(), P, min_floats, tails);
    ShardSampler s(std::size_t(data.train.n), 1, 0, cfg.seed);
    s.set_epoch(0);
    for (long step = 0; step < 3; ++step) {
      tails.heard.clear();
      std::fill(r.host_grads(), r.host_grads() + P, -1.0f);
      stager.start();
      r.compute_gradient(s.batch(step, cfg.train.batch), -1.0f, &stager);
      ASSERT_FALSE(tails.heard.empty());
      EXPECT_EQ(tails.heard.back(), 0u) << "lag " << lag;
      EXPECT_TRUE(std::is_sorted(tails.heard.rbegin(), tails.heard.rend())) << "lag " << lag;
      EXPECT_EQ(0, std::memcmp(r.host_grads(), r.model().grads(), P * sizeof(float))) << "lag " << lag;
      // The MLP 16-300-200-3 reports its tails layer by layer (and in pieces of large layers):
      // several copies, never more than one per min_floats.
      EXPECT_GT(stager.copies(), 2u);
      EXPECT_LE(stager.copies(), P / min_floats + 1);
      if (lag > 10) {
        EXPECT_EQ(tails.heard.size(), stager.copies()) << "each copy passed on at the end";
      }
    }
  }
}

// A step's sample indices reach the GPU on the copy lane, with no host round trip: the gathers
// wait for them on the device. With copies that land only at a fence, every step's gradient is
// the CPU backend's to the last bits (a gather that ran before its indices landed would read
// the last step's, or none).
TEST(LaggingCopies, TheBatchIndicesLandBeforeTheGather) {
  const ExperimentConfig cfg = mlp_config();
  const DataSplit data = load_data(cfg);
  test::LaggingBackend lagging(1000);
  auto cpu = make_cpu_backend(1);
  Replica gpu_like(lagging, model_spec(cfg), data.train, cfg.train.batch), ref(*cpu, model_spec(cfg), data.train, cfg.train.batch);
  gpu_like.model().init(cfg.seed);
  ref.model().init(cfg.seed);
  const std::size_t P = ref.model().num_params();
  ShardSampler s(std::size_t(data.train.n), 1, 0, cfg.seed);
  s.set_epoch(0);
  for (long step = 0; step < 5; ++step) {
    const auto idx = s.batch(step, cfg.train.batch);
    EXPECT_NEAR(gpu_like.compute_gradient(idx), ref.compute_gradient(idx), 1e-6) << "step " << step;
    double worst = 0;  // the two backends' buffers differ in alignment: the last bits may differ
    for (std::size_t q = 0; q < P; ++q) worst = std::max(worst, double(std::abs(gpu_like.model().grads()[q] - ref.model().grads()[q])));
    EXPECT_LT(worst, 1e-6) << "step " << step << ": not the batch's gradient";
  }
  EXPECT_GE(lagging.copies(), 5u) << "the indices did not go on the copy lane";
}

// Misuse is named: a step without start(), a tail that grows.
TEST(GradStager, ATailThatGrowsWithoutStartIsRefused) {
  test::LaggingBackend be(1);
  std::vector<float> dev(100, 1.0f), host(100, 0.0f);
  CheckedTails tails(dev.data(), host.data(), 100);
  GradStager stager(be, dev.data(), host.data(), 100, 10, tails);
  stager.ready(50);
  EXPECT_THROW(stager.ready(60), std::logic_error);
  stager.ready(0);
  EXPECT_THROW(stager.ready(10), std::logic_error);
  stager.start();
  stager.ready(0);
  EXPECT_EQ(tails.heard, (std::vector<std::size_t>{50, 0, 0}));
}

// θ back to the device piece by piece: nothing reaches the model's θ before the fence (the copies
// land late), everything after it, bit for bit.
TEST(GradStager, ThetaPiecesReachTheModelByTheFence) {
  LaggingReplica lagging;
  Replica& r = lagging.replica;
  const std::size_t P = r.model().num_params();
  float* host = r.host_params();
  ASSERT_NE(host, r.model().params());
  std::iota(host, host + P, 0.0f);
  for (std::size_t lo = 0; lo < P; lo += 1000) r.upload_params_async(lo, std::min<std::size_t>(1000, P - lo));
  EXPECT_NE(0, std::memcmp(host, r.model().params(), P * sizeof(float)));
  r.params_fence();
  EXPECT_EQ(0, std::memcmp(host, r.model().params(), P * sizeof(float)));
  EXPECT_THROW(r.upload_params_async(P - 1, 2), std::out_of_range);
}

// θ copied whole through the same host buffer (download_params, upload_params) waits for the
// pieces still on their way: a download does not overwrite them with the device's older θ.
TEST(GradStager, WholeThetaCopiesWaitForThePiecesOnTheirWay) {
  LaggingReplica lagging;
  Replica& r = lagging.replica;
  const std::size_t P = r.model().num_params();
  std::vector<float> want(P);
  std::iota(want.begin(), want.end(), 1.0f);
  std::copy(want.begin(), want.end(), r.host_params());
  r.upload_params_async(0, P);
  const float* back = r.download_params();
  EXPECT_EQ(0, std::memcmp(back, want.data(), P * sizeof(float))) << "the download ran before the upload landed";
  EXPECT_EQ(0, std::memcmp(r.model().params(), want.data(), P * sizeof(float)));
}

// A GPU rank's all-reduce through host memory, overlapped: each rank's ∇θ comes down in copies
// that land late, the host buckets are reduced as they land, and every sum is exact (a bucket
// reduced before its bytes landed would sum stale zeros).
TEST(GradStager, HostBucketsAreReducedOnlyOnceLanded) {
  for (const std::string kind : {"shm", "gloo"}) {
    const auto tr = test::coordinator_transport();
    const std::string ep = tr->local_address("coordinator");
    Coordinator coord(*tr, ep, 2, std::chrono::milliseconds(5000));
    const std::size_t n = 10007;
    std::vector<float> host[2];
    test::run_threads(2, [&](int r) {
      RendezvousClient rv(*tr, ep, r, 2, std::chrono::milliseconds(10000));
      auto coll = test::host_collective(kind, rv);
      test::LaggingBackend be(3);
      for (long step = 0; step < 3; ++step) {
        const std::vector<float> dev = test::rank_data(n, r);
        host[r].assign(n, 0.0f);
        BucketedAllreduce buckets(*coll, host[r].data(), n, 1000, 10.0);
        GradStager stager(be, dev.data(), host[r].data(), n, 1000, buckets);
        rv.report_step(step);
        buckets.start(step);
        stager.start();
        for (std::size_t lo = n; lo > 0;) {  // backward's tails, 700 floats at a time
          lo = lo > 700 ? lo - 700 : 0;
          stager.ready(lo);
        }
        buckets.finish();
      }
    });
    EXPECT_EQ(test::wrong_sums(host[0], 2), 0) << kind;
    EXPECT_EQ(host[0], host[1]) << kind;
  }
}
