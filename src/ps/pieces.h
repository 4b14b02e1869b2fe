// How a shard's pushes and pull replies travel in pieces (cluster.piece_kib): consecutive
// pieces of `per` floats, the last one shorter, sent back to back so that the wire carries one
// piece while each end makes its memory pass over another (checksum, update, copy into θ). A
// shard of at most one piece, and any push in a codec other than dense f32, travels whole.
// Worker and server cut a shard the same way from the run's config.
//
// `per` is a multiple of 16 floats (whole 64-byte lines), so that the checksums of consecutive
// pieces append into the checksum of the whole (wire::Checksum::append).
#pragma once

#include <algorithm>
#include <cstddef>

namespace pslab {

struct Pieces {
  std::size_t per = 0;  // floats per piece; 0: shards travel whole

  // cluster.piece_kib: KiB per piece, rounded down to whole 64-byte lines; 0 (or less than a
  // line): whole shards.
  static Pieces of_kib(long kib) { return Pieces{kib > 0 ? std::size_t(kib) * 1024 / 64 * 16 : 0}; }
  // Pieces of a shard of `length` floats (1: whole).
  std::size_t count(std::size_t length) const { return per == 0 || length <= per ? 1 : (length + per - 1) / per; }
  // Piece p of a shard of `length` floats: its first float (relative to the shard) and its size.
  std::size_t begin(std::size_t length, std::size_t p) const { return count(length) == 1 ? 0 : std::min(length, p * per); }
  std::size_t size(std::size_t length, std::size_t p) const {
    return count(length) == 1 ? length : std::min(length, (p + 1) * per) - begin(length, p);
  }
};

}  // namespace pslab
