#include "braid/plan/swap_refine.h"

#include <cmath>

namespace braid {

int64_t SwapBetweenExtremeBins(const std::vector<double>& costs,
                               std::vector<std::vector<int32_t>>* bins, int64_t max_swaps) {
  const size_t m = bins->size();
  if (m < 2) return 0;
  std::vector<double> sums(m, 0.0);
  for (size_t b = 0; b < m; ++b) {
    for (int32_t i : (*bins)[b]) sums[b] += costs[size_t(i)];
  }
  int64_t swaps = 0;
  while (swaps < max_swaps) {
    size_t hi = 0, lo = 0;
    for (size_t b = 1; b < m; ++b) {
      if (sums[b] > sums[hi]) hi = b;
      if (sums[b] < sums[lo]) lo = b;
    }
    const double gap = sums[hi] - sums[lo];
    if (!(gap > 0)) break;
    // The pair whose difference d is nearest gap / 2 with 0 < d < gap: afterwards the
    // pair's larger sum is max(sums[hi] - d, sums[lo] + d) < sums[hi].
    auto& a = (*bins)[hi];
    auto& b = (*bins)[lo];
    size_t best_a = a.size(), best_b = b.size();
    double best = gap / 2;  // |d - gap/2| of the best pair; must beat this
    for (size_t x = 0; x < a.size(); ++x) {
      const double ca = costs[size_t(a[x])];
      for (size_t y = 0; y < b.size(); ++y) {
        const double d = ca - costs[size_t(b[y])];
        if (d <= 0 || d >= gap) continue;
        const double off = std::abs(d - gap / 2);
        if (off < best) {
          best = off;
          best_a = x;
          best_b = y;
        }
      }
    }
    if (best_a == a.size()) break;
    const double d = costs[size_t(a[best_a])] - costs[size_t(b[best_b])];
    std::swap(a[best_a], b[best_b]);
    sums[hi] -= d;
    sums[lo] += d;
    ++swaps;
  }
  return swaps;
}

}  // namespace braid
