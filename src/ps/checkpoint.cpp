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
constexpr std::int64_t kFormat = 2, kFormatBsp = 1;  // format 1: the kept integers were acc_samples, acc_empty
constexpr std::size_t kHeaderWords = 32;

// Header word indices (after the magic at word 0).
enum : std::size_t {
  kFormatWord = 1, kShard, kNumShards, kOffset, kLength, kWorkers, kVersion, kSamples, kOptSteps, kOptBuffers,
  kKeptFloats, kKeptCount0, kKeptCount1, kBuckets, kConfigHash, kBodyBytes, kBodyChecksum, kReserved
};

template <typename T>
void put(std::vector<char>& out, const T* p, std::size_t n) {
  const char* b = reinterpret_cast<const char*>(p);
  out.insert(out.end(), b, b + n * sizeof(T));
}

// Reads n values of T at `at` from `body`, or throws naming the file.
template <typename T>
void take(const std::vector<char>& body, std::size_t& at, T* p, std::size_t n, const std::string& path) {
  if (at + n * sizeof(T) > body.size()) throw std::runtime_error("checkpoint " + path + ": truncated body");
  std::memcpy(p, body.data() + at, n * sizeof(T));
  at += n * sizeof(T);
}

std::string sys_error(const std::string& what, const std::string& path) {
  return "checkpoint " + path + ": " + what + ": " + std::strerror(errno);
}

}  // namespace

void write_checkpoint(const std::string& path, const ShardCheckpoint& c) {
  const std::size_t W = c.clocks.size(), L = std::size_t(c.length);
  std::size_t buckets = 0;
  for (const auto& h : c.staleness) buckets = std::max(buckets, h.size());
  std::vector<char> body;
  body.reserve((2 * W + W * buckets) * 8 + (1 + c.optimizer.size()) * L * 4 + c.kept.size() * 4);
  std::vector<std::int64_t> ints(c.clocks.begin(), c.clocks.end());
  put(body, ints.data(), W);
  ints.assign(c.lost.begin(), c.lost.end());
  put(body, ints.data(), W);
  put(body, c.theta.data(), L);
  for (const auto& b : c.optimizer) put(body, b.data(), L);
  put(body, c.kept.data(), c.kept.size());
  for (std::size_t w = 0; w < W; ++w) {  // W histograms of `buckets` counts
    if (w < c.staleness.size()) ints.assign(c.staleness[w].begin(), c.staleness[w].end());
    else ints.clear();
    ints.resize(buckets);
    put(body, ints.data(), buckets);
  }
  std::int64_t head[kHeaderWords] = {};
  std::memcpy(&head[0], kMagic, 8);
  head[kFormatWord] = kFormat;
  head[kShard] = c.shard;
  head[kNumShards] = c.num_shards;
  head[kOffset] = std::int64_t(c.offset);
  head[kLength] = std::int64_t(c.length);
  head[kWorkers] = std::int64_t(W);
  head[kVersion] = c.version;
  head[kSamples] = c.samples_applied;
  head[kOptSteps] = c.optimizer_steps;
  head[kOptBuffers] = std::int64_t(c.optimizer.size());
  head[kKeptFloats] = std::int64_t(c.kept.size());
  head[kKeptCount0] = c.kept_counts[0];
  head[kKeptCount1] = c.kept_counts[1];
  head[kBuckets] = std::int64_t(buckets);
  head[kConfigHash] = std::int64_t(c.config_hash);
  head[kBodyBytes] = std::int64_t(body.size());
  head[kBodyChecksum] = std::int64_t(wire::checksum_bytes(body.data(), body.size()));

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error(sys_error("cannot create " + tmp, path));
  auto write_all = [&](const char* p, std::size_t n) {
    while (n) {
      const ssize_t k = ::write(fd, p, n);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        const std::string e = sys_error("cannot write " + tmp, path);
        ::close(fd);
        ::unlink(tmp.c_str());
        throw std::runtime_error(e);
      }
      p += k;
      n -= std::size_t(k);
    }
  };
  write_all(reinterpret_cast<const char*>(head), sizeof head);
  write_all(body.data(), body.size());
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
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("checkpoint " + path + ": cannot open: " + std::strerror(errno));
  std::int64_t head[kHeaderWords] = {};
  if (!in.read(reinterpret_cast<char*>(head), sizeof head)) throw std::runtime_error("checkpoint " + path + ": truncated header");
  if (std::memcmp(&head[0], kMagic, 8) != 0) throw std::runtime_error("checkpoint " + path + ": not a pslab checkpoint");
  if (head[kFormatWord] != kFormat && head[kFormatWord] != kFormatBsp)
    throw std::runtime_error("checkpoint " + path + ": format " + std::to_string(head[kFormatWord]) + ", this build reads " +
                             std::to_string(kFormatBsp) + " and " + std::to_string(kFormat));
  const std::int64_t W = head[kWorkers], L = head[kLength], nb = head[kOptBuffers], kept = head[kKeptFloats],
                     buckets = head[kBuckets], bytes = head[kBodyBytes];
  const bool sane = W >= 1 && W < (1 << 20) && L >= 0 && L < (std::int64_t(1) << 36) && nb >= 0 && nb <= 2 &&
                    (kept == 0 || kept == L) && buckets >= 0 && buckets < (1 << 20) && head[kReserved] == 0;
  if (!sane || bytes != (2 * W + W * buckets) * 8 + (1 + nb) * L * 4 + kept * 4)
    throw std::runtime_error("checkpoint " + path + ": inconsistent header (sizes do not add up)");
  std::vector<char> body(std::size_t(bytes), 0);
  if (!in.read(body.data(), bytes) || in.peek() != std::ifstream::traits_type::eof())
    throw std::runtime_error("checkpoint " + path + ": the file is not " + std::to_string(sizeof head + std::size_t(bytes)) +
                             " bytes long, as its header says");
  if (std::int64_t(wire::checksum_bytes(body.data(), body.size())) != head[kBodyChecksum])
    throw std::runtime_error("checkpoint " + path + ": checksum mismatch (the file is corrupt)");

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
  std::size_t at = 0;
  std::vector<std::int64_t> ints(static_cast<std::size_t>(W), 0);
  take(body, at, ints.data(), ints.size(), path);
  c.clocks.assign(ints.begin(), ints.end());
  take(body, at, ints.data(), ints.size(), path);
  c.lost.assign(ints.begin(), ints.end());
  c.theta.resize(std::size_t(L));
  take(body, at, c.theta.data(), c.theta.size(), path);
  c.optimizer.assign(std::size_t(nb), std::vector<float>(std::size_t(L)));
  for (auto& b : c.optimizer) take(body, at, b.data(), b.size(), path);
  c.kept.resize(std::size_t(kept));
  take(body, at, c.kept.data(), c.kept.size(), path);
  c.staleness.assign(std::size_t(W), std::vector<long>(std::size_t(buckets)));
  ints.resize(std::size_t(buckets));
  for (auto& h : c.staleness) {
    take(body, at, ints.data(), ints.size(), path);
    h.assign(ints.begin(), ints.end());
  }
  return c;
}

}  // namespace pslab
