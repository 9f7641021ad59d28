// Jobs with many sources: a shared pool of runtime.threads threads, plans that do not
// depend on the thread count or the memory budget, and a start that takes seconds.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "braid/plan/step_plan.h"
#include "braid/runtime/engine.h"
#include "braid/cli/job.h"
#include "braid/exec/budget.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"
#include "braid/testing/process_stats.h"

namespace braid {
namespace {

using ::braid::testing::ProcessThreads;

// `sources` sources over `files` small token files (source i reads file i % files), with
// weights 1..5, dp 4 and seq_len 64.
Config ManySources(const testing::ScopedTempDir& dir, int sources, int files) {
  testing::LengthSpec spec;
  spec.median_tokens = 40;
  spec.max_tokens = 400;
  for (int f = 0; f < files; ++f) {
    const std::string path = dir.Sub("f" + std::to_string(f) + ".parquet");
    testing::TokenFileOptions o;
    o.row_group_rows = 16;
    EXPECT_TRUE(testing::WriteTokenFile(path, testing::RandomDocs(60, spec, f), o).ok());
  }
  Config c;
  c.seed = 3;
  c.topology.dp = 4;
  c.batch.seq_len = 64;
  c.batch.global_tokens = 64 * 64;
  for (int s = 0; s < sources; ++s) {
    SourceConfig sc;
    sc.name = "s" + std::to_string(s);
    sc.path = dir.Sub("f" + std::to_string(s % files) + ".parquet");
    sc.tokens_column = "input_ids";
    sc.shuffle_window_rows = 20;
    sc.weight.points = {{0, 1.0 + s % 5}};
    c.sources.push_back(sc);
  }
  return c;
}

std::vector<std::string> PlanLines(const Config& config, int64_t steps,
                                   int64_t* max_threads = nullptr) {
  std::vector<std::string> lines;
  auto state = RunPlanJob(config, steps, "", [&](const std::string& line) {
    lines.push_back(line);
    if (max_threads) *max_threads = std::max(*max_threads, ProcessThreads());
    return Status::OK();
  });
  EXPECT_TRUE(state.ok()) << state.status().ToString();
  if (state.ok()) lines.push_back(*state);
  return lines;
}

TEST(ManySourcesTest, AThousandSourcesPlanOnAFewThreads) {
  testing::ScopedTempDir dir;
  Config config = ManySources(dir, 1000, 10);
  config.runtime.threads = 2;
  const int64_t before = ProcessThreads();
  int64_t most = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const auto lines = PlanLines(config, 3, &most);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(lines.size(), 4u);  // three plans and the state
  // The pool's two threads; not one per source (a generous margin for Arrow's own).
  EXPECT_LE(most, before + 2 + 8) << "threads grew with the sources";
  EXPECT_LT(seconds, 120) << "a thousand small sources should plan in seconds";
}

TEST(ManySourcesTest, PlansDoNotDependOnThreadsOrBudget) {
  testing::ScopedTempDir dir;
  Config config = ManySources(dir, 40, 7);
  config.runtime.threads = 1;
  const auto reference = PlanLines(config, 12);  // crosses several epochs
  ASSERT_EQ(reference.size(), 13u);
  for (int64_t threads : {2, 8}) {
    for (int64_t budget : {int64_t{1}, int64_t{1} << 30}) {
      Config c = config;
      c.runtime.threads = threads;
      c.runtime.memory_bytes = budget;
      EXPECT_EQ(PlanLines(c, 12), reference) << threads << " threads, budget " << budget;
    }
  }
}

TEST(ManySourcesTest, RunsDeliverTheSameBatchesForAnyThreadCountOrBudget) {
  testing::ScopedTempDir dir;
  Config config = ManySources(dir, 30, 5);
  auto tokens = [&](int64_t threads, int64_t budget) {
    Config c = config;
    c.runtime.threads = threads;
    c.runtime.memory_bytes = budget;
    auto engine = Engine::Make(c, {});
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    std::vector<int64_t> out;
    if (!engine.ok()) return out;
    for (int i = 0; i < 4 * 16 * 3; ++i) {  // three steps of 4 ranks x 16 micro-batches
      auto batch = (*engine)->Next();
      EXPECT_TRUE(batch.ok()) << batch.status().ToString();
      if (!batch.ok()) return out;
      const auto* ids = (*batch)->Find("input_ids");
      const auto* data = ids->data<int64_t>();
      out.insert(out.end(), data, data + ids->num_elements());
    }
    return out;
  };
  const auto reference = tokens(1, int64_t{1} << 30);
  EXPECT_FALSE(reference.empty());
  EXPECT_EQ(tokens(2, 1), reference);
  EXPECT_EQ(tokens(8, 4096), reference);
}

TEST(ManySourcesTest, AStateFromTheRowsOnlyOrderIsRefusedWithAClearMessage) {
  testing::ScopedTempDir dir;
  Config rows_only = ManySources(dir, 3, 2);
  for (auto& s : rows_only.sources) s.shuffle_window_bytes = 0;
  auto state = RunPlanJob(rows_only, 2, "", [](const std::string&) { return Status::OK(); });
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  // The same config under the byte bound refuses it, saying how to resume.
  const Config bounded = ManySources(dir, 3, 2);
  auto resumed =
      RunPlanJob(bounded, 1, *state, [](const std::string&) { return Status::OK(); });
  ASSERT_FALSE(resumed.ok());
  EXPECT_NE(resumed.status().message().find("shuffle_window_bytes: 0"), std::string::npos)
      << resumed.status().ToString();
  auto engine = Engine::Make(bounded, Engine::Options{.state_json = *state});
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("rows only"), std::string::npos);
  // Under the rows-only order it resumes.
  EXPECT_TRUE(
      RunPlanJob(rows_only, 1, *state, [](const std::string&) { return Status::OK(); })
          .ok());
}

TEST(ManySourcesTest, SharesFollowTheWeightsAndTheDefaultFollowsTheJob) {
  testing::ScopedTempDir dir;
  Config config = ManySources(dir, 10, 2);
  const int64_t budget = MemoryBudgetBytes(config);
  EXPECT_GE(budget, 10 * kMinSourceBytes);  // tiny steps: the floor
  const auto shares = SourceShares(config);
  ASSERT_EQ(shares.size(), 10u);
  EXPECT_EQ(shares[4] / 5, shares[0]);  // weights 1 and 5 (rounding aside)
  config.runtime.memory_bytes = 1000;
  EXPECT_EQ(MemoryBudgetBytes(config), 1000);
  config.batch.global_tokens = int64_t{1} << 24;  // 64 MiB of tokens per step
  config.runtime.memory_bytes = 0;
  EXPECT_GE(MemoryBudgetBytes(config), 4 * (int64_t{1} << 26));  // prefetch_steps + 2
}

// Planning without payloads (token counts from the Parquet levels, or from a length
// column) plans what a run plans: the same documents in every step.
TEST(ManySourcesTest, PlanOnlyPlansAreTheRunsWithAndWithoutALengthColumn) {
  testing::ScopedTempDir dir;
  testing::LengthSpec spec;
  spec.median_tokens = 40;
  spec.max_tokens = 400;
  Config config;
  config.seed = 11;
  config.topology.dp = 4;
  config.batch.seq_len = 64;
  config.batch.global_tokens = 64 * 64;
  for (int s = 0; s < 6; ++s) {
    auto docs = testing::RandomDocs(80, spec, uint64_t(s + 20));
    testing::TokenFileOptions o;
    o.row_group_rows = s % 2 == 0 ? 80 : 9;  // one large row group (in blocks), or many
    o.length_column = "n";
    o.null_rows = {int64_t{s} * 7 % 80};
    docs[size_t(s * 11 % 80)].clear();  // an empty row
    const std::string path = dir.Sub("s" + std::to_string(s) + ".parquet");
    ASSERT_TRUE(testing::WriteTokenFile(path, docs, o).ok());
    SourceConfig sc;
    sc.name = "s" + std::to_string(s);
    sc.path = path;
    sc.tokens_column = "input_ids";
    sc.on_error = OnError::kSkip;
    sc.shuffle_window_rows = 30;
    sc.shuffle_window_bytes = 4000;
    sc.weight.points = {{0, 1.0 + s}};
    config.sources.push_back(sc);
  }
  constexpr int64_t kSteps = 6;  // several epochs of the smaller sources
  // The run's plans, as `braid plan` prints them.
  std::vector<std::string> run;
  Engine::Options options;
  options.on_plan = [&](const StepPlan& plan) {
    if (int64_t(run.size()) < kSteps) run.push_back(StepPlanToJson(plan, config));
  };
  {
    auto engine = Engine::Make(config, std::move(options));
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    const int64_t per_step = 4 * config.MicroBatchesPerRankAt(0);
    for (int64_t k = 0; k < kSteps * per_step; ++k) {
      auto batch = (*engine)->Next();
      ASSERT_TRUE(batch.ok()) << batch.status().ToString();
    }
  }
  ASSERT_GE(run.size(), size_t(kSteps));
  auto levels = PlanLines(config, kSteps);
  Config with_lengths = config;
  for (auto& s : with_lengths.sources) s.length_column = "n";
  auto lengths = PlanLines(with_lengths, kSteps);
  ASSERT_EQ(levels.size(), size_t(kSteps + 1));
  EXPECT_EQ(lengths, levels);  // plans and the final state
  levels.pop_back();
  EXPECT_EQ(levels, std::vector<std::string>(run.begin(), run.begin() + kSteps));
}

}  // namespace
}  // namespace braid
