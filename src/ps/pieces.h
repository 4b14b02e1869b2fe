// How a shard's pushes and pull replies travel in pieces (cluster.piece_kib): consecutive
// pieces of at least `per` floats, at most kMaxPieces of them (a larger shard gets larger
// pieces: each message and each piece's pass has a fixed cost, and a large piece is still split
// over the server's threads), the last one shorter; sent back to back so that the wire carries
// one piece while each end makes its memory pass over another (checksum, update, copy into θ).
// A shard of at most one piece, and any push in a codec other than dense f32, travels whole.
// Worker and server cut a shard the same way from the run's config.
//
// Piece sizes are multiples of 16 floats (whole 64-byte lines), so that the checksums of
// consecutive pieces append into the checksum of the whole (wire::Checksum::append).
#pragma once

#include <algorithm>
#include <cstddef>

namespace pslab {

struct Pieces {
  static constexpr std::size_t kMaxPieces = 8;
  std::size_t per = 0;  // floats per piece at least (a multiple of 16); 0: shards travel whole

  // cluster.piece_kib: KiB per piece, rounded down to whole 64-byte lines; 0 (or less than a
  // line): whole shards.
  static Pieces of_kib(long kib) { return Pieces{kib > 0 ? std::size_t(kib) * 1024 / 64 * 16 : 0}; }
  // Floats per piece of a shard of `length` floats.
  std::size_t per_piece(std::size_t length) const {
    const std::size_t spread = (length + kMaxPieces - 1) / kMaxPieces;
    return std::max(per, (spread + 15) / 16 * 16);
  }
  // Pieces of a shard of `length` floats (1: whole).
  std::size_t count(std::size_t length) const {
    if (per == 0 || length <= per) return 1;
    const std::size_t p = per_piece(length);
    return (length + p - 1) / p;
  }
  // Piece q of a shard of `length` floats: its first float (relative to the shard) and its size.
  std::size_t begin(std::size_t length, std::size_t q) const {
    return count(length) == 1 ? 0 : std::min(length, q * per_piece(length));
  }
  std::size_t size(std::size_t length, std::size_t q) const {
    return count(length) == 1 ? length : std::min(length, (q + 1) * per_piece(length)) - begin(length, q);
  }
};

}  // namespace pslab
