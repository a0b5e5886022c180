#pragma once
// The attention mask as a predicate on positions, and its block form used to skip tiles.
//
// A key at position pk is visible to a query at position pq (same sequence) iff
//   pq - left <= pk <= pq + right        (left/right = -1: that side is unbounded)
//
//   causal (left = -1, right = 0)      sliding window left = 2, right = 0     left = 1, right = 1
//          k 0 1 2 3 4                        k 0 1 2 3 4                          k 0 1 2 3 4
//     q 0    x . . . .                   q 0    x . . . .                     q 0    x x . . .
//       1    x x . . .                     1    x x . . .                       1    x x x . .
//       2    x x x . .                     2    x x x . .                       2    . x x x .
//       3    x x x x .                     3    . x x x .                       3    . . x x x
//       4    x x x x x                     4    . . x x x                       4    . . . x x
//
// Position offsets shift the picture: q positions 4..7 against kv positions 0..3 under causal give a
// full tile (every key precedes every query); equal offsets give the diagonal tile above.
#include <algorithm>
#include <cstdint>

#include "attention/spec.h"

namespace cpf {

inline bool position_visible(int64_t pq, int64_t pk, const AttentionWindow& window) {
  return (window.right < 0 || pk <= pq + window.right) && (window.left < 0 || pk >= pq - window.left);
}

// Smallest and largest position inside a block of tokens.
struct PositionRange {
  int64_t min = 0;
  int64_t max = 0;
};

inline PositionRange position_range(const int64_t* positions, int64_t count) {
  const auto [lo, hi] = std::minmax_element(positions, positions + count);
  return {*lo, *hi};
}

enum class TileKind : uint8_t {
  empty,    // no query of the block sees any key of the block: skipped
  partial,  // some pairs visible: masked element by element
  full,     // every pair visible: no masking needed
};

// Exact for blocks whose positions increase; with arbitrary positions `empty` and `full` are still
// never wrong (a tile the ranges cannot decide is `partial` and masked element by element).
inline TileKind classify_tile(PositionRange q, PositionRange k, const AttentionWindow& window) {
  const bool after_window = window.right >= 0 && k.min > q.max + window.right;
  const bool before_window = window.left >= 0 && k.max < q.min - window.left;
  if (after_window || before_window) return TileKind::empty;
  const bool right_ok = window.right < 0 || k.max <= q.min + window.right;
  const bool left_ok = window.left < 0 || k.min >= q.max - window.left;
  return right_ok && left_ok ? TileKind::full : TileKind::partial;
}

}  // namespace cpf
