// Whole-piece packing: the packer of a step whose shares are kept exact over time.
//
// Puts a step's text pieces into its sequences so that as many as possible stay whole,
// by best fit decreasing: pieces in decreasing length (equal lengths in a given order,
// the step's seeded interleave order), each into the sequence with the least room that
// still holds it whole. A piece that no sequence holds whole is cut afterwards into the
// rooms left, the largest room first, so every cut falls where a sequence ends. The
// planner calls it after the draw (planner.h) and before balancing; it never looks at
// dp, so the pieces of a step are the same for any DP size (docs/planner.md).
//
// Thread-compatible: a WholePacker keeps scratch reused from call to call; one thread
// calls Pack at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "braid/status.h"

namespace braid {

/// One part of a packed piece: `len` tokens of piece `piece`, starting `offset` tokens
/// into it, in sequence `sequence`. A piece kept whole is one part with offset 0.
struct PackedPart {
  int32_t piece = 0;
  int32_t sequence = 0;
  int64_t offset = 0;
  int64_t len = 0;
};

class WholePacker {
 public:
  /// Packs pieces of `lens[k]` tokens (each > 0) into sequences with `(*rooms)[s]`
  /// tokens of room each, lowering the rooms by what it puts there. Pieces go in
  /// decreasing length, ties in the order of `order` (a permutation of the piece
  /// indices); a piece lands whole in the sequence with the smallest room that holds it
  /// (the most recently filled of equal rooms; at the start, `first`'s order):
  /// `(*sequence_of)[k]` is that sequence. The pieces no room holds whole, in the same
  /// order, fill the largest rooms: their `(*sequence_of)[k]` is -1 and their parts are
  /// in `*cut` (cleared first), each piece's consecutive and by offset. Rooms left over
  /// are padding. `first` (may be null: 0, 1, ...) orders the sequences among equal rooms
  /// at the start: first[0] is filled first. Deterministic. Fails (a bug in the caller)
  /// when the pieces exceed the rooms. Cost: O(pieces + sequences + longest room / 64).
  Status Pack(const std::vector<int64_t>& lens, const std::vector<int32_t>& order,
              std::vector<int64_t>* rooms, std::vector<int32_t>* sequence_of,
              std::vector<PackedPart>* cut, const std::vector<int32_t>* first = nullptr);

 private:
  // The sequences bucketed by their room: a LIFO list per room size and a two-level
  // bitset over the sizes with a non-empty list.
  void Reset(int64_t max_room, size_t sequences);
  void Push(int32_t sequence, int64_t room);
  int32_t Pop(int64_t room);
  int64_t SmallestAtLeast(int64_t len) const;  // -1: none
  int64_t Largest() const;                     // -1: none

  std::vector<int32_t> head_;  // per room size: the last sequence pushed, -1 none
  std::vector<int32_t> next_;  // per sequence: the one pushed before it in its list
  std::vector<uint64_t> words_;    // bit r: head_[r] != -1
  std::vector<uint64_t> summary_;  // bit w: words_[w] != 0
  std::vector<int32_t> sorted_;    // the pieces, longest first
  std::vector<int32_t> count_;     // counting sort scratch
  std::vector<int32_t> leftover_;  // pieces no room held whole
};

}  // namespace braid
