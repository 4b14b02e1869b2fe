// A parameter server's checkpoint of its shard: θ, the optimizer's state, the version, the
// workers' clocks (and which were dropped), what the shard keeps for its mode (bsp: the open
// clock's sum) and the staleness statistics: everything a server needs to go on where it stopped.
//
// One file per shard (RUN_DIR/checkpoints/server<K>.ckpt), written atomically: the bytes go to
// a temporary file in the same directory, which is flushed to disk and then renamed over the
// old one, so a reader finds the previous checkpoint or this one, never part of one (the
// rename is the "done" marker).
//
// Layout, every field little-endian:
//   header   32 x int64: "PSLABCKP" (8 bytes), format version (2), shard, num_shards, offset,
//            length, workers, version, samples_applied, optimizer steps, optimizer buffers,
//            the mode's kept floats (0 or length), its two kept integers, staleness buckets
//            per worker, config fingerprint, body bytes, checksum, 0 (reserved), then zeros
//   body     clocks (workers x int64), lost (workers x int64, 0/1), θ (length x float32),
//            each optimizer buffer (length x float32), the mode's kept buffer (its floats),
//            staleness histograms (workers x buckets x int64)
// The checksum (wire::Checksum) covers the whole file, header included, with its own word read
// as zero: any flipped byte is refused, never resumed from.
// Formats 1 and 2 are read too: their checksum covers the body only (format 1: the kept
// integers were bsp's acc_samples and acc_empty).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace pslab {

struct ShardCheckpoint {
  int shard = 0, num_shards = 1;
  std::uint64_t offset = 0, length = 0;  // the shard's range of θ (floats)
  std::uint64_t config_hash = 0;         // config_fingerprint() of the run that wrote it
  long version = 0, samples_applied = 0;
  std::vector<long> clocks;  // per worker: pushes applied (or accumulated)
  std::vector<char> lost;    // per worker: 1 = dropped as lost
  std::vector<float> theta;  // length floats
  long optimizer_steps = 0;
  std::vector<std::vector<float>> optimizer;  // Optimizer::state()
  std::vector<float> kept;                    // what the shard keeps for the mode (bsp: the open clock's sum), or empty
  std::array<long, 2> kept_counts{};          // the integers it keeps for the mode (bsp: the sum's samples and pushes)
  std::vector<std::vector<long>> staleness;  // per worker, histogram
};

// The file's bytes for `c` (header and body), and back. decode_checkpoint checks the magic, the
// format, the sizes against `n` and the checksum; it throws std::runtime_error
// "checkpoint NAME: what is wrong".
std::vector<char> encode_checkpoint(const ShardCheckpoint& c);
ShardCheckpoint decode_checkpoint(const char* data, std::size_t n, const std::string& name);
// What a format-3 file of these bytes must hold in its checksum word (n >= the header's size).
std::uint64_t checkpoint_checksum(const char* data, std::size_t n);
// The byte offset of the checksum word, for tests and the fuzzer.
inline constexpr std::size_t kCheckpointChecksumAt = 17 * 8;

// Writes `c` to `path` atomically (path + ".tmp", fsync, rename). Throws std::runtime_error
// naming the path and the system's reason.
void write_checkpoint(const std::string& path, const ShardCheckpoint& c);
// Reads and checks a checkpoint (decode_checkpoint). Throws std::runtime_error naming the path and what is wrong.
ShardCheckpoint read_checkpoint(const std::string& path);

}  // namespace pslab
