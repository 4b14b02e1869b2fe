// The data sets that were pslab's first: Fashion-MNIST, the synthetic problems with a known
// optimum, and an external model's own data (core/data.h has their loaders).
#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include "core/datasets.h"

namespace pslab::datasets {
namespace {

constexpr int kSyntheticTrain = 8192, kSyntheticTest = 2048;

std::size_t prefix(int limit, int all) { return std::size_t(limit > 0 ? std::min(limit, all) : all); }
std::size_t or_default(int n, int otherwise) { return std::size_t(n > 0 ? n : otherwise); }

// The images an IDX file holds (its header: a cut-down copy has fewer), or `otherwise` where the
// file is not here (the processes that load it say so).
int images_in(const std::string& path, int otherwise) {
  return std::filesystem::exists(path) ? read_idx_dims(path, 3)[0] : otherwise;
}

struct FashionMnist final : DataKind {
  DataShape shape(const DataSpec& s) const override {
    return DataShape{1, 28, 28, 10, true, prefix(s.train_samples, images_in(s.path + "/train-images-idx3-ubyte.gz", 60000)),
                     prefix(s.test_samples, images_in(s.path + "/t10k-images-idx3-ubyte.gz", 10000))};
  }
  DataSplit load(const DataSpec& s) const override {
    return load_fashion_mnist(s.path, s.normalize, s.train_samples, s.test_samples);
  }
};

// least-squares (regression) and logistic (classification): data.dim features, data.outputs.
struct Synthetic final : DataKind {
  bool regression;
  explicit Synthetic(bool r) : regression(r) {}
  DataShape shape(const DataSpec& s) const override {
    return DataShape{1, 1, s.dim, s.outputs, !regression, or_default(s.train_samples, kSyntheticTrain),
                     or_default(s.test_samples, kSyntheticTest)};
  }
  DataSplit load(const DataSpec& s) const override {
    const int n_train = int(or_default(s.train_samples, kSyntheticTrain)), n_test = int(or_default(s.test_samples, kSyntheticTest));
    return regression ? make_least_squares(n_train, n_test, s.dim, s.outputs, s.seed)
                      : make_logistic(n_train, n_test, s.dim, s.outputs, s.seed);
  }
};

struct External final : DataKind {
  DataShape shape(const DataSpec& s) const override {
    return DataShape{1, 1, s.dim, s.outputs, true, std::size_t(std::max(0, s.train_samples)),
                     or_default(s.test_samples, kSyntheticTest)};
  }
  DataSplit load(const DataSpec&) const override {
    throw std::invalid_argument("data.kind = \"external\": the data is your own workers' (libpslab_client.so); pslab reads none");
  }
};

}  // namespace

std::unique_ptr<DataKind> fashion_mnist_kind(const std::string&) { return std::make_unique<FashionMnist>(); }
std::unique_ptr<DataKind> least_squares_kind(const std::string&) { return std::make_unique<Synthetic>(true); }
std::unique_ptr<DataKind> logistic_kind(const std::string&) { return std::make_unique<Synthetic>(false); }
std::unique_ptr<DataKind> external_kind(const std::string&) { return std::make_unique<External>(); }

}  // namespace pslab::datasets
