// libFuzzer target: the wire's decoder and checksum (comm/wire.h) on arbitrary bytes, built
// with clang -fsanitize=fuzzer,address,undefined (tests/CMakeLists.txt) and run for a bounded
// time by CTest from the seed corpus in tests/fuzz/corpus/wire/ (tests/fuzz/run.sh).
// Properties, besides no crash, leak or undefined behaviour:
//   - a refused header always says why;
//   - a header that decodes encodes again to bytes that decode to the same encoding;
//   - the checksum computed in two pieces, split anywhere, equals the one-shot checksum.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/wire.h"

using namespace pslab;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string why;
  const auto h = wire::decode(data, size, why);
  if (!h && why.empty()) __builtin_trap();
  if (h) {
    wire::Encoder enc;
    const auto first = enc.encode(*h);
    const std::vector<std::byte> once(first.begin(), first.end());
    std::string why2;
    const auto again = wire::decode(once.data(), once.size(), why2);
    if (!again) __builtin_trap();
    const auto second = enc.encode(*again);
    if (second.size() != once.size() || !std::equal(second.begin(), second.end(), once.begin())) __builtin_trap();
  }
  const std::size_t cut = size ? data[0] % (size + 1) : 0;
  wire::Checksum pieces;
  pieces.update_bytes(data, cut);
  pieces.update_bytes(data + cut, size - cut);
  if (pieces.value() != wire::checksum_bytes(data, size)) __builtin_trap();
  return 0;
}
