// The token-slack lever's second half: evening the ranks' costs by moving whole document
// pieces between their sequences.
//
// With `balance.slack` the planner packs each sequence short of seq_len
// (docs/planner.md), balances the sequences over the ranks, and then calls
// MovePiecesBetweenBins: the costliest rank moves one piece to a cheaper rank that has room
// for it, or swaps one of its pieces for a cheaper one there, until no single exchange
// lowers the pair's larger cost. Pieces are never cut, so the documents and pieces of a
// step are what packing made (independent of dp); only which sequence holds a piece
// changes.
// Thread-safe: a pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "braid/config/config.h"
#include "braid/plan/step_plan.h"

namespace braid {

/// Tokens each sequence is packed to: seq_len less round(slack * seq_len), at least 1.
inline int64_t FillTokens(const BalanceConfig& b, int64_t seq_len) {
  const auto slack = static_cast<int64_t>(b.slack * static_cast<double>(seq_len) + 0.5);
  return seq_len - slack > 0 ? seq_len - slack : 1;
}

/// Moves whole pieces between the sequences of different bins (`bins[r]` holds the
/// indices of rank r's sequences) to even the bins' summed costs, never taking a sequence
/// past `capacity` tokens and never putting two pieces of one document in one sequence.
/// Each exchange goes from the costliest bin to the cheapest bin that admits one: a piece
/// moved there, or swapped for one of its pieces, whichever shifts the cost nearest half
/// the gap (strictly between 0 and the gap, so the pair's larger cost falls). Moved pieces go to
/// the end of the receiving sequence. Updates the sequences' tokens and cost (summed over
/// their pieces in order). Deterministic: ties go to the lower index, the first found.
/// Returns the number of exchanges. REQUIRES: every index in `bins` is a valid, distinct
/// index into `*sequences`.
int64_t MovePiecesBetweenBins(const BalanceConfig& b, int64_t capacity,
                              const std::vector<std::vector<int32_t>>& bins,
                              std::vector<Sequence>* sequences);

}  // namespace braid
