#include "braid/plan/balance.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "braid/util/rng_internal.h"

namespace braid {
namespace {

using ::testing::ElementsAre;

constexpr BalanceAlgorithm kAllAlgorithms[] = {
    BalanceAlgorithm::kKarmarkarKarp, BalanceAlgorithm::kGreedy, BalanceAlgorithm::kNone};

// Costs of packed sequences with long-tail document lengths: attention cost L^2 of a
// lognormal length, so a few items dominate.
std::vector<double> LongTailCosts(int64_t n, uint64_t seed) {
  internal::Rng rng(seed);
  std::vector<double> costs(static_cast<size_t>(n));
  for (auto& c : costs) {
    const double u1 = std::max(rng.Uniform(), 1e-12), u2 = rng.Uniform();
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2);
    const double len = std::clamp(std::round(500.0 * std::exp(1.2 * z)), 1.0, 16384.0);
    c = len * len;
  }
  return costs;
}

// Costs of S packed sequences, as the planner balances them: lognormal document lengths
// (median 600, sigma 1.2, at most 4*L) packed in order into sequences of exactly L tokens;
// a sequence costs sum(attn*len^2 + linear*len) over its pieces.
std::vector<double> PackedSequenceCosts(int64_t n, uint64_t seed, double linear,
                                        int64_t seq_len = 4096) {
  internal::Rng rng(seed);
  std::vector<double> costs;
  int64_t filled = 0;
  double cost = 0;
  while (int64_t(costs.size()) < n) {
    const double u1 = std::max(rng.Uniform(), 1e-12), u2 = rng.Uniform();
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2);
    int64_t len = std::clamp<int64_t>(std::llround(600.0 * std::exp(1.2 * z)), 1, 4 * seq_len);
    while (len > 0 && int64_t(costs.size()) < n) {
      const int64_t take = std::min(len, seq_len - filled);
      cost += double(take) * double(take) + linear * double(take);
      filled += take;
      len -= take;
      if (filled == seq_len) {
        costs.push_back(cost);
        cost = 0;
        filled = 0;
      }
    }
  }
  return costs;
}

std::vector<double> UniformCosts(int64_t n, uint64_t seed) {
  internal::Rng rng(seed);
  std::vector<double> costs(static_cast<size_t>(n));
  for (auto& c : costs) c = static_cast<double>(1 + rng.Below(1000));
  return costs;
}

double MaxBinSum(const std::vector<double>& costs,
                 const std::vector<std::vector<int32_t>>& bins) {
  double worst = 0;
  for (const auto& bin : bins) {
    double sum = 0;
    for (int32_t i : bin) sum += costs[size_t(i)];
    worst = std::max(worst, sum);
  }
  return worst;
}

// The smallest possible largest bin sum over all partitions into `m` bins of n/m items.
double BruteForceOptimum(const std::vector<double>& costs, int64_t m) {
  const size_t n = costs.size();
  const size_t per_bin = n / size_t(m);
  std::vector<double> sums(size_t(m), 0.0);
  std::vector<size_t> counts(size_t(m), 0);
  double best = std::numeric_limits<double>::infinity();
  std::function<void(size_t)> assign = [&](size_t item) {
    if (item == n) {
      best = std::min(best, *std::max_element(sums.begin(), sums.end()));
      return;
    }
    bool tried_empty = false;  // bins are interchangeable: try one empty bin only
    for (size_t b = 0; b < size_t(m); ++b) {
      if (counts[b] == per_bin) continue;
      if (counts[b] == 0) {
        if (tried_empty) continue;
        tried_empty = true;
      }
      if (sums[b] + costs[item] >= best) continue;  // cannot improve
      sums[b] += costs[item];
      ++counts[b];
      assign(item + 1);
      sums[b] -= costs[item];
      --counts[b];
    }
  };
  assign(0);
  return best;
}

void ExpectEqualCountPartition(const std::vector<std::vector<int32_t>>& bins, size_t n,
                               int64_t m, BalanceAlgorithm algorithm) {
  ASSERT_EQ(bins.size(), size_t(m)) << ToString(algorithm);
  std::vector<int> seen(n, 0);
  for (const auto& bin : bins) {
    EXPECT_EQ(bin.size(), n / size_t(m)) << ToString(algorithm);
    EXPECT_TRUE(std::is_sorted(bin.begin(), bin.end())) << ToString(algorithm);
    for (int32_t i : bin) {
      ASSERT_GE(i, 0);
      ASSERT_LT(size_t(i), n);
      ++seen[size_t(i)];
    }
  }
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << ToString(algorithm) << " item " << i;
}

// ---------------------------------------------------------------------------
// Small instances: Karmarkar-Karp against the brute-force optimum.

struct SmallCase {
  int64_t items;
  int64_t bins;
};

class KarmarkarKarpVsOptimumTest : public ::testing::TestWithParam<SmallCase> {};

TEST_P(KarmarkarKarpVsOptimumTest, CloseToOptimalOnSmallInstances) {
  const auto [n, m] = GetParam();
  constexpr int kInstances = 60;
  int optimal = 0;
  double worst_ratio = 1.0, sum_ratio = 0;
  for (int k = 0; k < kInstances; ++k) {
    const uint64_t seed = internal::DeriveSeed({uint64_t(n), uint64_t(m), uint64_t(k)});
    // Alternate the two cost shapes: uniform integers and long-tail attention costs.
    const auto costs = k % 2 == 0 ? UniformCosts(n, seed) : LongTailCosts(n, seed);
    const auto bins = PartitionEqualCount(costs, m, BalanceAlgorithm::kKarmarkarKarp);
    ExpectEqualCountPartition(bins, size_t(n), m, BalanceAlgorithm::kKarmarkarKarp);
    const double kk = MaxBinSum(costs, bins);
    const double opt = BruteForceOptimum(costs, m);
    ASSERT_GE(kk, opt * (1 - 1e-12)) << "brute force missed a better partition";
    const double ratio = kk / opt;
    EXPECT_LE(ratio, 1.05) << "n=" << n << " m=" << m << " instance " << k;
    worst_ratio = std::max(worst_ratio, ratio);
    sum_ratio += ratio;
    if (ratio <= 1 + 1e-12) ++optimal;
  }
  const double fraction = static_cast<double>(optimal) / kInstances;
  std::printf("[ KK vs brute force ] n=%lld m=%lld: optimal on %d/%d (%.0f%%), "
              "mean ratio %.4f, worst %.4f\n",
              static_cast<long long>(n), static_cast<long long>(m), optimal, kInstances,
              100 * fraction, sum_ratio / kInstances, worst_ratio);
  EXPECT_GE(fraction, 0.5) << "KK should find the optimum on most small instances";
}

INSTANTIATE_TEST_SUITE_P(Sizes, KarmarkarKarpVsOptimumTest,
                         ::testing::Values(SmallCase{8, 2}, SmallCase{10, 2},
                                           SmallCase{12, 2}, SmallCase{9, 3},
                                           SmallCase{12, 3}, SmallCase{8, 4},
                                           SmallCase{12, 4}),
                         [](const auto& info) {
                           return "n" + std::to_string(info.param.items) + "_m" +
                                  std::to_string(info.param.bins);
                         });

// ---------------------------------------------------------------------------
// Bin-count sweeps: KK against LPT, partition validity, determinism.

class BalanceByBinsTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(BalanceByBinsTest, KarmarkarKarpBeatsGreedyOnLongTailCosts) {
  const int64_t m = GetParam();
  constexpr int kInstances = 200;
  const int64_t n = 8 * m;  // 8 sequences per rank, as with 8 micro-batches of one
  double kk_sum = 0, lpt_sum = 0, none_sum = 0;
  int kk_better_or_equal = 0;
  for (int k = 0; k < kInstances; ++k) {
    const auto costs = LongTailCosts(n, internal::DeriveSeed({0xb41, uint64_t(m), uint64_t(k)}));
    const double kk =
        Imbalance(costs, PartitionEqualCount(costs, m, BalanceAlgorithm::kKarmarkarKarp));
    const double lpt =
        Imbalance(costs, PartitionEqualCount(costs, m, BalanceAlgorithm::kGreedy));
    const double none =
        Imbalance(costs, PartitionEqualCount(costs, m, BalanceAlgorithm::kNone));
    kk_sum += kk;
    lpt_sum += lpt;
    none_sum += none;
    if (kk <= lpt + 1e-12) ++kk_better_or_equal;
  }
  const double kk_mean = kk_sum / kInstances, lpt_mean = lpt_sum / kInstances,
               none_mean = none_sum / kInstances;
  std::printf("[ KK vs LPT ] m=%lld n=%lld over %d instances: mean max/mean  KK %.4f  "
              "LPT %.4f  none %.4f; KK <= LPT on %d\n",
              static_cast<long long>(m), static_cast<long long>(n), kInstances, kk_mean,
              lpt_mean, none_mean, kk_better_or_equal);
  EXPECT_LE(kk_mean, lpt_mean);
  EXPECT_LT(kk_mean, none_mean);
}

TEST_P(BalanceByBinsTest, EveryItemOnceWithEqualCounts) {
  const int64_t m = GetParam();
  for (int64_t per_bin : {1, 2, 5, 16}) {
    const int64_t n = per_bin * m;
    for (int k = 0; k < 5; ++k) {
      const auto costs = k % 2 ? LongTailCosts(n, uint64_t(k) * 31 + uint64_t(n))
                               : UniformCosts(n, uint64_t(k) * 17 + uint64_t(n));
      for (BalanceAlgorithm algorithm : kAllAlgorithms) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " m=" << m << " k=" << k);
        ExpectEqualCountPartition(PartitionEqualCount(costs, m, algorithm), size_t(n), m,
                                  algorithm);
      }
    }
  }
}

TEST_P(BalanceByBinsTest, EqualCostsAndZeroCostsStillPartition) {
  const int64_t m = GetParam();
  const int64_t n = 4 * m;
  for (double value : {0.0, 7.0}) {
    const std::vector<double> costs(size_t(n), value);
    for (BalanceAlgorithm algorithm : kAllAlgorithms) {
      const auto bins = PartitionEqualCount(costs, m, algorithm);
      ExpectEqualCountPartition(bins, size_t(n), m, algorithm);
      EXPECT_DOUBLE_EQ(Imbalance(costs, bins), 1.0) << ToString(algorithm);
    }
  }
}

TEST_P(BalanceByBinsTest, NonePutsConsecutiveItemsInEachBin) {
  const int64_t m = GetParam();
  const int64_t per_bin = 3;
  const auto costs = LongTailCosts(per_bin * m, 99);
  const auto bins = PartitionEqualCount(costs, m, BalanceAlgorithm::kNone);
  ASSERT_EQ(bins.size(), size_t(m));
  for (int64_t b = 0; b < m; ++b) {
    std::vector<int32_t> expected(static_cast<size_t>(per_bin));
    std::iota(expected.begin(), expected.end(), static_cast<int32_t>(b * per_bin));
    EXPECT_EQ(bins[size_t(b)], expected) << "bin " << b;
  }
}

TEST_P(BalanceByBinsTest, DeterministicForEqualInputs) {
  const int64_t m = GetParam();
  const auto costs = LongTailCosts(6 * m, 4242);
  // Ties: many equal costs exercise the tie-breaking.
  std::vector<double> ties(size_t(6 * m));
  for (size_t i = 0; i < ties.size(); ++i) ties[i] = double(i % 3);
  for (const std::vector<double>* c :
       std::vector<const std::vector<double>*>{&costs, &ties}) {
    for (BalanceAlgorithm algorithm : kAllAlgorithms) {
      const auto first = PartitionEqualCount(*c, m, algorithm);
      for (int rep = 0; rep < 3; ++rep) {
        EXPECT_EQ(PartitionEqualCount(*c, m, algorithm), first) << ToString(algorithm);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Bins, BalanceByBinsTest, ::testing::Values(1, 2, 3, 4, 8, 16),
                         [](const auto& info) { return "m" + std::to_string(info.param); });

// ---------------------------------------------------------------------------

TEST(BalanceTest, OneBinHoldsEverything) {
  const std::vector<double> costs{5, 1, 3};
  for (BalanceAlgorithm algorithm : kAllAlgorithms) {
    EXPECT_THAT(PartitionEqualCount(costs, 1, algorithm), ElementsAre(ElementsAre(0, 1, 2)))
        << ToString(algorithm);
  }
}

TEST(BalanceTest, KarmarkarKarpSolvesAKnownInstance) {
  // {8,7,6,5,4,3,2,1} in 2 bins of 4: total 36, a perfect split of 18 exists.
  const std::vector<double> costs{8, 7, 6, 5, 4, 3, 2, 1};
  const auto bins = PartitionEqualCount(costs, 2, BalanceAlgorithm::kKarmarkarKarp);
  EXPECT_DOUBLE_EQ(MaxBinSum(costs, bins), 18.0);
  EXPECT_DOUBLE_EQ(Imbalance(costs, bins), 1.0);
}

TEST(BalanceTest, ImbalanceIsMaxOverMean) {
  const std::vector<double> costs{1, 2, 3, 6};
  EXPECT_DOUBLE_EQ(Imbalance(costs, {{0, 1}, {2, 3}}), 9.0 / 6.0);
  EXPECT_DOUBLE_EQ(Imbalance(costs, {{0, 3}, {1, 2}}), 7.0 / 6.0);
  EXPECT_DOUBLE_EQ(Imbalance(costs, {}), 1.0);
  EXPECT_DOUBLE_EQ(Imbalance({0, 0}, {{0}, {1}}), 1.0);
}

TEST(BalanceTest, GreedyRespectsCountsWhereUnconstrainedLptWouldNot) {
  // Unconstrained LPT would give the 100 its own bin and the other three items to bin 2.
  const std::vector<double> costs{100, 1, 1, 1};
  const auto bins = PartitionEqualCount(costs, 2, BalanceAlgorithm::kGreedy);
  ExpectEqualCountPartition(bins, costs.size(), 2, BalanceAlgorithm::kGreedy);
  EXPECT_DOUBLE_EQ(MaxBinSum(costs, bins), 101.0);
}

}  // namespace
}  // namespace braid
