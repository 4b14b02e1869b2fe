// IDX reader on small fixtures (good and bad files), synthetic problems, and the sampler.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/data.h"
#include "core/sampler.h"

using namespace pslab;
namespace fs = std::filesystem;

namespace {

class IdxFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("pslab_idx_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }

  static std::vector<std::uint8_t> header(std::uint32_t magic, std::vector<std::uint32_t> dims) {
    std::vector<std::uint8_t> h;
    auto be32 = [&](std::uint32_t v) { for (int s = 24; s >= 0; s -= 8) h.push_back(std::uint8_t(v >> s)); };
    be32(magic);
    for (auto d : dims) be32(d);
    return h;
  }
  void write_gz(const std::string& name, const std::vector<std::uint8_t>& bytes) {
    gzFile f = gzopen((dir / name).c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
    gzclose(f);
  }
  // A 3-image data set in Fashion-MNIST's file names (side x side pixels: 28 as Fashion-MNIST's);
  // byte i of the images is 20 i mod 256.
  void write_fixture(const std::string& prefix, std::size_t drop_bytes = 0, std::uint32_t label_count = 3,
                     std::uint32_t side = 28) {
    auto img = header(0x803, {3, side, side});
    for (std::uint32_t i = 0; i < 3 * side * side; ++i) img.push_back(std::uint8_t(i * 20));
    img.resize(img.size() - drop_bytes);
    write_gz(prefix + "-images-idx3-ubyte.gz", img);
    auto lab = header(0x801, {label_count});
    for (std::uint32_t i = 0; i < label_count; ++i) lab.push_back(std::uint8_t(i + 7));
    write_gz(prefix + "-labels-idx1-ubyte.gz", lab);
  }
  std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const DataError& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path dir;
};

TEST_F(IdxFiles, ReadsImagesAndLabels) {
  write_fixture("train");
  write_fixture("t10k");
  const DataSplit d = load_fashion_mnist(dir, /*normalize=*/false);
  ASSERT_EQ(d.train.n, 3);
  EXPECT_EQ(d.train.height, 28);
  EXPECT_EQ(d.train.width, 28);
  EXPECT_EQ(d.train.features(), 784);
  EXPECT_FLOAT_EQ(d.train.x[5], 100.0f / 255.0f);   // image 0, pixel (0, 5)
  EXPECT_FLOAT_EQ(d.train.x[785], 84.0f / 255.0f);  // image 1, pixel (0, 1): byte 785, 15700 mod 256
  EXPECT_EQ(d.train.labels, (std::vector<std::int32_t>{7, 8, 9}));
  const DataSplit n = load_fashion_mnist(dir, /*normalize=*/true, 2, 1);
  EXPECT_EQ(n.train.n, 2);
  EXPECT_EQ(n.test.n, 1);
  EXPECT_NEAR(n.train.x[0], (0.0f - 0.2860f) / 0.3530f, 1e-6);
}

TEST_F(IdxFiles, MissingFileNamesTheFileAndThePackage) {
  const std::string e = error_of([&] { load_fashion_mnist(dir); });
  EXPECT_NE(e.find((dir / "train-images-idx3-ubyte.gz").string()), std::string::npos) << e;
  EXPECT_NE(e.find("No such file"), std::string::npos) << e;
  EXPECT_NE(e.find("dataset-fashion-mnist"), std::string::npos) << e;
}

TEST_F(IdxFiles, TruncatedFileSaysHowMuchWasThere) {
  write_fixture("train", /*drop_bytes=*/5);
  write_fixture("t10k");
  const std::string e = error_of([&] { load_fashion_mnist(dir); });
  EXPECT_NE(e.find("train-images-idx3-ubyte.gz: truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("needs 2352 bytes, the file ends after 2347"), std::string::npos) << e;
}

// Images of another size than Fashion-MNIST's: the model is planned for 28x28 (16x16 made it
// read past the batch's rows; 32x32 shifted every sample). Refused, naming the file.
TEST_F(IdxFiles, ImagesThatAreNotFashionMnistsSizeAreRefused) {
  write_fixture("train", 0, 3, /*side=*/16);
  write_fixture("t10k");
  const std::string e = error_of([&] { load_fashion_mnist(dir); });
  EXPECT_NE(e.find("train-images-idx3-ubyte.gz: images of 16x16 pixels, not Fashion-MNIST's 28x28"), std::string::npos) << e;
}

// An IDX header whose sizes multiply past what is read (2^34 bytes): its file named, before any
// allocation.
TEST_F(IdxFiles, DimensionsWhoseProductIsImplausibleAreNamed) {
  write_gz("x.gz", header(0x803, {1u << 28, 1u << 28, 1}));
  std::vector<int> dims;
  const std::string e = error_of([&] { read_idx((dir / "x.gz").string(), 3, dims); });
  EXPECT_NE(e.find("x.gz: dimension 1 has implausible size 268435456"), std::string::npos) << e;
}

TEST_F(IdxFiles, WrongMagicIsNamed) {
  write_gz("x.gz", header(0x802, {1, 1}));
  std::vector<int> dims;
  const std::string e = error_of([&] { read_idx((dir / "x.gz").string(), 3, dims); });
  EXPECT_NE(e.find("x.gz: wrong magic number 0x00000802, expected 0x00000803"), std::string::npos) << e;
}

TEST_F(IdxFiles, ImageAndLabelCountsMustAgree) {
  write_fixture("train", 0, /*label_count=*/2);
  write_fixture("t10k");
  const std::string e = error_of([&] { load_fashion_mnist(dir); });
  EXPECT_NE(e.find("has 3 images but"), std::string::npos) << e;
  EXPECT_NE(e.find("has 2 labels"), std::string::npos) << e;
}

TEST_F(IdxFiles, ReadsUncompressedFilesToo) {
  auto img = header(0x801, {4});
  for (int i = 0; i < 4; ++i) img.push_back(std::uint8_t(i));
  std::ofstream(dir / "plain", std::ios::binary).write(reinterpret_cast<const char*>(img.data()), std::streamsize(img.size()));
  std::vector<int> dims;
  EXPECT_EQ(read_idx((dir / "plain").string(), 1, dims), (SampleVector<std::uint8_t>{0, 1, 2, 3}));
  EXPECT_EQ(dims, std::vector<int>{4});
}

TEST(Synthetic, LeastSquaresHasZeroLossAtTheTruth) {
  LinearTruth t;
  const DataSplit d = make_least_squares(50, 10, 6, 2, 3, &t);
  ASSERT_EQ(d.train.targets.size(), 100u);
  double worst = 0;
  for (int i = 0; i < d.train.n; ++i)
    for (int o = 0; o < 2; ++o) {
      double y = t.b[o];
      for (int k = 0; k < 6; ++k) y += double(d.train.x[i * 6 + k]) * t.w[k * 2 + o];
      worst = std::max(worst, std::abs(y - d.train.targets[i * 2 + o]));
    }
  EXPECT_LT(worst, 1e-5);
  const DataSplit again = make_least_squares(50, 10, 6, 2, 3);
  EXPECT_EQ(again.train.x, d.train.x);  // deterministic from the seed
}

TEST(Synthetic, LogisticLabelsComeFromTheTeacher) {
  LinearTruth t;
  const DataSplit d = make_logistic(200, 10, 5, 3, 9, &t);
  std::set<int> seen(d.train.labels.begin(), d.train.labels.end());
  EXPECT_EQ(seen.size(), 3u);
  for (int i = 0; i < d.train.n; ++i) {
    std::vector<double> z(3);
    for (int c = 0; c < 3; ++c) {
      z[c] = t.b[c];
      for (int k = 0; k < 5; ++k) z[c] += double(d.train.x[i * 5 + k]) * t.w[k * 3 + c];
    }
    EXPECT_EQ(int(std::max_element(z.begin(), z.end()) - z.begin()), d.train.labels[i]);
  }
}

// ---- sampler ----

TEST(Sampler, ShardsAreDisjointAndCompleteEveryEpoch) {
  for (std::size_t n : {1u, 5u, 64u, 1000u, 1003u})
    for (int world : {1, 2, 3, 4, 7})
      for (long epoch : {0L, 1L, 5L}) {
        std::vector<int> seen(n, 0);
        long steps = -1;
        for (int r = 0; r < world; ++r) {
          ShardSampler s(n, world, r, 11);
          s.set_epoch(epoch);
          if (steps < 0) steps = s.steps_per_epoch(16);
          EXPECT_EQ(s.steps_per_epoch(16), steps) << "ranks disagree on steps per epoch";
          for (long k = 0; k < steps; ++k)
            for (std::uint32_t i : s.batch(k, 16)) ++seen[i];
        }
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(seen[i], 1) << "sample " << i << " n=" << n << " world=" << world << " epoch=" << epoch;
      }
}

TEST(Sampler, ReshufflesPerEpochDeterministically) {
  ShardSampler a(100, 2, 1, 5), b(100, 2, 1, 5), c(100, 2, 1, 6);
  a.set_epoch(0), b.set_epoch(0), c.set_epoch(0);
  const auto a0 = std::vector<std::uint32_t>(a.batch(0, 50).begin(), a.batch(0, 50).end());
  EXPECT_TRUE(std::ranges::equal(a.batch(0, 50), b.batch(0, 50)));
  EXPECT_FALSE(std::ranges::equal(a.batch(0, 50), c.batch(0, 50)));
  a.set_epoch(1);
  EXPECT_FALSE(std::ranges::equal(a.batch(0, 50), a0));
}

TEST(Sampler, UnevenShardsKeepEveryRankInStepAndCountTheGlobalBatch) {
  // 10 samples over 4 ranks: shards of 2, 3, 2, 3; batch 2 -> 2 steps each, the second batch
  // holding 0, 1, 0, 1 samples.
  long total0 = 0, total1 = 0;
  for (int r = 0; r < 4; ++r) {
    ShardSampler s(10, 4, r, 1);
    s.set_epoch(0);
    EXPECT_EQ(s.steps_per_epoch(2), 2);
    total0 += s.batch_size(0, 2);
    total1 += s.batch_size(1, 2);
    EXPECT_EQ(s.global_batch_size(0, 2), 8);
    EXPECT_EQ(s.global_batch_size(1, 2), 2);
  }
  EXPECT_EQ(total0, 8);
  EXPECT_EQ(total1, 2);
}

TEST(Sampler, RejectsABadRank) {
  EXPECT_THROW(ShardSampler(10, 2, 2, 1), std::invalid_argument);
  EXPECT_THROW(ShardSampler(10, 0, 0, 1), std::invalid_argument);
}

}  // namespace

// The sample arrays' allocator: large blocks 2 MiB-aligned (what huge pages need), small ones
// 64-byte aligned; a SampleVector behaves as a vector otherwise.
TEST(SampleAllocator, LargeBlocksAreHugePageAlignedAndVectorsWork) {
  for (const std::size_t bytes : {std::size_t(1), std::size_t(4096), std::size_t(3) << 20, std::size_t(200) << 20}) {
    void* p = allocate_sample_bytes(bytes);
    const std::size_t align = bytes >= (std::size_t(2) << 20) ? std::size_t(2) << 20 : 64;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % align, 0u) << bytes << " bytes";
    std::memset(p, 1, bytes);  // all of it is ours
    std::free(p);
  }
  SampleVector<float> v(5);
  for (int i = 0; i < 5; ++i) v[std::size_t(i)] = float(i);
  v.resize(3);
  v.push_back(7.0f);
  EXPECT_EQ(v, (SampleVector<float>{0.0f, 1.0f, 2.0f, 7.0f}));
}
