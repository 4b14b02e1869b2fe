// The data sets pslab reads, by data.kind: what one is before it is read (the shape of a
// sample, the task, how many samples: what the plan, the servers and the model's shape need,
// from at most the files' headers) and reading it. Adding one: its file in core/datasets/, a
// line in core/datasets/registry.cpp, its tests (tests/core/test_datasets.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/data.h"
#include "core/registry.h"

namespace pslab {

// The data.* keys a data kind reads.
struct DataSpec {
  std::string kind = "fashion-mnist";
  std::string path;          // a directory of its files (data sets read from disk)
  bool normalize = true;     // standardise inputs with the training set's statistics
  int train_samples = 0;     // > 0: that many (a prefix of the training set; synthetic: their number)
  int test_samples = 0;
  int dim = 32, outputs = 4; // synthetic problems
  std::uint64_t seed = 1;    // synthetic problems
};

// What a data set is, before it is read.
struct DataShape {
  int channels = 1, height = 1, width = 1;  // one sample (features = C * H * W)
  int outputs = 0;                          // classes (classification), or regression outputs
  bool classification = true;
  std::size_t train_n = 0, test_n = 0;      // samples used (after train_samples / test_samples)
};

class DataKind {
 public:
  virtual ~DataKind() = default;
  // Reads at most headers and file sizes; throws DataError naming the file and the fault.
  virtual DataShape shape(const DataSpec& spec) const = 0;
  // The training and test sets (DataError naming the file and the fault).
  virtual DataSplit load(const DataSpec& spec) const = 0;
};

// data.kind -> its kind. Built-ins: fashion-mnist, least-squares, logistic, cifar10, arrays, external.
Registry<DataKind>& data_registry();

// ---- the loaders of the kinds read from disk (core/datasets/) ----
// CIFAR-10's binary format in `dir`: data_batch_1.bin ... data_batch_5.bin (those present, from
// 1 on) and test_batch.bin, each record a label byte then 3 x 32 x 32 pixel bytes (red, green,
// blue planes, rows in order). Pixels scaled to [0, 1], then standardised per channel with the
// training records' mean and std when `normalize`. limits > 0 keep a prefix.
DataSplit load_cifar10(const std::string& dir, bool normalize = true, int limit_train = 0, int limit_test = 0);

// NumPy arrays in `dir`: x_train.npy, y_train.npy, x_test.npy, y_test.npy (NPY 1.0-3.0, C order,
// little-endian; inputs of any numeric dtype, shape (n, F), (n, H, W) or (n, C, H, W); labels of
// an integer dtype, shape (n): classification, classes = the largest label + 1; or float, shape
// (n) or (n, k): regression). uint8 inputs are scaled to [0, 1]; with `normalize` the inputs are
// standardised with the training inputs' mean and std (one of each).
DataSplit load_arrays(const std::string& dir, bool normalize = true, int limit_train = 0, int limit_test = 0);

// One .npy file's header: dtype ("<f4", "|u1", ...), shape, where its data starts.
struct NpyHeader {
  std::string descr;
  std::vector<long> shape;
  std::size_t data_offset = 0;
  std::size_t item_bytes = 0;
  long count() const;  // the product of the shape
};
// Reads and checks the header of `path` (DataError naming the file: not NPY, Fortran order,
// big-endian, a dtype it does not read, or a file shorter than its data).
NpyHeader read_npy_header(const std::string& path);

}  // namespace pslab
