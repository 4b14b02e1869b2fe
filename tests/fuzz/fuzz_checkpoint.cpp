// libFuzzer target: the checkpoint reader (ps/checkpoint.h) on arbitrary bytes, built like
// fuzz_wire (tests/CMakeLists.txt) and run for a bounded time from tests/fuzz/corpus/checkpoint/.
// Each input is read twice: as it is (almost always refused at the checksum), and with its
// checksum word set to what its bytes need, so that the fuzzer reaches the header's sizes and
// the body. Properties, besides no crash, leak, undefined behaviour or huge allocation:
//   - a refused file always says so as "checkpoint NAME: why";
//   - a file that is read encodes to bytes that read back to the same encoding.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "ps/checkpoint.h"

using namespace pslab;

namespace {

void read_and_reencode(const char* data, std::size_t size) {
  ShardCheckpoint c;
  try {
    c = decode_checkpoint(data, size, "fuzz.ckpt");
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).rfind("checkpoint fuzz.ckpt: ", 0) != 0) __builtin_trap();
    return;
  }
  const std::vector<char> once = encode_checkpoint(c);
  const std::vector<char> twice = encode_checkpoint(decode_checkpoint(once.data(), once.size(), "again.ckpt"));
  if (once != twice) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const char* bytes = reinterpret_cast<const char*>(data);
  read_and_reencode(bytes, size);
  if (size >= kCheckpointChecksumAt + 8) {
    std::vector<char> fixed(bytes, bytes + size);
    const std::uint64_t sum = checkpoint_checksum(fixed.data(), fixed.size());
    std::memcpy(fixed.data() + kCheckpointChecksumAt, &sum, 8);
    read_and_reencode(fixed.data(), fixed.size());
  }
  return 0;
}
