// CIFAR-10's binary version (https://www.cs.toronto.edu/~kriz/cifar.html, "CIFAR-10 binary
// version"): records of a label byte and 3072 pixel bytes, the red, green and blue 32 x 32 planes.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "core/datasets.h"

namespace pslab {
namespace {

constexpr int kSide = 32, kChannels = 3, kClasses = 10;
constexpr std::size_t kPixels = std::size_t(kChannels) * kSide * kSide;
constexpr std::size_t kRecord = 1 + kPixels;  // bytes
constexpr int kTrainFiles = 5;

std::string train_file(const std::string& dir, int i) { return dir + "/data_batch_" + std::to_string(i) + ".bin"; }
std::string test_file(const std::string& dir) { return dir + "/test_batch.bin"; }

// Records in `path` (its size over kRecord), or DataError: missing, empty, or a partial record.
std::size_t records_in(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    throw DataError(path + ": not found (data.kind = \"cifar10\": data.path holds data_batch_1.bin ... "
                    "data_batch_5.bin and test_batch.bin, CIFAR-10's binary version)");
  const auto bytes = std::size_t(st.st_size);
  if (bytes == 0 || bytes % kRecord != 0)
    throw DataError(path + ": " + std::to_string(bytes) + " bytes is not a whole number of CIFAR-10 records (" +
                    std::to_string(kRecord) + " bytes each: a label byte and 3 x 32 x 32 pixels); truncated?");
  return bytes / kRecord;
}

// The training files present: data_batch_1.bin, then 2, ... up to 5 (at least the first).
std::vector<std::string> train_files(const std::string& dir) {
  std::vector<std::string> files{train_file(dir, 1)};
  records_in(files[0]);  // (names the first when it is missing)
  for (int i = 2; i <= kTrainFiles; ++i) {
    struct stat st{};
    if (::stat(train_file(dir, i).c_str(), &st) != 0) break;
    files.push_back(train_file(dir, i));
  }
  return files;
}

// Reads the records of `files` (at most `limit` > 0 of them) into d: pixels scaled to [0, 1].
void read_records(const std::vector<std::string>& files, int limit, Dataset& d) {
  std::size_t total = 0;
  for (const auto& f : files) total += records_in(f);
  const std::size_t n = limit > 0 ? std::min(total, std::size_t(limit)) : total;
  d.n = int(n), d.channels = kChannels, d.height = kSide, d.width = kSide, d.classes = kClasses;
  d.x.resize(n * kPixels);
  d.labels.resize(n);
  std::vector<unsigned char> record(kRecord);
  std::size_t at = 0;
  for (const auto& path : files) {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
    if (!f) throw DataError(path + ": cannot open");
    for (std::size_t r = 0; at < n; ++r, ++at) {
      if (std::fread(record.data(), 1, kRecord, f.get()) != kRecord) break;  // (the file's end)
      if (record[0] >= kClasses)
        throw DataError(path + ": record " + std::to_string(r) + " has label " + std::to_string(record[0]) +
                        ", not a class in [0, 10): not CIFAR-10's binary version (CIFAR-100's has two label bytes)");
      d.labels[at] = record[0];
      float* x = d.x.data() + at * kPixels;
      for (std::size_t i = 0; i < kPixels; ++i) x[i] = float(record[1 + i]) / 255.0f;
    }
  }
}

// d's pixels standardised per channel: (x - mean[c]) / stdev[c].
void standardise(Dataset& d, const double* mean, const double* stdev) {
  const std::size_t plane = std::size_t(kSide) * kSide;
  for (int s = 0; s < d.n; ++s)
    for (int c = 0; c < kChannels; ++c) {
      float* x = d.x.data() + std::size_t(s) * kPixels + std::size_t(c) * plane;
      for (std::size_t i = 0; i < plane; ++i) x[i] = float((x[i] - mean[c]) / stdev[c]);
    }
}

// Per-channel mean and std of `d`'s pixels (float sums in double).
void channel_statistics(const Dataset& d, double* mean, double* stdev) {
  const std::size_t plane = std::size_t(kSide) * kSide;
  for (int c = 0; c < kChannels; ++c) {
    double sum = 0, sq = 0;
    for (int s = 0; s < d.n; ++s) {
      const float* x = d.x.data() + std::size_t(s) * kPixels + std::size_t(c) * plane;
      for (std::size_t i = 0; i < plane; ++i) sum += x[i], sq += double(x[i]) * x[i];
    }
    const double count = double(d.n) * double(plane);
    mean[c] = sum / count;
    stdev[c] = std::max(1e-6, std::sqrt(std::max(0.0, sq / count - mean[c] * mean[c])));
  }
}

struct Cifar10 final : DataKind {
  DataShape shape(const DataSpec& s) const override {
    std::size_t train = 0;
    for (const auto& f : train_files(s.path)) train += records_in(f);
    const std::size_t test = records_in(test_file(s.path));
    auto used = [](int limit, std::size_t all) { return limit > 0 ? std::min(all, std::size_t(limit)) : all; };
    return DataShape{kChannels, kSide, kSide, kClasses, true, used(s.train_samples, train), used(s.test_samples, test)};
  }
  DataSplit load(const DataSpec& s) const override {
    return load_cifar10(s.path, s.normalize, s.train_samples, s.test_samples);
  }
};

}  // namespace

DataSplit load_cifar10(const std::string& dir, bool normalize, int limit_train, int limit_test) {
  DataSplit out;
  read_records(train_files(dir), limit_train, out.train);
  read_records({test_file(dir)}, limit_test, out.test);
  if (normalize) {
    double mean[kChannels], stdev[kChannels];
    channel_statistics(out.train, mean, stdev);  // (of the training records used: every process reads the same)
    standardise(out.train, mean, stdev);
    standardise(out.test, mean, stdev);
  }
  return out;
}

namespace datasets {
std::unique_ptr<DataKind> cifar10_kind(const std::string&) { return std::make_unique<Cifar10>(); }
}  // namespace datasets

}  // namespace pslab
