// The data sets read from disk (core/datasets/): CIFAR-10's binary files and NumPy arrays,
// written by the tests with known contents; bad, truncated and mismatched files fail naming the
// file; the registry's shape (before reading) agrees with what is read.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/datasets.h"

namespace fs = std::filesystem;
using namespace pslab;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/pslab-datasets-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
};

// Records labelled first_label, first_label + 1, ...; pixel i of channel c of record r = (r + 7 c + i) mod 256.
void write_cifar(const fs::path& file, int records, int first_label, std::size_t cut = 0) {
  std::string bytes;
  for (int r = 0; r < records; ++r) {
    bytes.push_back(char(first_label + r));
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < 1024; ++i) bytes.push_back(char((r + 7 * c + i) % 256));
  }
  bytes.resize(bytes.size() - cut);
  std::ofstream(file, std::ios::binary) << bytes;
}

// An NPY 1.0 file of `descr`, `shape` and raw `data` bytes (as numpy.save writes it).
void write_npy(const fs::path& file, const std::string& descr, const std::string& shape, const std::string& data,
               bool fortran = false) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64) header.push_back(' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(1), out.push_back(0);
  out.push_back(char(header.size() & 0xff)), out.push_back(char(header.size() >> 8));
  std::ofstream(file, std::ios::binary) << out << header << data;
}

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

DataSpec spec(const std::string& kind, const std::string& path, bool normalize = false) {
  DataSpec s;
  s.kind = kind, s.path = path, s.normalize = normalize;
  return s;
}

}  // namespace

TEST(Cifar10, ReadsRecordsChannelFirstAcrossBatchFiles) {
  TempDir d;
  write_cifar(d.path / "data_batch_1.bin", 5, 0);
  write_cifar(d.path / "data_batch_2.bin", 3, 5);
  write_cifar(d.path / "test_batch.bin", 4, 2);
  const auto kind = data_registry().make("cifar10");
  const DataShape shape = kind->shape(spec("cifar10", d.str()));
  EXPECT_EQ(shape.channels, 3);
  EXPECT_EQ(shape.height, 32);
  EXPECT_EQ(shape.outputs, 10);
  EXPECT_EQ(shape.train_n, 8u);
  EXPECT_EQ(shape.test_n, 4u);
  const DataSplit s = kind->load(spec("cifar10", d.str()));
  ASSERT_EQ(s.train.n, 8);
  EXPECT_EQ(s.train.features(), 3072);
  EXPECT_EQ(s.train.labels[6], 6);  // the second file's second record: label 5 + 1
  // record 6 is the second file's record 1: channel 2, pixel 10 = (1 + 14 + 10) / 255
  EXPECT_FLOAT_EQ(s.train.x[6 * 3072 + 2 * 1024 + 10], 25.0f / 255.0f);
  EXPECT_EQ(s.test.n, 4);
  EXPECT_EQ(s.test.labels[0], 2);
  // standardised per channel with the training records' statistics: each channel's mean ~0
  const DataSplit z = load_cifar10(d.str(), true);
  for (int c = 0; c < 3; ++c) {
    double sum = 0;
    for (int r = 0; r < z.train.n; ++r)
      for (int i = 0; i < 1024; ++i) sum += z.train.x[std::size_t(r) * 3072 + std::size_t(c) * 1024 + std::size_t(i)];
    EXPECT_NEAR(sum / (8 * 1024), 0.0, 1e-4) << "channel " << c;
  }
  EXPECT_EQ(load_cifar10(d.str(), false, 6, 2).train.n, 6);
}

TEST(Cifar10, BadFilesFailNamingTheFile) {
  TempDir d;
  EXPECT_NE(error_of([&] { load_cifar10(d.str()); }).find(d.str() + "/data_batch_1.bin: not found"), std::string::npos);
  write_cifar(d.path / "data_batch_1.bin", 3, 0, 100);  // truncated
  write_cifar(d.path / "test_batch.bin", 2, 0);
  EXPECT_NE(error_of([&] { load_cifar10(d.str()); }).find("data_batch_1.bin: 9119 bytes is not a whole number of CIFAR-10 records"),
            std::string::npos);
  write_cifar(d.path / "data_batch_1.bin", 3, 8);  // labels 8, 9, then 10
  EXPECT_NE(error_of([&] { load_cifar10(d.str()); }).find("data_batch_1.bin: record 2 has label 10, not a class in [0, 10)"),
            std::string::npos);
  write_cifar(d.path / "data_batch_1.bin", 3, 0);
  fs::remove(d.path / "test_batch.bin");
  EXPECT_NE(error_of([&] { data_registry().make("cifar10")->shape(spec("cifar10", d.str())); }).find("test_batch.bin: not found"),
            std::string::npos);
}

TEST(Arrays, ReadsImagesAndClassesFromNpy) {
  TempDir d;
  std::vector<std::uint8_t> x(6 * 2 * 3);  // (6, 2, 3) uint8 images
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::uint8_t(i * 5);
  write_npy(d.path / "x_train.npy", "|u1", "(6, 2, 3)", bytes_of(x));
  write_npy(d.path / "y_train.npy", "<i8", "(6,)", bytes_of(std::vector<std::int64_t>{0, 1, 2, 0, 1, 2}));
  write_npy(d.path / "x_test.npy", "|u1", "(2, 2, 3)", bytes_of(std::vector<std::uint8_t>(12, 255)));
  write_npy(d.path / "y_test.npy", "<i8", "(2,)", bytes_of(std::vector<std::int64_t>{2, 1}));
  const DataShape shape = data_registry().make("arrays")->shape(spec("arrays", d.str()));
  EXPECT_EQ((std::vector<int>{shape.channels, shape.height, shape.width, shape.outputs}), (std::vector<int>{1, 2, 3, 3}));
  EXPECT_TRUE(shape.classification);
  EXPECT_EQ(shape.train_n, 6u);
  const DataSplit s = load_arrays(d.str(), false);
  EXPECT_EQ(s.train.classes, 3);
  EXPECT_FLOAT_EQ(s.train.x[7], 35.0f / 255.0f);  // uint8 scaled to [0, 1]
  EXPECT_EQ(s.train.labels[5], 2);
  EXPECT_EQ(s.test.labels[0], 2);
  EXPECT_FLOAT_EQ(s.test.x[0], 1.0f);
  const DataSplit z = load_arrays(d.str(), true, 4);
  EXPECT_EQ(z.train.n, 4);
  double sum = 0;
  for (float v : load_arrays(d.str(), true).train.x) sum += v;
  EXPECT_NEAR(sum, 0.0, 1e-3);  // standardised with the training inputs' mean
}

TEST(Arrays, FloatTargetsAreRegression) {
  TempDir d;
  write_npy(d.path / "x_train.npy", "<f8", "(3, 2)", bytes_of(std::vector<double>{1, 2, 3, 4, 5, 6}));
  write_npy(d.path / "y_train.npy", "<f4", "(3, 2)", bytes_of(std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));
  write_npy(d.path / "x_test.npy", "<f8", "(1, 2)", bytes_of(std::vector<double>{7, 8}));
  write_npy(d.path / "y_test.npy", "<f4", "(1, 2)", bytes_of(std::vector<float>{9, 10}));
  const DataShape shape = data_registry().make("arrays")->shape(spec("arrays", d.str()));
  EXPECT_FALSE(shape.classification);
  EXPECT_EQ(shape.outputs, 2);
  const DataSplit s = load_arrays(d.str(), false);
  EXPECT_EQ(s.train.classes, 0);
  EXPECT_EQ(s.train.target_dim, 2);
  EXPECT_FLOAT_EQ(s.train.targets[3], 2.0f);
  EXPECT_FLOAT_EQ(s.train.x[5], 6.0f);
  EXPECT_FLOAT_EQ(s.test.targets[1], 10.0f);
}

TEST(Arrays, BadTruncatedAndMismatchedFilesFailNamingTheFile) {
  TempDir d;
  auto good = [&] {
    write_npy(d.path / "x_train.npy", "<f4", "(4, 3)", bytes_of(std::vector<float>(12, 1.0f)));
    write_npy(d.path / "y_train.npy", "<i4", "(4,)", bytes_of(std::vector<std::int32_t>{0, 1, 0, 1}));
    write_npy(d.path / "x_test.npy", "<f4", "(2, 3)", bytes_of(std::vector<float>(6, 1.0f)));
    write_npy(d.path / "y_test.npy", "<i4", "(2,)", bytes_of(std::vector<std::int32_t>{1, 0}));
  };
  auto err = [&] { return error_of([&] { load_arrays(d.str()); }); };
  good();
  EXPECT_EQ(err(), "");
  fs::remove(d.path / "y_test.npy");
  EXPECT_NE(err().find(d.str() + "/y_test.npy: not found"), std::string::npos) << err();
  good();
  std::ofstream(d.path / "x_train.npy", std::ios::binary) << "not an array";
  EXPECT_NE(err().find("x_train.npy: not an NPY file"), std::string::npos) << err();
  good();
  write_npy(d.path / "x_train.npy", "<f4", "(4, 3)", bytes_of(std::vector<float>(10, 1.0f)));  // 2 floats short
  EXPECT_NE(err().find("x_train.npy: "), std::string::npos);
  EXPECT_NE(err().find("(truncated?)"), std::string::npos) << err();
  good();
  write_npy(d.path / "y_train.npy", "<i4", "(3,)", bytes_of(std::vector<std::int32_t>{0, 1, 0}));
  EXPECT_NE(err().find("x_train.npy has 4 samples but " + d.str() + "/y_train.npy has 3 labels"), std::string::npos) << err();
  good();
  write_npy(d.path / "x_test.npy", "<f4", "(2, 4)", bytes_of(std::vector<float>(8, 1.0f)));
  EXPECT_NE(err().find("x_test.npy: a sample's shape differs from x_train.npy's"), std::string::npos) << err();
  good();
  write_npy(d.path / "x_train.npy", ">f4", "(4, 3)", bytes_of(std::vector<float>(12, 1.0f)));
  EXPECT_NE(err().find("x_train.npy: dtype >f4 is not read"), std::string::npos) << err();
  good();
  write_npy(d.path / "x_train.npy", "<f4", "(4, 3)", bytes_of(std::vector<float>(12, 1.0f)), true);
  EXPECT_NE(err().find("x_train.npy: Fortran order"), std::string::npos) << err();
  good();
  write_npy(d.path / "y_test.npy", "<i4", "(2,)", bytes_of(std::vector<std::int32_t>{1, 5}));
  EXPECT_NE(err().find("y_test.npy: label 5 of sample 1 is not a class of the training labels' [0, 2)"), std::string::npos) << err();
  good();
  write_npy(d.path / "y_train.npy", "<i4", "(4,)", bytes_of(std::vector<std::int32_t>{0, -1, 0, 1}));
  EXPECT_NE(err().find("y_train.npy: label -1 of sample 1 is negative"), std::string::npos) << err();
  // Arrays with no values (a worker divided by the 0 steps of an epoch), pixels scaled in one
  // split and not the other, labels that are identifiers (a head of billions of parameters).
  good();
  write_npy(d.path / "x_train.npy", "<f4", "(0, 3)", "");
  write_npy(d.path / "y_train.npy", "<f4", "(0,)", "");
  EXPECT_NE(err().find("x_train.npy: dimension 0 is 0: an array with no values"), std::string::npos) << err();
  good();
  write_npy(d.path / "x_test.npy", "<f4", "(2, 0)", "");
  EXPECT_NE(err().find("x_test.npy: dimension 1 is 0: an array with no values"), std::string::npos) << err();
  good();
  write_npy(d.path / "x_test.npy", "|u1", "(2, 3)", std::string(6, char(200)));
  EXPECT_NE(err().find("x_test.npy: dtype |u1, x_train.npy's <f4: bytes (u1) are read as pixels / 255"), std::string::npos)
      << err();
  good();
  write_npy(d.path / "y_train.npy", "<i8", "(4,)", bytes_of(std::vector<std::int64_t>{0, 1, 3000000000LL, 1}));
  EXPECT_NE(err().find("y_train.npy: label 3000000000 of sample 2: classes are 0 ... C - 1, and C at most 1048576"),
            std::string::npos) << err();
  // Headers that lie: a length of 4 GiB in a 12-byte file (made before anything was checked:
  // bad_alloc or the OOM killer), and a shape whose product wraps to 0 (a data set of no features).
  good();
  std::ofstream(d.path / "x_train.npy", std::ios::binary) << std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12);
  EXPECT_NE(err().find("x_train.npy: 12 bytes, its NPY header says it is 4294967295 bytes long"), std::string::npos)
      << err();
  good();
  write_npy(d.path / "x_train.npy", "<f4", "(4, 4611686018427387904, 4)", bytes_of(std::vector<float>(12, 1.0f)));
  EXPECT_NE(err().find("x_train.npy: its NPY header's shape has a dimension of 4611686018427387904"), std::string::npos)
      << err();
}
