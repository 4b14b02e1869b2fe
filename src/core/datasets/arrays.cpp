// data.kind = "arrays": a user's own data as NumPy's .npy files (the NPY format, versions 1.0 to
// 3.0: numpy.org/doc/stable/reference/generated/numpy.lib.format.html), x_train.npy,
// y_train.npy, x_test.npy and y_test.npy in data.path, as `numpy.save` writes them.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/datasets.h"

namespace pslab {
namespace {

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

File open_file(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f)
    throw DataError(path + ": not found (data.kind = \"arrays\": data.path holds x_train.npy, y_train.npy, x_test.npy and "
                    "y_test.npy, as numpy.save writes them)");
  return f;
}

// The value of `key` in the header's dictionary text: what follows "'key':".
std::string value_of(const std::string& header, const std::string& key, const std::string& path) {
  const auto at = header.find("'" + key + "'");
  const auto colon = at == std::string::npos ? at : header.find(':', at);
  if (colon == std::string::npos) throw DataError(path + ": its NPY header has no '" + key + "': " + header);
  return header.substr(colon + 1);
}

std::vector<long> parse_shape(const std::string& text, const std::string& path) {
  const auto open = text.find('('), close = text.find(')');
  if (open == std::string::npos || close == std::string::npos || close < open)
    throw DataError(path + ": its NPY header's shape is not a tuple: " + text);
  std::vector<long> shape;
  const std::string inside = text.substr(open + 1, close - open - 1);
  std::size_t i = 0;
  while (i < inside.size()) {
    while (i < inside.size() && (inside[i] == ' ' || inside[i] == ',')) ++i;
    if (i >= inside.size()) break;
    char* end = nullptr;
    const long v = std::strtol(inside.c_str() + i, &end, 10);
    if (end == inside.c_str() + i || v < 0) throw DataError(path + ": its NPY header's shape is not integers: (" + inside + ")");
    shape.push_back(v);
    i = std::size_t(end - inside.c_str());
    while (i < inside.size() && (inside[i] == 'L' || inside[i] == ' ')) ++i;
  }
  return shape;
}

// Bytes per item of the dtypes read ("<f4", "|u1", ...), or 0.
std::size_t item_bytes(const std::string& descr) {
  static const char* const kTypes[] = {"f4", "f8", "u1", "i1", "i2", "i4", "i8", "u2", "u4", "u8", "b1"};
  if (descr.size() != 3 || !(descr[0] == '<' || descr[0] == '|' || (descr[0] == '>' && descr[2] == '1'))) return 0;
  for (const char* t : kTypes)
    if (descr.compare(1, 2, t) == 0) return std::size_t(descr[2] - '0');
  return 0;
}

bool is_float(const std::string& descr) { return descr[1] == 'f'; }

// count items of `descr` at `raw` as floats into out.
void to_floats(const unsigned char* raw, const std::string& descr, std::size_t count, float* out) {
  auto convert = [&](auto tag) {
    using T = decltype(tag);
    for (std::size_t i = 0; i < count; ++i) {
      T v;
      std::memcpy(&v, raw + i * sizeof(T), sizeof(T));
      out[i] = float(v);
    }
  };
  const char k = descr[1], b = descr[2];
  if (k == 'f') b == '4' ? convert(float{}) : convert(double{});
  else if (k == 'u') b == '1' ? convert(std::uint8_t{}) : b == '2' ? convert(std::uint16_t{}) : b == '4' ? convert(std::uint32_t{}) : convert(std::uint64_t{});
  else if (k == 'i') b == '1' ? convert(std::int8_t{}) : b == '2' ? convert(std::int16_t{}) : b == '4' ? convert(std::int32_t{}) : convert(std::int64_t{});
  else convert(std::uint8_t{});  // b1
}

// The array's data (count x item bytes) after its header.
std::vector<unsigned char> read_data(const std::string& path, const NpyHeader& h) {
  File f = open_file(path);
  std::vector<unsigned char> raw(std::size_t(h.count()) * h.item_bytes);
  if (std::fseek(f.get(), long(h.data_offset), SEEK_SET) != 0 || std::fread(raw.data(), 1, raw.size(), f.get()) != raw.size())
    throw DataError(path + ": shorter than its header says (truncated?)");
  return raw;
}

struct Arrays {
  NpyHeader x_train, y_train, x_test, y_test;
  std::string dir;
  std::string path(const char* name) const { return dir + "/" + name + ".npy"; }
};

// The four headers, checked against each other (DataError naming the files).
Arrays headers(const std::string& dir) {
  Arrays a{read_npy_header(dir + "/x_train.npy"), read_npy_header(dir + "/y_train.npy"),
           read_npy_header(dir + "/x_test.npy"), read_npy_header(dir + "/y_test.npy"), dir};
  for (const auto& [h, name] : {std::pair{&a.x_train, "x_train"}, {&a.y_train, "y_train"}, {&a.x_test, "x_test"},
                                {&a.y_test, "y_test"}})
    for (std::size_t i = 0; i < h->shape.size(); ++i)
      if (h->shape[i] <= 0 || (i == 0 && h->shape[i] > std::numeric_limits<int>::max()))
        throw DataError(a.path(name) + ": dimension " + std::to_string(i) + " is " + std::to_string(h->shape[i]) +
                        (h->shape[i] <= 0 ? ": an array with no values" : ": more samples than are read (2^31 - 1)"));
  struct Split {
    const NpyHeader &x, &y;
    std::string xp, yp;
  };
  for (const Split& s : {Split{a.x_train, a.y_train, a.path("x_train"), a.path("y_train")},
                         Split{a.x_test, a.y_test, a.path("x_test"), a.path("y_test")}}) {
    if (s.x.shape.empty() || s.y.shape.empty() || s.x.shape[0] != s.y.shape[0])
      throw DataError(s.xp + " has " + (s.x.shape.empty() ? "no samples" : std::to_string(s.x.shape[0]) + " samples") +
                      " but " + s.yp + " has " + (s.y.shape.empty() ? "no labels" : std::to_string(s.y.shape[0]) + " labels"));
    if (s.x.shape.size() > 4)
      throw DataError(s.xp + ": " + std::to_string(s.x.shape.size()) + " dimensions; inputs are (n, F), (n, H, W) or (n, C, H, W)");
    if (s.y.shape.size() > 2) throw DataError(s.yp + ": labels are (n) (classes or one target) or (n, k) (k targets)");
  }
  if (!std::equal(a.x_train.shape.begin() + 1, a.x_train.shape.end(), a.x_test.shape.begin() + 1, a.x_test.shape.end()))
    throw DataError(a.path("x_test") + ": a sample's shape differs from x_train.npy's");
  if ((a.x_train.descr.substr(1) == "u1") != (a.x_test.descr.substr(1) == "u1"))  // (uint8 pixels are scaled to [0, 1])
    throw DataError(a.path("x_test") + ": dtype " + a.x_test.descr + ", x_train.npy's " + a.x_train.descr +
                    ": bytes (u1) are read as pixels / 255, others as they are; save both alike");
  if (is_float(a.y_train.descr) != is_float(a.y_test.descr) ||
      (a.y_train.shape.size() > 1 ? a.y_train.shape[1] : 1) != (a.y_test.shape.size() > 1 ? a.y_test.shape[1] : 1))
    throw DataError(a.path("y_test") + ": its labels are not of y_train.npy's kind (integer classes or float targets, as many)");
  if (!is_float(a.y_train.descr) && a.y_train.shape.size() != 1)
    throw DataError(a.path("y_train") + ": integer labels are classes, one per sample: shape (n)");
  return a;
}

// The classes of integer labels: the largest + 1 (DataError for a negative one, or one past
// kMaxClasses: an identifier, not a class index).
constexpr int kMaxClasses = 1 << 20;
int classes_of(const std::vector<float>& labels, const std::string& path) {
  float top = 0;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0) throw DataError(path + ": label " + std::to_string(long(labels[i])) + " of sample " + std::to_string(i) + " is negative");
    if (labels[i] >= float(kMaxClasses))
      throw DataError(path + ": label " + std::to_string((long long)labels[i]) + " of sample " + std::to_string(i) +
                      ": classes are 0 ... C - 1, and C at most " + std::to_string(kMaxClasses));
    top = std::max(top, labels[i]);
  }
  return int(top) + 1;
}

std::vector<float> floats_of(const std::string& path, const NpyHeader& h, std::size_t count) {
  const auto raw = read_data(path, h);
  std::vector<float> out(count);
  to_floats(raw.data(), h.descr, count, out.data());
  return out;
}

void shape_sample(Dataset& d, const NpyHeader& x) {
  const auto& s = x.shape;
  d.channels = s.size() == 4 ? int(s[1]) : 1;
  d.height = s.size() >= 3 ? int(s[s.size() - 2]) : 1;
  d.width = s.size() >= 2 ? int(s.back()) : 1;
}

Dataset read_split(const Arrays& a, bool train, int limit, int classes) {
  const NpyHeader& xh = train ? a.x_train : a.x_test;
  const NpyHeader& yh = train ? a.y_train : a.y_test;
  const std::string xp = a.path(train ? "x_train" : "x_test"), yp = a.path(train ? "y_train" : "y_test");
  Dataset d;
  d.n = int(limit > 0 ? std::min<long>(limit, xh.shape[0]) : xh.shape[0]);
  shape_sample(d, xh);
  const std::size_t features = std::size_t(d.features()), n = std::size_t(d.n);
  const auto raw = read_data(xp, xh);
  d.x.resize(n * features);
  to_floats(raw.data(), xh.descr, n * features, d.x.data());
  if (xh.descr.substr(1) == "u1")
    for (float& v : d.x) v /= 255.0f;
  const std::size_t k = yh.shape.size() > 1 ? std::size_t(yh.shape[1]) : 1;
  const auto y = floats_of(yp, yh, std::size_t(yh.shape[0]) * k);
  if (classes > 0) {
    d.classes = classes;
    d.labels.assign(y.begin(), y.begin() + long(n));
    for (std::size_t i = 0; i < n; ++i)
      if (d.labels[i] < 0 || d.labels[i] >= classes)
        throw DataError(yp + ": label " + std::to_string(d.labels[i]) + " of sample " + std::to_string(i) +
                        " is not a class of the training labels' [0, " + std::to_string(classes) + ")");
  } else {
    d.target_dim = int(k);
    d.targets.assign(y.begin(), y.begin() + long(n * k));
  }
  return d;
}

int classes_from(const Arrays& a) {
  if (is_float(a.y_train.descr)) return 0;
  const int classes = classes_of(floats_of(a.path("y_train"), a.y_train, std::size_t(a.y_train.shape[0])), a.path("y_train"));
  if (classes < 2) throw DataError(a.path("y_train") + ": every label is 0: a classification needs two classes or more");
  return classes;
}

struct NpyArrays final : DataKind {
  DataShape shape(const DataSpec& s) const override {
    const Arrays a = headers(s.path);
    Dataset probe;
    shape_sample(probe, a.x_train);
    const int classes = classes_from(a);
    const long k = a.y_train.shape.size() > 1 ? a.y_train.shape[1] : 1;
    auto used = [](int limit, long all) { return std::size_t(limit > 0 ? std::min<long>(limit, all) : all); };
    return DataShape{probe.channels, probe.height, probe.width, classes > 0 ? classes : int(k), classes > 0,
                     used(s.train_samples, a.x_train.shape[0]), used(s.test_samples, a.x_test.shape[0])};
  }
  DataSplit load(const DataSpec& s) const override {
    return load_arrays(s.path, s.normalize, s.train_samples, s.test_samples);
  }
};

}  // namespace

long NpyHeader::count() const {
  long n = 1;
  for (long d : shape) n *= d;
  return n;
}

NpyHeader read_npy_header(const std::string& path) {
  File f = open_file(path);
  unsigned char pre[12] = {};
  const std::size_t got = std::fread(pre, 1, sizeof pre, f.get());
  if (got < 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    throw DataError(path + ": not an NPY file (numpy.save writes them; its first bytes are \\x93NUMPY)");
  const int major = pre[6];
  if (major < 1 || major > 3) throw DataError(path + ": NPY version " + std::to_string(major) + " (1 to 3 are read)");
  const std::size_t len = major == 1 ? std::size_t(pre[8]) | std::size_t(pre[9]) << 8
                                     : std::size_t(pre[8]) | std::size_t(pre[9]) << 8 | std::size_t(pre[10]) << 16 |
                                           std::size_t(pre[11]) << 24;
  NpyHeader h;
  h.data_offset = (major == 1 ? 10 : 12) + len;
  struct stat st{};
  if (::fstat(fileno(f.get()), &st) != 0 || std::size_t(st.st_size) < h.data_offset)  // (before len bytes are made)
    throw DataError(path + ": " + std::to_string(st.st_size) + " bytes, its NPY header says it is " + std::to_string(len) +
                    " bytes long (truncated, or not an NPY file)");
  std::string header(len, '\0');
  if (std::fseek(f.get(), major == 1 ? 10 : 12, SEEK_SET) != 0 || std::fread(header.data(), 1, len, f.get()) != len)
    throw DataError(path + ": its NPY header is cut short (truncated?)");
  const std::string descr = value_of(header, "descr", path);
  const auto q1 = descr.find('\''), q2 = q1 == std::string::npos ? q1 : descr.find('\'', q1 + 1);
  if (q2 == std::string::npos) throw DataError(path + ": its NPY header's descr is not a string: " + header);
  h.descr = descr.substr(q1 + 1, q2 - q1 - 1);
  h.item_bytes = item_bytes(h.descr);
  if (h.item_bytes == 0)
    throw DataError(path + ": dtype " + h.descr + " is not read (little-endian integers, floats and bools: " +
                    "x.astype(numpy.float32) first)");
  const std::string fortran = value_of(header, "fortran_order", path);
  if (fortran.find("True") < fortran.find(','))
    throw DataError(path + ": Fortran order; save it C-ordered (numpy.ascontiguousarray(x))");
  h.shape = parse_shape(value_of(header, "shape", path), path);
  std::size_t values = 1;  // (dimensions that multiply past what a file holds: refused, not wrapped to a small count)
  for (long d : h.shape)  // (one <= 0: said by headers(), naming the array)
    if (d > std::numeric_limits<int>::max() || __builtin_mul_overflow(values, std::size_t(std::max(d, 0L)), &values))
      throw DataError(path + ": its NPY header's shape has a dimension of " + std::to_string(d) +
                      " (at most 2^31 - 1 each, and no more values than a file holds)");
  std::size_t need = 0;
  if (__builtin_mul_overflow(values, h.item_bytes, &need) || __builtin_add_overflow(need, h.data_offset, &need) ||
      std::size_t(st.st_size) < need)
    throw DataError(path + ": " + std::to_string(st.st_size) + " bytes, its header's shape and dtype need " + std::to_string(need) +
                    " (truncated?)");
  return h;
}

DataSplit load_arrays(const std::string& dir, bool normalize, int limit_train, int limit_test) {
  const Arrays a = headers(dir);
  const int classes = classes_from(a);
  DataSplit out{read_split(a, true, limit_train, classes), read_split(a, false, limit_test, classes)};
  if (normalize && !out.train.x.empty()) {
    double sum = 0, sq = 0;
    for (float v : out.train.x) sum += v, sq += double(v) * v;
    const double count = double(out.train.x.size()), mean = sum / count;
    const double stdev = std::max(1e-6, std::sqrt(std::max(0.0, sq / count - mean * mean)));
    for (Dataset* d : {&out.train, &out.test})
      for (float& v : d->x) v = float((v - mean) / stdev);
  }
  return out;
}

namespace datasets {
std::unique_ptr<DataKind> arrays_kind(const std::string&) { return std::make_unique<NpyArrays>(); }
}  // namespace datasets

}  // namespace pslab
