#include "braid/exec/allocation.h"

#include <gtest/gtest.h>

#include "braid/exec/budget.h"

namespace braid {
namespace {

// Three sources: `cheap` at a constant weight, `costly` rising from 0.1 to 0.5 between
// steps 20 and 30, `late` at 0 until step 40, then 0.2. Lookahead: 2 + 2 + 2 = 6 steps.
Config MakeConfig(bool autoscale = true) {
  const std::string text = R"(
seed: 1
batch: {global_tokens: 4096, seq_len: 1024}
runtime: {threads: 8, autoscale: )" +
                           std::string(autoscale ? "true" : "false") + R"(}
sources:
  - {name: cheap, path: /d/cheap, tokens_column: t, weight: 1}
  - {name: costly, path: /d/costly, tokens_column: t, workers: 1,
     weight: {schedule: [[0, 0.1], [20, 0.1], [30, 0.5]]}}
  - {name: late, path: /d/late, tokens_column: t, workers: 2,
     weight: {steps: [[0, 0], [40, 0.2]]}}
)";
  auto c = ParseConfig(text, "");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

SourceProfile Profile(int64_t samples, int64_t tokens, double cpu_s) {
  SourceProfile p;
  p.samples = samples;
  p.tokens = tokens;
  p.read_cpu_ns = static_cast<int64_t>(cpu_s * 1e9);
  return p;
}

TEST(AllocationTest, ParsesTheSwitch) {
  EXPECT_TRUE(MakeConfig(true).runtime.autoscale);
  EXPECT_FALSE(MakeConfig(false).runtime.autoscale);
  auto bad = ParseConfig(
      "batch: {global_tokens: 8, seq_len: 8}\nruntime: {autoscale: 3}\n"
      "sources: [{name: a, path: /a, tokens_column: t}]\n",
      "");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("runtime.autoscale"), std::string::npos);
}

TEST(AllocationTest, AWeightZeroSourceHoldsNothingUntilItsRiseIsWithinTheLookahead) {
  const Config c = MakeConfig();
  ASSERT_EQ(AllocationLookahead(c), 6);
  const int64_t budget = MemoryBudgetBytes(c);
  for (int64_t step : {0, 20, 33}) {
    const auto shares = AllocateSources(c, step, {}, 8, budget);
    EXPECT_FALSE(shares[2].active) << step;
    EXPECT_EQ(shares[2].workers, 0) << step;
  }
  // Step 34 sees step 40: the source starts reading ahead six steps before it is drawn.
  const auto at34 = AllocateSources(c, 34, {}, 8, budget);
  EXPECT_TRUE(at34[2].active);
  EXPECT_EQ(at34[2].workers, 2);  // its configured workers: nothing measured yet
  EXPECT_GT(at34[2].read_ahead_bytes, 0);
  // The active sources' read-ahead is the budget by their horizon shares.
  const auto at0 = AllocateSources(c, 0, {}, 8, budget);
  EXPECT_NEAR(double(at0[0].read_ahead_bytes) / double(at0[1].read_ahead_bytes),
              (1.0 / 1.1) / (0.1 / 1.1), 1e-3);
}

TEST(AllocationTest, ThreadsFollowMeasuredCostTimesTheHorizonShare) {
  const Config c = MakeConfig();
  const int64_t budget = MemoryBudgetBytes(c);
  // costly: 40x the CPU per token of cheap.
  const std::vector<SourceProfile> profiles = {
      Profile(1000, 1'000'000, 1.0), Profile(1000, 1'000'000, 40.0), SourceProfile{}};
  // Step 0: shares 1/1.1 and 0.1/1.1; demand 0.91 * 1 vs 0.091 * 40 = 3.64: costly gets
  // 8 * 3.64 / 4.55 = 6.4 -> 7 threads, cheap 8 * 0.91 / 4.55 = 1.6 -> 2.
  const auto at0 = AllocateSources(c, 0, profiles, 8, budget);
  EXPECT_EQ(at0[0].workers, 2);
  EXPECT_EQ(at0[1].workers, 7);
  // With equal costs, threads follow the shares, never below the configured workers.
  const std::vector<SourceProfile> equal = {
      Profile(1000, 1'000'000, 1.0), Profile(1000, 1'000'000, 1.0), SourceProfile{}};
  const auto eq = AllocateSources(c, 0, equal, 8, budget);
  EXPECT_EQ(eq[0].workers, 8);
  EXPECT_EQ(eq[1].workers, 1);
  // Too few samples: not measured; an unmeasured source is priced at the measured mean.
  const std::vector<SourceProfile> few = {Profile(1000, 1'000'000, 1.0),
                                          Profile(kMinProfiledSamples - 1, 100, 999.0),
                                          SourceProfile{}};
  const auto f = AllocateSources(c, 0, few, 8, budget);
  EXPECT_EQ(f[0].workers, 8);
  EXPECT_EQ(f[1].workers, 1);
}

TEST(AllocationTest, ScalesUpBeforeAWeightRisesAndDownAfterItFell) {
  const Config c = MakeConfig();
  const int64_t budget = MemoryBudgetBytes(c);
  const std::vector<SourceProfile> profiles = {
      Profile(1000, 1'000'000, 1.0), Profile(1000, 1'000'000, 40.0), SourceProfile{}};
  const auto before = AllocateSources(c, 10, profiles, 8, budget);
  const auto rising = AllocateSources(c, 24, profiles, 8, budget);  // sees step 30
  EXPECT_GT(rising[1].workers, before[1].workers);
  EXPECT_GT(rising[1].read_ahead_bytes, before[1].read_ahead_bytes);
  // The same schedule falling (0.5 until 20, 0.1 from 30): fewer resources after.
  Config down = c;
  for (auto& [step, w] : down.sources[1].weight.points) w = w == 0.1 ? 0.5 : 0.1;
  const auto high = AllocateSources(down, 10, profiles, 8, budget);
  const auto low = AllocateSources(down, 40, profiles, 8, budget);
  EXPECT_LT(low[1].workers, high[1].workers);
  EXPECT_LT(low[1].read_ahead_bytes, high[1].read_ahead_bytes);
}

// Profiles under which `costly` (share 0.1/1.1 at step 0, against cheap's 1/1.1 at unit
// cost) wants `threads` threads of the 8: its cost per token is 10 r / (1 - r), r = want/8.
std::vector<SourceProfile> Wanting(double threads) {
  const double r = threads / 8.0;
  return {Profile(1000, 1'000'000, 1.0), Profile(1000, 1'000'000, 10.0 * r / (1.0 - r)),
          SourceProfile{}};
}

TEST(AllocationTest, MeasuredCostsNearABoundaryDoNotFlipTheWorkers) {
  const Config c = MakeConfig();
  const int64_t budget = MemoryBudgetBytes(c);
  const auto held = AllocateSources(c, 0, Wanting(2.9), 8, budget);
  ASSERT_EQ(held[1].workers, 3);
  // Without the allocation in force, 3.2 threads round up to 4; with it the 3 stay until
  // the demand leaves (1.75, 3.25].
  EXPECT_EQ(AllocateSources(c, 0, Wanting(3.2), 8, budget)[1].workers, 4);
  EXPECT_EQ(AllocateSources(c, 0, Wanting(3.2), 8, budget, held)[1].workers, 3);
  EXPECT_EQ(AllocateSources(c, 0, Wanting(3.3), 8, budget, held)[1].workers, 4);
  EXPECT_EQ(AllocateSources(c, 0, Wanting(1.8), 8, budget, held)[1].workers, 3);
  EXPECT_EQ(AllocateSources(c, 0, Wanting(1.7), 8, budget, held)[1].workers, 2);
  // Costs that wander around 3 threads from step to step: one count, no flips.
  std::vector<SourceShare> now = held;
  int changes = 0;
  for (int k = 0; k < 20; ++k) {
    auto next = AllocateSources(c, 0, Wanting(k % 2 == 0 ? 2.95 : 3.1), 8, budget, now);
    changes += next[1].workers != now[1].workers;
    now = next;
  }
  EXPECT_EQ(changes, 0);
  EXPECT_EQ(now[1].workers, 3);
  // An inactive source's next allocation is not damped: it takes what it is owed.
  std::vector<SourceShare> idle = held;
  idle[1].active = false;
  idle[1].workers = 0;
  EXPECT_EQ(AllocateSources(c, 0, Wanting(3.2), 8, budget, idle)[1].workers, 4);
}

TEST(AllocationTest, TheUniformAllocationIsTheConfiguredOne) {
  const Config c = MakeConfig(false);
  const auto shares = UniformAllocation(c);
  const auto bytes = SourceShares(c);
  ASSERT_EQ(shares.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(shares[i].active);
    EXPECT_EQ(shares[i].workers, std::max<int64_t>(1, c.sources[i].workers));
    EXPECT_EQ(shares[i].read_ahead_bytes, bytes[i]);
  }
}

}  // namespace
}  // namespace braid
