// Local search after an equal-count partition: swaps that lower the costliest bin.
//
// Karmarkar-Karp and greedy LPT leave a partition whose costliest bin can often be
// lowered by exchanging one of its items for a cheaper one of another bin: the exchange
// keeps every bin's item count (a micro-batch has a fixed shape) and, when the cost it
// shifts lies strictly between 0 and the gap between the two bins, lowers the larger of
// the two. The cheapest bin often has no such pair while a slightly dearer one does, so
// partners are tried from the cheapest bin up. The planner applies it to sequences after
// balancing (docs/planner.md), so only which rank holds a sequence changes, never the
// sequences of a step. The planner runs it after KK and greedy, over ranks, with at most
// dp swaps and kSwapPairBudget item pairs compared (about 1 ms at dp=1024).
// Thread-safe: a pure function.
#pragma once

#include <cstdint>
#include <vector>

namespace braid {

/// Item pairs (and bins looked at) SwapBetweenExtremeBins compares at most by default:
/// about 1 ms at dp=1024 ranks of 8 sequences on the 2-core VM (swap_refine_benchmark),
/// and more than a whole search needs at dp=64.
inline constexpr int64_t kSwapPairBudget = int64_t{1} << 18;

/// Repeatedly swaps one item of the costliest bin for one of another bin, the first bin
/// in order of increasing sum that has a pair whose cost difference lies strictly between
/// 0 and the two bins' gap, choosing among its pairs the difference nearest half the gap;
/// until no bin has such a pair, `max_swaps` swaps were made, or `max_pairs` item pairs
/// were compared. Deterministic: the costliest bin is the first (lowest index) of equal
/// ones, bins of equal sum are tried in index order, and among equally good pairs the
/// first found. Never raises the largest sum. Returns the number of swaps.
/// REQUIRES: every index in `bins` is a valid index into `costs`.
int64_t SwapBetweenExtremeBins(const std::vector<double>& costs,
                               std::vector<std::vector<int32_t>>* bins, int64_t max_swaps,
                               int64_t max_pairs = kSwapPairBudget);

}  // namespace braid
