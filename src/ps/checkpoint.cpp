#include "ps/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "comm/wire.h"

namespace pslab {

namespace {

constexpr char kMagic[8] = {'P', 'S', 'L', 'A', 'B', 'C', 'K', 'P'};
// Format 3: the checksum covers the whole file. 2: the body only. 1: also, the kept integers
// were bsp's acc_samples and acc_empty.
constexpr std::int64_t kFormat = 3, kFormatBodySum = 2, kFormatBsp = 1;
constexpr std::size_t kHeaderWords = 32, kHeaderBytes = kHeaderWords * 8;

// Header word indices (after the magic at word 0).
enum : std::size_t {
  kFormatWord = 1, kShard, kNumShards, kOffset, kLength, kWorkers, kVersion, kSamples, kOptSteps, kOptBuffers,
  kKeptFloats, kKeptCount0, kKeptCount1, kBuckets, kConfigHash, kBodyBytes, kChecksumWord, kReserved
};
static_assert(kChecksumWord * 8 == kCheckpointChecksumAt);

template <typename T>
void put(std::vector<char>& out, const T* p, std::size_t n) {
  if (!n) return;
  const char* b = reinterpret_cast<const char*>(p);
  out.insert(out.end(), b, b + n * sizeof(T));
}

// Reads n values of T at `at` from `body` (`end` bytes), or throws naming the file.
template <typename T>
void take(const char* body, std::size_t end, std::size_t& at, T* p, std::size_t n, const std::string& name) {
  if (at + n * sizeof(T) > end) throw std::runtime_error("checkpoint " + name + ": truncated body");
  if (n) std::memcpy(p, body + at, n * sizeof(T));  // p may be null when n is 0
  at += n * sizeof(T);
}

std::string sys_error(const std::string& what, const std::string& path) {
  return "checkpoint " + path + ": " + what + ": " + std::strerror(errno);
}

// The header's words for `c`, whose body is `body_bytes` long.
void fill_header(std::int64_t* head, const ShardCheckpoint& c, std::size_t buckets, std::size_t body_bytes) {
  std::memcpy(&head[0], kMagic, 8);
  head[kFormatWord] = kFormat;
  head[kShard] = c.shard;
  head[kNumShards] = c.num_shards;
  head[kOffset] = std::int64_t(c.offset);
  head[kLength] = std::int64_t(c.length);
  head[kWorkers] = std::int64_t(c.clocks.size());
  head[kVersion] = c.version;
  head[kSamples] = c.samples_applied;
  head[kOptSteps] = c.optimizer_steps;
  head[kOptBuffers] = std::int64_t(c.optimizer.size());
  head[kKeptFloats] = std::int64_t(c.kept.size());
  head[kKeptCount0] = c.kept_counts[0];
  head[kKeptCount1] = c.kept_counts[1];
  head[kBuckets] = std::int64_t(buckets);
  head[kConfigHash] = std::int64_t(c.config_hash);
  head[kBodyBytes] = std::int64_t(body_bytes);
}

// Checks the header (magic, format, sizes against the file's `n` bytes) and the checksum.
void check_file(const std::int64_t* head, const char* data, std::size_t n, const std::string& name) {
  const std::string who = "checkpoint " + name + ": ";
  if (std::memcmp(&head[0], kMagic, 8) != 0) throw std::runtime_error(who + "not a pslab checkpoint");
  const std::int64_t format = head[kFormatWord];
  if (format < kFormatBsp || format > kFormat)
    throw std::runtime_error(who + "format " + std::to_string(format) + ", this build reads 1 to " + std::to_string(kFormat) +
                             " (the file is damaged, or from a newer pslab)");
  const std::int64_t W = head[kWorkers], L = head[kLength], nb = head[kOptBuffers], kept = head[kKeptFloats],
                     buckets = head[kBuckets], bytes = head[kBodyBytes];
  const bool sane = W >= 1 && W < (1 << 20) && L >= 0 && L < (std::int64_t(1) << 36) && nb >= 0 && nb <= 2 &&
                    (kept == 0 || kept == L) && buckets >= 0 && buckets < (1 << 20) && head[kReserved] == 0;
  if (!sane || bytes != (2 * W + W * buckets) * 8 + (1 + nb) * L * 4 + kept * 4)
    throw std::runtime_error(who + "inconsistent header (sizes do not add up)");
  if (n != kHeaderBytes + std::size_t(bytes))
    throw std::runtime_error(who + "the file is " + std::to_string(n) + " bytes long, not " +
                             std::to_string(kHeaderBytes + std::size_t(bytes)) + " as its header says (truncated?)");
  const std::uint64_t sum = format == kFormat ? checkpoint_checksum(data, n)
                                              : wire::checksum_bytes(data + kHeaderBytes, std::size_t(bytes));
  if (std::int64_t(sum) != head[kChecksumWord]) throw std::runtime_error(who + "checksum mismatch (the file is corrupt)");
}

}  // namespace

std::uint64_t checkpoint_checksum(const char* data, std::size_t n) {
  static const char zeros[8] = {};
  wire::Checksum c;
  c.update_bytes(data, kCheckpointChecksumAt);
  c.update_bytes(zeros, 8);
  c.update_bytes(data + kCheckpointChecksumAt + 8, n - kCheckpointChecksumAt - 8);
  return c.value();
}

std::vector<char> encode_checkpoint(const ShardCheckpoint& c) {
  const std::size_t W = c.clocks.size(), L = std::size_t(c.length);
  std::size_t buckets = 0;
  for (const auto& h : c.staleness) buckets = std::max(buckets, h.size());
  std::vector<char> out(kHeaderBytes, 0);
  out.reserve(kHeaderBytes + (2 * W + W * buckets) * 8 + (1 + c.optimizer.size()) * L * 4 + c.kept.size() * 4);
  std::vector<std::int64_t> ints(c.clocks.begin(), c.clocks.end());
  put(out, ints.data(), W);
  ints.assign(c.lost.begin(), c.lost.end());
  ints.resize(W);
  put(out, ints.data(), W);
  put(out, c.theta.data(), L);
  for (const auto& b : c.optimizer) put(out, b.data(), L);
  put(out, c.kept.data(), c.kept.size());
  for (std::size_t w = 0; w < W; ++w) {  // W histograms of `buckets` counts
    if (w < c.staleness.size()) ints.assign(c.staleness[w].begin(), c.staleness[w].end());
    else ints.clear();
    ints.resize(buckets);
    put(out, ints.data(), buckets);
  }
  std::int64_t head[kHeaderWords] = {};
  fill_header(head, c, buckets, out.size() - kHeaderBytes);
  std::memcpy(out.data(), head, kHeaderBytes);
  const std::uint64_t sum = checkpoint_checksum(out.data(), out.size());
  std::memcpy(out.data() + kCheckpointChecksumAt, &sum, 8);
  return out;
}

ShardCheckpoint decode_checkpoint(const char* data, std::size_t n, const std::string& name) {
  if (n < kHeaderBytes) throw std::runtime_error("checkpoint " + name + ": truncated header");
  std::int64_t head[kHeaderWords];
  std::memcpy(head, data, kHeaderBytes);
  check_file(head, data, n, name);
  const std::int64_t W = head[kWorkers], L = head[kLength], nb = head[kOptBuffers], kept = head[kKeptFloats],
                     buckets = head[kBuckets];
  ShardCheckpoint c;
  c.shard = int(head[kShard]);
  c.num_shards = int(head[kNumShards]);
  c.offset = std::uint64_t(head[kOffset]);
  c.length = std::uint64_t(L);
  c.config_hash = std::uint64_t(head[kConfigHash]);
  c.version = head[kVersion];
  c.samples_applied = head[kSamples];
  c.optimizer_steps = head[kOptSteps];
  c.kept_counts[0] = head[kKeptCount0];
  c.kept_counts[1] = head[kFormatWord] == kFormatBsp ? (head[kKeptCount1] != 0 ? 0 : 1) : head[kKeptCount1];
  std::size_t at = kHeaderBytes;
  std::vector<std::int64_t> ints(static_cast<std::size_t>(W), 0);
  take(data, n, at, ints.data(), ints.size(), name);
  c.clocks.assign(ints.begin(), ints.end());
  take(data, n, at, ints.data(), ints.size(), name);
  c.lost.assign(ints.begin(), ints.end());
  c.theta.resize(std::size_t(L));
  take(data, n, at, c.theta.data(), c.theta.size(), name);
  c.optimizer.assign(std::size_t(nb), std::vector<float>(std::size_t(L)));
  for (auto& b : c.optimizer) take(data, n, at, b.data(), b.size(), name);
  c.kept.resize(std::size_t(kept));
  take(data, n, at, c.kept.data(), c.kept.size(), name);
  c.staleness.assign(std::size_t(W), std::vector<long>(std::size_t(buckets)));
  ints.resize(std::size_t(buckets));
  for (auto& h : c.staleness) {
    take(data, n, at, ints.data(), ints.size(), name);
    h.assign(ints.begin(), ints.end());
  }
  return c;
}

void write_checkpoint(const std::string& path, const ShardCheckpoint& c) {
  const std::vector<char> bytes = encode_checkpoint(c);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error(sys_error("cannot create " + tmp, path));
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left) {
    const ssize_t k = ::write(fd, p, left);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = ENOSPC;
      const std::string e = sys_error("cannot write " + tmp, path);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw std::runtime_error(e);
    }
    p += k;
    left -= std::size_t(k);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string e = sys_error("cannot flush " + tmp, path);
    ::unlink(tmp.c_str());
    throw std::runtime_error(e);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = sys_error("cannot rename " + tmp + " to it", path);
    ::unlink(tmp.c_str());
    throw std::runtime_error(e);
  }
}

ShardCheckpoint read_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("checkpoint " + path + ": cannot open: " + std::strerror(errno));
  std::vector<char> bytes(std::size_t(std::max<std::streamoff>(0, in.tellg())));
  in.seekg(0);
  if (!in.read(bytes.data(), std::streamsize(bytes.size())))
    throw std::runtime_error("checkpoint " + path + ": cannot read: " + std::strerror(errno));
  return decode_checkpoint(bytes.data(), bytes.size(), path);
}

}  // namespace pslab
