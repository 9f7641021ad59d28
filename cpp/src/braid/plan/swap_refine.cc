#include "braid/plan/swap_refine.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace braid {

int64_t SwapBetweenExtremeBins(const std::vector<double>& costs,
                               std::vector<std::vector<int32_t>>* bins, int64_t max_swaps,
                               int64_t max_pairs) {
  const size_t m = bins->size();
  if (m < 2) return 0;
  std::vector<double> sums(m, 0.0);
  for (size_t b = 0; b < m; ++b) {
    for (int32_t i : (*bins)[b]) sums[b] += costs[size_t(i)];
  }
  // Bins by (sum, index), sorted: the costliest is the last, partners are tried from the
  // first. A swap moves its two bins to their new places.
  using Entry = std::pair<double, size_t>;
  std::vector<Entry> order;
  for (size_t b = 0; b < m; ++b) order.emplace_back(sums[b], b);
  std::sort(order.begin(), order.end());
  auto move = [&order](Entry from, Entry to) {
    order.erase(std::lower_bound(order.begin(), order.end(), from));
    order.insert(std::lower_bound(order.begin(), order.end(), to), to);
  };
  // Each bin's cheapest and costliest item: a partner whose items are all dearer than
  // the costliest bin's, or cheaper by the gap or more, has no improving pair.
  std::vector<double> lo_item(m), hi_item(m);
  auto span = [&](size_t b) {
    lo_item[b] = hi_item[b] = (*bins)[b].empty() ? 0.0 : costs[size_t((*bins)[b][0])];
    for (int32_t i : (*bins)[b]) {
      lo_item[b] = std::min(lo_item[b], costs[size_t(i)]);
      hi_item[b] = std::max(hi_item[b], costs[size_t(i)]);
    }
  };
  for (size_t b = 0; b < m; ++b) span(b);
  int64_t swaps = 0;
  int64_t budget = max_pairs;
  while (swaps < max_swaps && budget > 0) {
    // The costliest bin: the lowest index among equal sums.
    const double top = order.back().first;
    const size_t hi =
        std::lower_bound(order.begin(), order.end(), Entry{top, 0})->second;
    auto& a = (*bins)[hi];
    bool swapped = false;
    for (size_t p = 0; p < m && order[p].first < top && budget > 0; ++p) {
      const size_t lo = order[p].second;
      --budget;  // a bin looked at counts as a pair compared
      const double gap = top - sums[lo];
      if (hi_item[hi] <= lo_item[lo] || lo_item[hi] - hi_item[lo] >= gap) continue;
      // The pair whose difference d is nearest gap / 2 with 0 < d < gap: afterwards the
      // pair's larger sum is max(top - d, sums[lo] + d) < top.
      auto& b = (*bins)[lo];
      budget -= static_cast<int64_t>(a.size() * b.size());
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
      if (best_a == a.size()) continue;  // no improving pair: the next cheapest bin
      const double d = costs[size_t(a[best_a])] - costs[size_t(b[best_b])];
      std::swap(a[best_a], b[best_b]);
      move({sums[hi], hi}, {sums[hi] - d, hi});
      move({sums[lo], lo}, {sums[lo] + d, lo});
      sums[hi] -= d;
      sums[lo] += d;
      span(hi);
      span(lo);
      ++swaps;
      swapped = true;
      break;
    }
    if (!swapped) break;
  }
  return swaps;
}

}  // namespace braid
