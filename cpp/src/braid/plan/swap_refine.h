// Local search after an equal-count partition: swaps between the costliest and the
// cheapest bin.
//
// Karmarkar-Karp and greedy LPT leave a partition whose costliest bin can often be
// lowered by exchanging one of its items for a cheaper one of the cheapest bin: the
// exchange keeps every bin's item count (a micro-batch has a fixed shape) and, when the
// cost it shifts lies strictly between 0 and the gap, lowers the larger of the two. The
// planner applies it to sequences after balancing (docs/planner.md), so only which rank
// holds a sequence changes, never the sequences of a step. The planner runs it after KK
// and greedy, over ranks, with at most dp swaps.
// Thread-safe: a pure function.
#pragma once

#include <cstdint>
#include <vector>

namespace braid {

/// Repeatedly swaps one item of the costliest bin for one of the cheapest bin, choosing
/// the pair whose cost difference is nearest half the gap between the two bins (strictly
/// between 0 and the gap), until no such pair exists or `max_swaps` swaps were made.
/// Deterministic: the costliest / cheapest bin is the first (lowest index) of equal ones;
/// among equally good pairs the first found (bin order). Returns the number of swaps.
/// REQUIRES: every index in `bins` is a valid index into `costs`.
int64_t SwapBetweenExtremeBins(const std::vector<double>& costs,
                               std::vector<std::vector<int32_t>>* bins, int64_t max_swaps);

}  // namespace braid
