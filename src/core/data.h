// Data sets held in host memory: Fashion-MNIST from IDX files, and synthetic problems whose
// optimum is known.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace pslab {

// aligned_alloc (free() releases it) + madvise(MADV_HUGEPAGE) for blocks of 2 MiB or more.
void* allocate_sample_bytes(std::size_t bytes);

// Allocator of the large per-sample arrays (a data set is hundreds of MB, read once per
// process): resize() leaves elements unset (the loader writes every one next), and blocks of
// 2 MiB or more are aligned and asked for huge pages (madvise), so a process's first touch of
// its data set takes a few hundred page faults rather than tens of thousands.
template <typename T>
struct SampleAllocator {
  using value_type = T;
  SampleAllocator() = default;
  template <typename U>
  SampleAllocator(const SampleAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(allocate_sample_bytes(n * sizeof(T))); }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) ::new (static_cast<void*>(p)) U;  // default-init: not zeroed
    else ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <typename U>
  bool operator==(const SampleAllocator<U>&) const noexcept { return true; }
};
template <typename T>
using SampleVector = std::vector<T, SampleAllocator<T>>;

// A data file that is missing, truncated or malformed. what() names the file and the fault.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Dataset {
  int n = 0;                     // samples
  int channels = 1, height = 1, width = 1;  // one sample's shape; features = C*H*W
  int classes = 0;               // > 0: classification (labels); 0: regression (targets)
  int target_dim = 0;            // regression output width
  SampleVector<float> x;         // (n, features) row-major
  std::vector<std::int32_t> labels;  // (n), classification only
  std::vector<float> targets;    // (n, target_dim), regression only

  int features() const { return channels * height * width; }
  int outputs() const { return classes > 0 ? classes : target_dim; }
};

struct DataSplit {
  Dataset train;
  Dataset test;
};

// ---- IDX files (the MNIST format), gzip-compressed or plain ----
// Images idx3 (magic 0x00000803) -> n x rows x cols bytes; labels idx1 (magic 0x00000801).
SampleVector<std::uint8_t> read_idx(const std::string& path, int expected_dims,
                                   std::vector<int>& dims);
// The dimension sizes alone (the header).
std::vector<int> read_idx_dims(const std::string& path, int expected_dims);

// Fashion-MNIST from `dir` (train-images-idx3-ubyte.gz, ... as in Debian's
// dataset-fashion-mnist). Pixels scaled to [0, 1], then standardised with the training set's
// mean 0.2860 and std 0.3530 when `normalize`. limit_train/limit_test > 0 keep a prefix.
DataSplit load_fashion_mnist(const std::string& dir, bool normalize = true,
                             int limit_train = 0, int limit_test = 0);

// ---- synthetic problems with a known optimum ----
// Least squares: y = x W* + b* exactly (no noise), x ~ N(0, 1); the optimum is (W*, b*) with
// zero loss. w_star (dim, out) row-major and b_star (out) are returned for tests.
struct LinearTruth {
  std::vector<float> w;  // (dim, out)
  std::vector<float> b;  // (out)
};
DataSplit make_least_squares(int n_train, int n_test, int dim, int out, std::uint64_t seed,
                             LinearTruth* truth = nullptr);
// Logistic regression: `classes` classes, labels = argmax(x W* + b*) of a random linear
// teacher, so a linear model can reach 100% accuracy.
DataSplit make_logistic(int n_train, int n_test, int dim, int classes, std::uint64_t seed,
                        LinearTruth* truth = nullptr);

// Copies the samples `idx` of `d` into contiguous host buffers:
// x (idx.size(), features); labels (idx.size()) or targets (idx.size(), target_dim).
void gather_batch(const Dataset& d, std::span<const std::uint32_t> idx, float* x,
                  std::int32_t* labels, float* targets);

}  // namespace pslab
