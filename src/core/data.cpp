#include "core/data.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>

#include "core/rng.h"

namespace pslab {
namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

// Reads exactly `n` bytes or throws naming the file and how far it got.
void read_exact(gzFile f, const std::string& path, void* dst, std::size_t n, const char* what) {
  auto* p = static_cast<std::uint8_t*>(dst);
  std::size_t got = 0;
  while (got < n) {
    const unsigned chunk = unsigned(std::min<std::size_t>(n - got, 1u << 30));
    const int r = gzread(f, p + got, chunk);
    if (r < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      throw DataError(path + ": cannot read " + what + ": " + (msg ? msg : "gzip error"));
    }
    if (r == 0)
      throw DataError(path + ": truncated: " + what + " needs " + std::to_string(n) +
                      " bytes, the file ends after " + std::to_string(got));
    got += std::size_t(r);
  }
}

std::uint32_t big_endian(const std::uint8_t* b) {
  return (std::uint32_t(b[0]) << 24) | (std::uint32_t(b[1]) << 16) | (std::uint32_t(b[2]) << 8) | b[3];
}

}  // namespace

void* allocate_sample_bytes(std::size_t bytes) {
  constexpr std::size_t kHuge = std::size_t(2) << 20;
  const std::size_t align = bytes >= kHuge ? kHuge : 64;
  void* p = std::aligned_alloc(align, (std::max<std::size_t>(bytes, 1) + align - 1) / align * align);
  if (!p) throw std::bad_alloc();
  if (align == kHuge) (void)::madvise(p, (bytes + align - 1) / align * align, MADV_HUGEPAGE);  // a hint; may be refused
  return p;
}

namespace {

// Opens an IDX file and reads its header: the dimension sizes (DataError naming the file for a
// wrong magic number or implausible sizes, whose product is at most 2^34 bytes).
GzFile open_idx(const std::string& path, int expected_dims, std::vector<int>& dims, std::size_t& total) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw DataError(path + ": cannot open: " + std::strerror(errno) +
                    " (Fashion-MNIST comes with Debian's dataset-fashion-mnist package; "
                    "data.path in the config sets the directory)");
  GzFile f(gzopen(path.c_str(), "rb"));  // also reads uncompressed files transparently
  if (!f) throw DataError(path + ": cannot open: " + std::strerror(errno));

  std::uint8_t magic[4];
  read_exact(f.get(), path, magic, 4, "the 4-byte magic number");
  const std::uint32_t expected_magic = 0x00000800u | std::uint32_t(expected_dims);
  if (big_endian(magic) != expected_magic) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  ": wrong magic number 0x%08x, expected 0x%08x (IDX, unsigned bytes, %d dims)",
                  big_endian(magic), expected_magic, expected_dims);
    throw DataError(path + buf);
  }
  dims.assign(std::size_t(expected_dims), 0);
  total = 1;
  constexpr std::size_t kMostBytes = std::size_t(1) << 34;
  for (int i = 0; i < expected_dims; ++i) {
    std::uint8_t b[4];
    read_exact(f.get(), path, b, 4, "the dimension sizes");
    const std::uint32_t d = big_endian(b);
    if (d == 0 || d > (1u << 28) || total > kMostBytes / d)
      throw DataError(path + ": dimension " + std::to_string(i) + " has implausible size " +
                      std::to_string(d));
    dims[std::size_t(i)] = int(d);
    total *= d;
  }
  return f;
}

}  // namespace

std::vector<int> read_idx_dims(const std::string& path, int expected_dims) {
  std::vector<int> dims;
  std::size_t total = 0;
  open_idx(path, expected_dims, dims, total);
  return dims;
}

SampleVector<std::uint8_t> read_idx(const std::string& path, int expected_dims,
                                   std::vector<int>& dims) {
  std::size_t total = 0;
  GzFile f = open_idx(path, expected_dims, dims, total);
  SampleVector<std::uint8_t> data(total);
  read_exact(f.get(), path, data.data(), total, "the data");
  return data;
}

DataSplit load_fashion_mnist(const std::string& dir, bool normalize, int limit_train,
                             int limit_test) {
  constexpr float kMean = 0.2860f, kStd = 0.3530f;  // training-set pixel statistics
  auto load = [&](const std::string& prefix, int limit) {
    const std::string img_path = dir + "/" + prefix + "-images-idx3-ubyte.gz";
    const std::string lab_path = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
    std::vector<int> idims, ldims;
    const auto pixels = read_idx(img_path, 3, idims);
    const auto labels = read_idx(lab_path, 1, ldims);
    if (idims[0] != ldims[0])
      throw DataError(img_path + " has " + std::to_string(idims[0]) + " images but " +
                      lab_path + " has " + std::to_string(ldims[0]) + " labels");
    if (idims[1] != 28 || idims[2] != 28)  // (the model is planned for Fashion-MNIST's images)
      throw DataError(img_path + ": images of " + std::to_string(idims[1]) + "x" + std::to_string(idims[2]) +
                      " pixels, not Fashion-MNIST's 28x28 (data.kind = \"arrays\" reads images of any size)");
    Dataset d;
    d.n = limit > 0 && limit < idims[0] ? limit : idims[0];
    d.channels = 1;
    d.height = idims[1];
    d.width = idims[2];
    d.classes = 10;
    const std::size_t feats = std::size_t(d.features());
    d.x.resize(std::size_t(d.n) * feats);
    for (std::size_t i = 0; i < d.x.size(); ++i) {
      const float v = float(pixels[i]) / 255.0f;
      d.x[i] = normalize ? (v - kMean) / kStd : v;
    }
    d.labels.resize(std::size_t(d.n));
    for (int i = 0; i < d.n; ++i) {
      if (labels[std::size_t(i)] >= 10)
        throw DataError(lab_path + ": label " + std::to_string(labels[std::size_t(i)]) +
                        " of sample " + std::to_string(i) + " is not a class in [0, 10)");
      d.labels[std::size_t(i)] = labels[std::size_t(i)];
    }
    return d;
  };
  return DataSplit{load("train", limit_train), load("t10k", limit_test)};
}

namespace {

LinearTruth random_linear(int dim, int out, Rng& rng) {
  LinearTruth t;
  t.w.resize(std::size_t(dim) * out);
  t.b.resize(std::size_t(out));
  const double s = 1.0 / std::sqrt(double(dim));
  for (auto& v : t.w) v = float(rng.normal() * s);
  for (auto& v : t.b) v = float(rng.normal() * 0.1);
  return t;
}

// x (n, dim) ~ N(0,1); y (n, out) = x W + b, computed in double then rounded.
Dataset linear_samples(int n, int dim, int out, const LinearTruth& t, Rng& rng,
                       std::vector<double>& y) {
  Dataset d;
  d.n = n;
  d.width = dim;
  d.x.resize(std::size_t(n) * dim);
  for (auto& v : d.x) v = float(rng.normal());
  y.assign(std::size_t(n) * out, 0.0);
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < out; ++o) {
      double s = t.b[std::size_t(o)];
      for (int k = 0; k < dim; ++k)
        s += double(d.x[std::size_t(i) * dim + k]) * t.w[std::size_t(k) * out + o];
      y[std::size_t(i) * out + o] = s;
    }
  return d;
}

}  // namespace

DataSplit make_least_squares(int n_train, int n_test, int dim, int out, std::uint64_t seed,
                             LinearTruth* truth) {
  Rng rng = Rng::derive(seed, {0x15Au});
  const LinearTruth t = random_linear(dim, out, rng);
  auto make = [&](int n) {
    std::vector<double> y;
    Dataset d = linear_samples(n, dim, out, t, rng, y);
    d.target_dim = out;
    d.targets.assign(y.begin(), y.end());
    return d;
  };
  DataSplit s{make(n_train), make(n_test)};
  if (truth) *truth = t;
  return s;
}

DataSplit make_logistic(int n_train, int n_test, int dim, int classes, std::uint64_t seed,
                        LinearTruth* truth) {
  Rng rng = Rng::derive(seed, {0x106u});
  const LinearTruth t = random_linear(dim, classes, rng);
  auto make = [&](int n) {
    std::vector<double> y;
    Dataset d = linear_samples(n, dim, classes, t, rng, y);
    d.classes = classes;
    d.labels.resize(std::size_t(n));
    for (int i = 0; i < n; ++i) {
      int best = 0;
      for (int c = 1; c < classes; ++c)
        if (y[std::size_t(i) * classes + c] > y[std::size_t(i) * classes + best]) best = c;
      d.labels[std::size_t(i)] = best;
    }
    return d;
  };
  DataSplit s{make(n_train), make(n_test)};
  if (truth) *truth = t;
  return s;
}

void gather_batch(const Dataset& d, std::span<const std::uint32_t> idx, float* x,
                  std::int32_t* labels, float* targets) {
  const std::size_t f = std::size_t(d.features());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    const std::size_t s = idx[i];
    std::memcpy(x + i * f, d.x.data() + s * f, f * sizeof(float));
    if (d.classes > 0) {
      labels[i] = d.labels[s];
    } else {
      const std::size_t t = std::size_t(d.target_dim);
      std::memcpy(targets + i * t, d.targets.data() + s * t, t * sizeof(float));
    }
  }
}

}  // namespace pslab
