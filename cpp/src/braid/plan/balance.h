// Equal-count partitioning of weighted items: the balancing step of the planner.
//
// Every DP rank receives the same number of sequences (a micro-batch has a fixed shape),
// so the problem is multi-way number partitioning with a cardinality constraint: split n
// items into m bins of exactly n/m items each, minimizing the largest bin sum.
//
// - kKarmarkarKarp: largest differencing method, multi-way, with equal counts. Items are
//   sorted by cost, cut into n/m tuples of m consecutive items (one item per bin), and the
//   two partial partitions with the largest spread (max bin - min bin) are merged
//   repeatedly, pairing the heaviest bins of one with the lightest of the other.
// - kGreedy: longest processing time first; each item goes to the lightest bin that still
//   has room.
// - kNone: items in order, n/m consecutive items per bin (what per-rank loaders do).
//
// All are deterministic: ties break on item index. Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "braid/config/config.h"

namespace braid {

/// Splits items with `costs` into `num_bins` bins of equal count; returns each bin's item
/// indices in increasing order. REQUIRES: num_bins > 0 and costs.size() % num_bins == 0.
std::vector<std::vector<int32_t>> PartitionEqualCount(const std::vector<double>& costs,
                                                      int64_t num_bins,
                                                      BalanceAlgorithm algorithm);

/// An order of items with the heaviest in the middle and costs falling towards both ends
/// (a "mountain"): the heaviest at position (n-1)/2, then alternately right and left of
/// it. Returns item indices by position. Ties break on item index. Used to order a rank's
/// micro-batches so pipeline warm-up and cool-down see the light ones.
std::vector<int32_t> MiddleHeavyOrder(const std::vector<double>& costs);
/// The same order written into `*order` (its storage reused).
void MiddleHeavyOrder(const std::vector<double>& costs, std::vector<int32_t>* order);

/// max(bin sum) / mean(bin sum) of a partition; 1.0 for an empty or all-zero one.
double Imbalance(const std::vector<double>& costs,
                 const std::vector<std::vector<int32_t>>& bins);

}  // namespace braid
