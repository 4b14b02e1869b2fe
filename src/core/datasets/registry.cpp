// The data sets pslab reads: data.kind -> its kind (core/datasets.h says how to add one).
#include "core/datasets.h"

namespace pslab {

namespace datasets {
std::unique_ptr<DataKind> fashion_mnist_kind(const std::string&);
std::unique_ptr<DataKind> least_squares_kind(const std::string&);
std::unique_ptr<DataKind> logistic_kind(const std::string&);
std::unique_ptr<DataKind> cifar10_kind(const std::string&);
std::unique_ptr<DataKind> arrays_kind(const std::string&);
std::unique_ptr<DataKind> external_kind(const std::string&);
}  // namespace datasets

Registry<DataKind>& data_registry() {
  using namespace datasets;
  static Registry<DataKind> r("data set", {
      {"fashion-mnist", "fashion-mnist", "Fashion-MNIST's IDX files in data.path (Debian: dataset-fashion-mnist)", false,
       fashion_mnist_kind},
      {"least-squares", "least-squares", "synthetic regression y = x W* + b*, known optimum (data.dim, data.outputs)", false,
       least_squares_kind},
      {"logistic", "logistic", "synthetic classification by a linear rule (data.dim, data.outputs classes)", false,
       logistic_kind},
      {"cifar10", "cifar10", "CIFAR-10's binary files in data.path (data_batch_*.bin, test_batch.bin)", false, cifar10_kind},
      {"arrays", "arrays", "your own data: x_train.npy, y_train.npy, x_test.npy, y_test.npy in data.path", false, arrays_kind},
      {"external", "external", "your own workers' data (libpslab_client.so): data.train_samples of them, read by them", false,
       external_kind},
  });
  return r;
}

}  // namespace pslab
