// The swap refinement after Karmarkar-Karp at scale: dp ranks of 8 sequences each, costs
// of packed long-tail sequences (attention-heavy: a few whole-sequence documents among
// many packed short ones). Time is per call; the counters give the imbalance (max / mean
// rank cost) after KK alone and after the swaps, and the swaps made.
//
//   BRAID_BUILD_BENCHMARKS=ON scripts/dev-build build/mine
//   build/mine/swap_refine_benchmark
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <vector>

#include "braid/plan/balance.h"
#include "braid/plan/swap_refine.h"

namespace braid {
namespace {

std::vector<double> SequenceCosts(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> len(6.5, 1.3);
  constexpr double kSeq = 4096;
  std::vector<double> costs;
  for (int64_t s = 0; s < n; ++s) {  // documents packed in order until the sequence is full
    double left = kSeq, cost = 0;
    while (left > 0) {
      const double l = std::min(left, std::round(len(rng)) + 1);
      cost += l * l + 64 * l;
      left -= l;
    }
    costs.push_back(cost);
  }
  return costs;
}

void BM_SwapAfterKarmarkarKarp(benchmark::State& state) {
  const int64_t dp = state.range(0);
  const auto costs = SequenceCosts(dp * 8, /*seed=*/7);
  const auto kk = PartitionEqualCount(costs, dp, BalanceAlgorithm::kKarmarkarKarp);
  int64_t swaps = 0;
  std::vector<std::vector<int32_t>> bins;
  for (auto _ : state) {
    state.PauseTiming();
    bins = kk;
    state.ResumeTiming();
    swaps = SwapBetweenExtremeBins(costs, &bins, /*max_swaps=*/dp);
  }
  state.counters["kk_imbalance"] = Imbalance(costs, kk);
  state.counters["imbalance"] = Imbalance(costs, bins);
  state.counters["swaps"] = double(swaps);
}
BENCHMARK(BM_SwapAfterKarmarkarKarp)->Arg(64)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace braid

BENCHMARK_MAIN();
