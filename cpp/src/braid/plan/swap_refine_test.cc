#include "braid/plan/swap_refine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "braid/plan/balance.h"

namespace braid {
namespace {

using ::testing::ElementsAre;

double MaxSum(const std::vector<double>& costs, const std::vector<std::vector<int32_t>>& bins) {
  double best = 0;
  for (const auto& bin : bins) {
    double s = 0;
    for (int32_t i : bin) s += costs[size_t(i)];
    best = std::max(best, s);
  }
  return best;
}

TEST(SwapBetweenExtremeBinsTest, SwapsThePairNearestHalfTheGap) {
  const std::vector<double> costs = {10, 6, 5, 1};
  std::vector<std::vector<int32_t>> bins = {{0, 1}, {2, 3}};  // 16 vs 6
  EXPECT_EQ(SwapBetweenExtremeBins(costs, &bins, /*max_swaps=*/10), 1);
  EXPECT_THAT(bins[0], ElementsAre(2, 1));  // 5 + 6 = 11
  EXPECT_THAT(bins[1], ElementsAre(0, 3));  // 10 + 1 = 11
  // No pair shifts a cost strictly inside the gap: nothing changes.
  std::vector<std::vector<int32_t>> stuck = {{0, 3}, {2, 1}};  // 11 vs 11
  EXPECT_EQ(SwapBetweenExtremeBins(costs, &stuck, 10), 0);
  std::vector<std::vector<int32_t>> wide = {{0, 3}, {1, 2}};  // 11 vs 11: equal
  EXPECT_EQ(SwapBetweenExtremeBins(costs, &wide, 10), 0);
  std::vector<std::vector<int32_t>> capped = {{0, 1}, {2, 3}};
  EXPECT_EQ(SwapBetweenExtremeBins(costs, &capped, 0), 0);
  EXPECT_THAT(capped[0], ElementsAre(0, 1));
}

TEST(SwapBetweenExtremeBinsTest, TriesDearerPartnersWhenTheCheapestHasNoPair) {
  const std::vector<double> costs = {19, 2, 16, 13, 12, 13};
  // 21, 29, 25: against the cheapest bin (gap 8) every shift is 14, 11 or negative; the
  // middle bin (gap 4) takes 16 for 13 (a shift of 3, as near half the gap as 1).
  std::vector<std::vector<int32_t>> bins = {{0, 1}, {2, 3}, {4, 5}};
  EXPECT_EQ(SwapBetweenExtremeBins(costs, &bins, /*max_swaps=*/1), 1);
  EXPECT_THAT(bins[0], ElementsAre(0, 1));  // 21
  EXPECT_THAT(bins[1], ElementsAre(5, 3));  // 26
  EXPECT_THAT(bins[2], ElementsAre(4, 2));  // 28
  // The pair budget bounds the work: none, no swap.
  std::vector<std::vector<int32_t>> unbudgeted = {{0, 1}, {2, 3}, {4, 5}};
  EXPECT_EQ(SwapBetweenExtremeBins(costs, &unbudgeted, 10, /*max_pairs=*/0), 0);
  EXPECT_THAT(unbudgeted[1], ElementsAre(2, 3));
}

// On seeded long-tail instances after Karmarkar-Karp and greedy: the same items, the same
// count per bin, a largest bin never higher and on average lower.
TEST(SwapBetweenExtremeBinsTest, NeverRaisesTheMaximumAndKeepsCounts) {
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> len(6.0, 1.2);
  double before_total = 0, after_total = 0;
  for (int instance = 0; instance < 200; ++instance) {
    const int64_t m = 2 + instance % 30;
    const int64_t k = 1 + instance % 8;
    std::vector<double> costs(size_t(m * k));
    for (double& c : costs) {
      const double l = std::min(len(rng), 4096.0);
      c = l * l + 64 * l;
    }
    for (auto algorithm : {BalanceAlgorithm::kKarmarkarKarp, BalanceAlgorithm::kGreedy}) {
      auto bins = PartitionEqualCount(costs, m, algorithm);
      const double before = MaxSum(costs, bins);
      SwapBetweenExtremeBins(costs, &bins, /*max_swaps=*/4 * m);
      const double after = MaxSum(costs, bins);
      EXPECT_LE(after, before * (1 + 1e-12));
      std::vector<int32_t> all;
      for (const auto& bin : bins) {
        EXPECT_EQ(int64_t(bin.size()), k);
        all.insert(all.end(), bin.begin(), bin.end());
      }
      std::sort(all.begin(), all.end());
      for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], int32_t(i));
      before_total += before;
      after_total += after;
    }
  }
  EXPECT_LT(after_total, before_total);
}

}  // namespace
}  // namespace braid
