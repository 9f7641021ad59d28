#include "braid/plan/planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "braid/plan/balance.h"
#include "braid/plan/rebalance.h"
#include "braid/source/source_loader.h"
#include "braid/testing/memory_stream.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::braid::testing::MemoryStream;
using ::testing::HasSubstr;

using Docs = MemoryStream::Docs;
constexpr int64_t kRowsPerFile =
    100;  // MemoryStream: global row r is file r/100, row r%100

// ---------------------------------------------------------------------------
// Harness: config + one MemoryStream per source.

struct MemorySource {
  std::string name;
  WeightSchedule weight;
  std::shared_ptr<const Docs> docs;
  Oversize oversize = Oversize::kSplit;
  std::vector<int64_t> null_rows;
  int64_t window_rows = 64;
  std::vector<int64_t> image_tokens;  ///< per global row (MemoryStream::Options)
};

MemorySource Src(std::string name, WeightSchedule weight,
                 std::shared_ptr<const Docs> docs, Oversize oversize = Oversize::kSplit) {
  MemorySource s;
  s.name = std::move(name);
  s.weight = std::move(weight);
  s.docs = std::move(docs);
  s.oversize = oversize;
  return s;
}

std::shared_ptr<const Docs> LongTailDocs(int64_t count, uint64_t seed,
                                         double median = 300, int64_t max_tokens = 4096,
                                         double sigma = 1.0) {
  testing::LengthSpec spec;
  spec.median_tokens = median;
  spec.sigma = sigma;
  spec.max_tokens = max_tokens;
  return std::make_shared<const Docs>(
      testing::RandomDocs(count, spec, seed, /*vocab=*/50000));
}

WeightSchedule Constant(double w) { return WeightSchedule{{{0, w}}}; }

// `c` under mix.exact: step: every step's tokens per source exact, cut at the quota.
Config PerStep(Config c) {
  c.mix.exact = MixConfig::Exact::kStep;
  return c;
}

struct Shape {
  int64_t seq_len = 256;
  int64_t sequences = 16;  // per step
  int64_t dp = 2;
  int64_t mbs = 1;
  uint64_t seed = 7;
  BalanceAlgorithm algorithm = BalanceAlgorithm::kKarmarkarKarp;
  double linear = 0;
};

Config MakeConfig(const std::vector<MemorySource>& sources, const Shape& shape) {
  Config c;
  c.seed = shape.seed;
  c.topology.dp = shape.dp;
  c.batch.seq_len = shape.seq_len;
  c.batch.global_tokens = shape.seq_len * shape.sequences;
  c.batch.micro_batch_size = shape.mbs;
  c.balance.algorithm = shape.algorithm;
  c.balance.linear = shape.linear;
  for (const auto& s : sources) {
    SourceConfig sc;
    sc.name = s.name;
    sc.path = "memory://" + s.name;
    sc.tokens_column = "input_ids";
    sc.weight = s.weight;
    sc.oversize = s.oversize;
    sc.on_error = OnError::kSkip;
    sc.shuffle_window_rows = s.window_rows;
    c.sources.push_back(sc);
  }
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c).ToString();
  return c;
}

class MemoryJob {
 public:
  MemoryJob(const Config& config, std::vector<MemorySource> sources,
            std::optional<PlannerState> state = std::nullopt)
      : config_(config), sources_(std::move(sources)) {
    const PlannerState start = state ? *state : Planner::InitialState(config);
    std::vector<SampleStream*> raw;
    for (size_t i = 0; i < sources_.size(); ++i) {
      MemoryStream::Options o;
      o.source = static_cast<int32_t>(i);
      o.seed = config.seed;
      o.window_rows = sources_[i].window_rows;
      o.rows_per_file = kRowsPerFile;
      o.null_rows = sources_[i].null_rows;
      o.image_tokens = sources_[i].image_tokens;
      streams_.push_back(
          std::make_unique<MemoryStream>(sources_[i].docs, o, start.sources[i].next));
      raw.push_back(streams_.back().get());
    }
    auto planner = Planner::Make(config, raw, start);
    EXPECT_TRUE(planner.ok()) << planner.status().ToString();
    if (planner.ok()) planner_ = std::move(*planner);
  }

  std::vector<StepPlan> Plan(int64_t steps) {
    std::vector<StepPlan> out;
    for (int64_t s = 0; s < steps; ++s) {
      auto plan = planner_->PlanStep();
      EXPECT_TRUE(plan.ok()) << plan.status().ToString();
      if (!plan.ok()) break;
      out.push_back(std::move(*plan));
    }
    return out;
  }
  std::vector<std::string> PlanJson(int64_t steps) {
    std::vector<std::string> out;
    for (const auto& p : Plan(steps)) out.push_back(StepPlanToJson(p, config_));
    return out;
  }

  Planner& planner() { return *planner_; }
  MemoryStream& stream(size_t i) { return *streams_[i]; }
  const std::vector<int32_t>& Doc(int32_t source, int32_t file, int64_t row) const {
    return streams_[size_t(source)]->Doc(file, row);
  }

 private:
  Config config_;
  std::vector<MemorySource> sources_;
  std::vector<std::unique_ptr<MemoryStream>> streams_;
  std::unique_ptr<Planner> planner_;
};

std::vector<MemorySource> ThreeSources(double w0 = 0.6, double w1 = 0.3,
                                       double w2 = 0.1) {
  return {
      Src("web", Constant(w0), LongTailDocs(600, 11, 300, 2048, 1.2)),
      Src("code", Constant(w1), LongTailDocs(300, 12, 700, 2048, 1.0)),
      Src("math", Constant(w2), LongTailDocs(400, 13, 150, 1024, 0.8)),
  };
}

// ---------------------------------------------------------------------------
// Invariant checks shared by the memory and Parquet tests.

using DocKey = std::tuple<int32_t, int32_t, int64_t, int64_t>;  // src, file, row, epoch
using DocLookup = std::function<const std::vector<int32_t>&(int32_t, int32_t, int64_t)>;

// Every sequence holds exactly seq_len tokens, pieces lie within their documents and
// carry their tokens, costs and token sums add up, every rank has micro_batches_per_rank
// micro-batches of micro_batch_size sequences, and per-source tokens match the quotas.
void CheckStepShape(const StepPlan& plan, const Config& config, const DocLookup& doc) {
  const int64_t L = config.SeqLenAt(plan.step);  // the phase's (batch.seq_len without)
  ASSERT_EQ(plan.seq_len, L);
  ASSERT_EQ(plan.buckets.size(), size_t(config.topology.dp));
  int64_t step_tokens = 0;
  std::vector<int64_t> by_source(config.sources.size(), 0);
  for (size_t r = 0; r < plan.buckets.size(); ++r) {
    const BucketPlan& rank = plan.buckets[r];
    EXPECT_EQ(rank.bucket, int64_t(r));
    ASSERT_EQ(int64_t(rank.micro_batches.size()), config.MicroBatchesPerRankAt(plan.step));
    int64_t rank_tokens = 0;
    double rank_cost = 0;
    for (const MicroBatch& mb : rank.micro_batches) {
      ASSERT_EQ(int64_t(mb.sequences.size()), config.batch.micro_batch_size);
      int64_t mb_tokens = 0;
      double mb_cost = 0;
      for (const Sequence& seq : mb.sequences) {
        int64_t tokens = 0;
        double cost = 0;
        for (const DocPiece& d : seq.docs) {
          const auto& src = config.sources[size_t(d.source)];
          EXPECT_GT(d.len, 0);
          EXPECT_GE(d.start, 0);
          EXPECT_LE(d.start + d.len, d.doc_tokens);
          const auto& full = doc(d.source, d.file, d.row);
          const int64_t expect_doc_tokens = src.oversize == Oversize::kTruncate
                                                ? std::min<int64_t>(full.size(), L)
                                                : int64_t(full.size());
          EXPECT_EQ(d.doc_tokens, expect_doc_tokens);
          if (src.oversize == Oversize::kSkip) {
            EXPECT_LE(d.doc_tokens, L);
          }
          if (d.payload) {
            EXPECT_EQ(d.payload->tokens, full);
          }
          tokens += d.len;
          cost += PieceCost(config.balance, d.len);
          by_source[size_t(d.source)] += d.len;
        }
        EXPECT_EQ(tokens, L);
        EXPECT_EQ(seq.tokens, L);
        EXPECT_NEAR(seq.cost, cost, 1e-9 * std::max(1.0, cost));
        mb_tokens += seq.tokens;
        mb_cost += seq.cost;
      }
      EXPECT_EQ(mb.tokens, mb_tokens);
      EXPECT_NEAR(mb.cost, mb_cost, 1e-9 * std::max(1.0, mb_cost));
      rank_tokens += mb.tokens;
      rank_cost += mb.cost;
    }
    EXPECT_EQ(rank.tokens, rank_tokens);
    EXPECT_NEAR(rank.cost, rank_cost, 1e-9 * std::max(1.0, rank_cost));
    step_tokens += rank.tokens;
  }
  EXPECT_EQ(step_tokens, config.batch.global_tokens);
  EXPECT_EQ(by_source, plan.source_tokens);
  int64_t quota_sum = 0;
  for (int64_t t : plan.source_tokens) quota_sum += t;
  EXPECT_EQ(quota_sum, config.batch.global_tokens);
  EXPECT_EQ(plan.state_after.step, plan.step + 1);
  EXPECT_EQ(plan.state_before.step, plan.step);
}

// Over consecutive plans from a fresh start: the pieces of every document tile
// [0, doc_tokens) exactly once, in order of `start`; the only incomplete document of a
// source is the one its final cursor is inside of, covered up to head_start.
// Returns the planned documents per source.
std::vector<std::set<DocKey>> CheckCoverage(const std::vector<StepPlan>& plans,
                                            const Config& config) {
  std::map<DocKey, std::vector<std::pair<int64_t, int64_t>>> pieces;  // start, len
  std::map<DocKey, int64_t> doc_tokens;
  for (const StepPlan& plan : plans) {
    for (const BucketPlan& rank : plan.buckets) {
      for (const MicroBatch& mb : rank.micro_batches) {
        for (const Sequence& seq : mb.sequences) {
          for (const DocPiece& d : seq.docs) {
            const DocKey key{d.source, d.file, d.row, d.epoch};
            pieces[key].emplace_back(d.start, d.len);
            doc_tokens[key] = d.doc_tokens;
          }
        }
      }
    }
  }
  std::vector<int> incomplete(config.sources.size(), 0);
  std::vector<std::set<DocKey>> planned(config.sources.size());
  for (auto& [key, list] : pieces) {
    std::sort(list.begin(), list.end());
    int64_t next = 0;
    for (const auto& [start, len] : list) {
      EXPECT_EQ(start, next) << "gap or overlap in doc src=" << std::get<0>(key)
                             << " file=" << std::get<1>(key)
                             << " row=" << std::get<2>(key)
                             << " epoch=" << std::get<3>(key);
      next = start + len;
    }
    const size_t src = size_t(std::get<0>(key));
    planned[src].insert(key);
    if (next != doc_tokens[key]) {
      ++incomplete[src];
      const SourceCursor& cursor = plans.back().state_after.sources[src];
      EXPECT_EQ(next, cursor.head_start)
          << "only the document at the cursor may be partial";
    }
  }
  for (size_t s = 0; s < config.sources.size(); ++s) {
    EXPECT_LE(incomplete[s], 1) << "source " << s;
    const SourceCursor& cursor = plans.back().state_after.sources[s];
    EXPECT_EQ(incomplete[s], cursor.head_start > 0 ? 1 : 0) << "source " << s;
  }
  return planned;
}

// The documents a source's stream yielded up to `cursor`, minus those the planner skips.
std::set<DocKey> StreamPrefix(const MemoryStream& stream, int32_t source,
                              int64_t window_rows, const SourceCursor& cursor,
                              const std::function<bool(int64_t)>& is_skipped,
                              int64_t* skipped) {
  std::set<DocKey> out;
  *skipped = 0;
  for (int64_t epoch = 0; epoch <= cursor.next.epoch; ++epoch) {
    const auto order = stream.EpochOrder(epoch);
    for (size_t i = 0; i < order.size(); ++i) {
      const StreamPos pos{epoch, int64_t(i) / window_rows, int64_t(i) % window_rows};
      const bool before =
          std::tie(pos.epoch, pos.window, pos.offset) <
          std::tie(cursor.next.epoch, cursor.next.window, cursor.next.offset);
      const bool at_partial = pos == cursor.next && cursor.head_start > 0;
      if (!before && !at_partial) continue;
      if (is_skipped(order[i])) {
        ++*skipped;
        continue;
      }
      out.insert(DocKey{source, int32_t(order[i] / kRowsPerFile), order[i] % kRowsPerFile,
                        epoch});
    }
  }
  return out;
}

std::multiset<std::tuple<int32_t, int32_t, int64_t, int64_t, int64_t, int64_t>> PieceSet(
    const StepPlan& plan) {
  std::multiset<std::tuple<int32_t, int32_t, int64_t, int64_t, int64_t, int64_t>> out;
  for (const BucketPlan& rank : plan.buckets) {
    for (const MicroBatch& mb : rank.micro_batches) {
      for (const Sequence& seq : mb.sequences) {
        for (const DocPiece& d : seq.docs) {
          out.emplace(d.source, d.file, d.row, d.epoch, d.start, d.len);
        }
      }
    }
  }
  return out;
}

double MeanImbalance(const std::vector<StepPlan>& plans) {
  double sum = 0;
  for (const auto& p : plans) sum += p.imbalance;
  return sum / double(plans.size());
}

// ---------------------------------------------------------------------------
// Packing invariants, swept over DP size and micro-batch size.

struct PackCase {
  int64_t dp;
  int64_t mbs;
};

class PackingInvariantsTest : public ::testing::TestWithParam<PackCase> {};

TEST_P(PackingInvariantsTest, EveryTokenOfEveryPlannedDocumentOnce) {
  const auto [dp, mbs] = GetParam();
  Shape shape;
  shape.dp = dp;
  shape.mbs = mbs;
  shape.sequences = 16;
  shape.seq_len = 512;
  auto sources = ThreeSources(0.4, 0.3, 0.3);
  const Config config = MakeConfig(sources, shape);
  MemoryJob job(config, sources);
  const auto plans = job.Plan(60);
  ASSERT_EQ(plans.size(), 60u);
  const DocLookup lookup = [&](int32_t s, int32_t f, int64_t r) -> const auto& {
    return job.Doc(s, f, r);
  };
  for (const auto& plan : plans) {
    SCOPED_TRACE("step " + std::to_string(plan.step));
    CheckStepShape(plan, config, lookup);
  }
  const auto planned = CheckCoverage(plans, config);
  // Nothing dropped: the planned documents are exactly the stream's order up to the
  // cursor.
  for (int32_t s = 0; s < 3; ++s) {
    int64_t skipped = 0;
    const auto prefix = StreamPrefix(
        job.stream(size_t(s)), s, sources[size_t(s)].window_rows,
        plans.back().state_after.sources[size_t(s)], [](int64_t) { return false; },
        &skipped);
    EXPECT_EQ(planned[size_t(s)], prefix) << "source " << s;
    EXPECT_EQ(plans.back().state_after.sources[size_t(s)].skipped, 0);
  }
  // "math" (400 docs, ~82K tokens) gets 60 * 8192 * 0.3 = 147K tokens: it wraps.
  EXPECT_GE(plans.back().state_after.sources[2].next.epoch, 1);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PackingInvariantsTest,
                         ::testing::Values(PackCase{1, 1}, PackCase{2, 1}, PackCase{4, 2},
                                           PackCase{8, 1}, PackCase{2, 4}),
                         [](const auto& info) {
                           return "dp" + std::to_string(info.param.dp) + "_mbs" +
                                  std::to_string(info.param.mbs);
                         });

TEST(PlannerTest, StatesChainFromStepToStep) {
  auto sources = ThreeSources();
  const Config config = MakeConfig(sources, Shape{});
  MemoryJob job(config, sources);
  EXPECT_EQ(job.planner().state(), Planner::InitialState(config));
  const auto plans = job.Plan(10);
  for (size_t i = 1; i < plans.size(); ++i) {
    EXPECT_EQ(plans[i].state_before, plans[i - 1].state_after);
  }
  EXPECT_EQ(job.planner().state(), plans.back().state_after);
  EXPECT_EQ(job.planner().state().step, 10);
}

// A planner-built plan keeps its nested vectors in its own arena (step_plan.h): copies
// use the heap and outlive it, assignments between plans with arenas keep each plan's
// contents alive, a part copied out outlives the plan, and the plans of a planner outlive
// the planner. (Run under scripts/test-sanitize to see a use after free.)
TEST(PlannerTest, PlansCopiesAndAssignmentsOutliveEachOtherAndThePlanner) {
  auto sources = ThreeSources();
  Shape shape;
  shape.dp = 4;
  shape.mbs = 2;
  shape.sequences = 16;
  const Config config = MakeConfig(sources, shape);
  std::vector<StepPlan> plans;
  {
    MemoryJob job(config, sources);
    plans = job.Plan(4);
  }  // the planner and its streams are gone
  ASSERT_EQ(plans.size(), 4u);
  std::vector<std::string> json;
  for (const StepPlan& p : plans) {
    ASSERT_TRUE(p.arena);
    json.push_back(StepPlanToJson(p, config));
  }
  MicroBatch part = plans[0].buckets[1].micro_batches[0];  // a copy, on the heap
  const MicroBatch expected_part = part;
  StepPlan copy = plans[0];
  EXPECT_FALSE(copy.arena);
  {
    StepPlan moved = std::move(plans[1]);  // takes plans[1]'s arena along
    plans[1] = plans[2];                   // copy-assign over a moved-from plan
    plans[2] = std::move(moved);           // move-assign over a plan with an arena
  }
  plans[3] = plans[3];  // self-assignment keeps the plan
  plans[0] = StepPlan{};
  EXPECT_EQ(StepPlanToJson(copy, config), json[0]);
  EXPECT_EQ(StepPlanToJson(plans[1], config), json[2]);
  EXPECT_EQ(StepPlanToJson(plans[2], config), json[1]);
  EXPECT_EQ(StepPlanToJson(plans[3], config), json[3]);
  ASSERT_EQ(part.sequences.size(), expected_part.sequences.size());
  for (size_t s = 0; s < part.sequences.size(); ++s) {
    ASSERT_EQ(part.sequences[s].docs.size(), expected_part.sequences[s].docs.size());
    for (size_t d = 0; d < part.sequences[s].docs.size(); ++d) {
      EXPECT_EQ(part.sequences[s].docs[d].row, expected_part.sequences[s].docs[d].row);
      EXPECT_EQ(part.sequences[s].docs[d].len, expected_part.sequences[s].docs[d].len);
    }
  }
  EXPECT_GT(part.sequences[0].docs.size(), 0u);
}

// ---------------------------------------------------------------------------
// Mix fidelity.

// mix.exact: step (the time accounting's bound: PlannerTimeTest).
TEST(PlannerTest, AchievedTokenShareMatchesWeights) {
  Shape shape;
  shape.seq_len = 512;
  shape.sequences = 16;
  auto sources = ThreeSources(0.6, 0.3, 0.1);
  const Config config = PerStep(MakeConfig(sources, shape));
  MemoryJob job(config, sources);
  constexpr int kSteps = 200;
  const auto plans = job.Plan(kSteps);
  ASSERT_EQ(plans.size(), size_t(kSteps));
  std::vector<int64_t> total(3, 0);
  int64_t all = 0;
  const double weights[] = {0.6, 0.3, 0.1};
  for (const auto& plan : plans) {
    int64_t step_total = 0;
    for (size_t s = 0; s < 3; ++s) {
      total[s] += plan.source_tokens[s];
      step_total += plan.source_tokens[s];
      // Each step's quota is within one token of its ideal share, carry included.
      EXPECT_NEAR(double(plan.source_tokens[s]), weights[s] * config.batch.global_tokens,
                  1.0)
          << "step " << plan.step << " source " << s;
    }
    EXPECT_EQ(step_total, config.batch.global_tokens);
    all += step_total;
    // The delivered tokens per source equal the quotas.
    std::vector<int64_t> delivered(3, 0);
    for (const auto& piece : PieceSet(plan)) {
      delivered[size_t(std::get<0>(piece))] += std::get<5>(piece);
    }
    EXPECT_EQ(delivered, plan.source_tokens);
  }
  for (size_t s = 0; s < 3; ++s) {
    const double share = double(total[s]) / double(all);
    std::printf("[ mix ] %s target %.3f achieved %.5f\n", config.sources[s].name.c_str(),
                weights[s], share);
    EXPECT_NEAR(share, weights[s], 0.01);
    // Largest remainder with carry: cumulative tokens within a token of the ideal.
    EXPECT_NEAR(double(total[s]), weights[s] * double(all), 1.0);
  }
}

TEST(PlannerTest, WeightScheduleChangesSharesPiecewiseLinearly) {
  Shape shape;
  shape.seq_len = 256;
  shape.sequences = 16;
  auto sources = ThreeSources();
  sources[0].weight = WeightSchedule{{{0, 0.8}, {50, 0.2}}};   // falls
  sources[1].weight = WeightSchedule{{{10, 0.1}, {40, 0.7}}};  // rises
  sources[2].weight = Constant(0.1);
  const Config config = PerStep(MakeConfig(sources, shape));  // time: PlannerTimeTest
  MemoryJob job(config, sources);
  const auto plans = job.Plan(60);
  const double capacity = double(config.batch.global_tokens);
  for (const auto& plan : plans) {
    double total_w = 0;
    for (const auto& s : config.sources) total_w += s.weight.At(plan.step);
    for (size_t s = 0; s < 3; ++s) {
      const double ideal = config.sources[s].weight.At(plan.step) / total_w * capacity;
      // The carry moves at most a token or two between steps as the weights change.
      EXPECT_NEAR(double(plan.source_tokens[s]), ideal, 2.0)
          << "step " << plan.step << " source " << s;
    }
  }
  const auto share = [&](int64_t step, size_t s) {
    return double(plans[size_t(step)].source_tokens[s]) / capacity;
  };
  EXPECT_NEAR(share(0, 0), 0.8 / 1.0, 0.01);
  EXPECT_NEAR(share(59, 0), 0.2 / 1.0, 0.01);
  EXPECT_NEAR(share(25, 1), 0.4 / (0.5 + 0.4 + 0.1), 0.01);  // midpoints of both ramps
  EXPECT_GT(share(45, 1), share(5, 1) + 0.4);
}

// ---------------------------------------------------------------------------
// Determinism, DP independence, resume.

TEST(PlannerTest, SameSeedSamePlansDifferentSeedDifferentPlans) {
  auto sources = ThreeSources();
  Shape shape;
  const Config config = MakeConfig(sources, shape);
  const auto a = MemoryJob(config, sources).PlanJson(20);
  const auto b = MemoryJob(config, sources).PlanJson(20);
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);
  shape.seed = 8;
  const auto c = MemoryJob(MakeConfig(sources, shape), sources).PlanJson(20);
  ASSERT_EQ(c.size(), 20u);
  int differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += a[i] != c[i];
  EXPECT_EQ(differing, 20);
}

TEST(PlannerTest, InterleaveOrderDependsOnSeedEvenForTheSameStreams) {
  // Same streams (stream seed fixed), planner seed differs: same documents, other
  // packing.
  auto sources = ThreeSources();
  Shape shape;
  Config a_config = MakeConfig(sources, shape);
  Config b_config = a_config;
  b_config.seed = a_config.seed + 1;
  std::vector<std::unique_ptr<MemoryStream>> streams;
  std::vector<SampleStream*> a_raw, b_raw;
  for (int copy = 0; copy < 2; ++copy) {
    for (size_t i = 0; i < 3; ++i) {
      MemoryStream::Options o;
      o.source = int32_t(i);
      o.seed = a_config.seed;
      o.rows_per_file = kRowsPerFile;
      streams.push_back(std::make_unique<MemoryStream>(sources[i].docs, o));
      (copy == 0 ? a_raw : b_raw).push_back(streams.back().get());
    }
  }
  auto a = Planner::Make(a_config, a_raw, Planner::InitialState(a_config));
  auto b = Planner::Make(b_config, b_raw, Planner::InitialState(b_config));
  ASSERT_TRUE(a.ok() && b.ok());
  auto pa = (*a)->PlanStep();
  auto pb = (*b)->PlanStep();
  ASSERT_TRUE(pa.ok() && pb.ok());
  EXPECT_EQ(PieceSet(*pa).size() > 0, true);
  // Same documents drawn (streams and quotas agree) ...
  std::set<DocKey> da, db;
  for (const auto& p : PieceSet(*pa))
    da.emplace(std::get<0>(p), std::get<1>(p), std::get<2>(p), std::get<3>(p));
  for (const auto& p : PieceSet(*pb))
    db.emplace(std::get<0>(p), std::get<1>(p), std::get<2>(p), std::get<3>(p));
  EXPECT_EQ(da, db);
  // ... packed in another order.
  EXPECT_NE(StepPlanToJson(*pa, a_config), StepPlanToJson(*pb, a_config));
}

TEST(PlannerTest, DocumentsOfEachStepDoNotDependOnDp) {
  auto sources = ThreeSources();
  Shape shape;
  shape.sequences = 16;
  std::vector<std::vector<StepPlan>> runs;
  for (int64_t dp : {1, 2, 4, 8}) {
    shape.dp = dp;
    const Config config = MakeConfig(sources, shape);
    runs.push_back(MemoryJob(config, sources).Plan(25));
    ASSERT_EQ(runs.back().size(), 25u);
    for (const auto& p : runs.back()) ASSERT_EQ(p.buckets.size(), size_t(dp));
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    for (size_t step = 0; step < 25; ++step) {
      EXPECT_EQ(PieceSet(runs[r][step]), PieceSet(runs[0][step])) << "step " << step;
      EXPECT_EQ(runs[r][step].source_tokens, runs[0][step].source_tokens);
      EXPECT_EQ(runs[r][step].state_after, runs[0][step].state_after);
    }
  }
}

struct ResumeCase {
  int64_t cut;
  Oversize oversize;
};

class PlannerResumeTest : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(PlannerResumeTest, ResumeFromJsonStateContinuesExactly) {
  const auto [cut, oversize] = GetParam();
  auto sources = ThreeSources();
  for (auto& s : sources) s.oversize = oversize;
  sources[2].null_rows = {3, 50, 51, 399};  // skipped samples are part of the state too
  Shape shape;
  shape.seq_len = 256;  // many documents are longer: splits cross step boundaries
  const Config config = MakeConfig(sources, shape);
  const auto full = MemoryJob(config, sources).PlanJson(30);
  ASSERT_EQ(full.size(), 30u);

  MemoryJob first(config, sources);
  auto head = first.PlanJson(cut);
  const std::string saved = PlannerStateToJson(first.planner().state(), config);
  int64_t consumed = -1;
  auto restored = PlannerStateFromJson(saved, config, &consumed);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  EXPECT_EQ(consumed, 0);
  EXPECT_EQ(*restored, first.planner().state());
  MemoryJob second(config, sources, *restored);
  auto tail = second.PlanJson(30 - cut);
  head.insert(head.end(), tail.begin(), tail.end());
  ASSERT_EQ(head.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) EXPECT_EQ(head[i], full[i]) << "step " << i;
}

TEST(PlannerTest, SomeSavedStatesAreInsideADocument) {
  // The resume cases above are only meaningful if states inside a document occur.
  auto sources = ThreeSources();
  Shape shape;
  shape.seq_len = 256;
  const Config config = MakeConfig(sources, shape);
  int inside = 0;
  for (const auto& plan : MemoryJob(config, sources).Plan(30)) {
    for (const auto& c : plan.state_after.sources) inside += c.head_start > 0;
    if (plan.step == 19) {
      EXPECT_GT(inside, 0);
    }
  }
  EXPECT_GT(inside, 10);
}

INSTANTIATE_TEST_SUITE_P(Cuts, PlannerResumeTest,
                         ::testing::Values(ResumeCase{1, Oversize::kSplit},
                                           ResumeCase{7, Oversize::kSplit},
                                           ResumeCase{20, Oversize::kSplit},
                                           ResumeCase{20, Oversize::kTruncate},
                                           ResumeCase{13, Oversize::kSkip}),
                         [](const auto& info) {
                           return "cut" + std::to_string(info.param.cut) + "_" +
                                  ToString(info.param.oversize);
                         });

// Regression: a resumed head_start at or beyond the length of the document found at the
// cursor (the files changed, or the state was edited) made Draw take a negative piece and
// the packing loop write past the step's sequences.
TEST(PlannerTest, ResumeWithHeadStartBeyondItsDocumentIsAnErrorNotACrash) {
  auto sources = ThreeSources();
  Shape shape;
  shape.seq_len = 256;
  const Config config = MakeConfig(sources, shape);
  MemoryJob job(config, sources);
  job.Plan(5);
  PlannerState state = job.planner().state();
  // The document at source 1's cursor, as a resumed stream will yield it.
  MemoryStream probe(
      sources[1].docs,
      [] {
        MemoryStream::Options o;
        o.source = 1;
        o.seed = 7;
        o.rows_per_file = kRowsPerFile;
        return o;
      }(),
      state.sources[1].next);
  auto head = probe.Next();
  ASSERT_TRUE(head.ok());
  for (int64_t head_start :
       {head->meta.tokens, head->meta.tokens + 1, int64_t{1} << 40}) {
    PlannerState edited = state;
    edited.sources[1].head_start = head_start;
    auto restored = PlannerStateFromJson(PlannerStateToJson(edited, config), config);
    ASSERT_TRUE(restored.ok());
    MemoryJob resumed(config, sources, *restored);
    auto plan = resumed.planner().PlanStep();
    ASSERT_FALSE(plan.ok()) << "head_start " << head_start;
    EXPECT_THAT(plan.status().message(),
                ::testing::StartsWith("state.sources[1].head_start: "));
    ASSERT_NE(GetErrorDetail(plan.status()), nullptr);
    EXPECT_EQ(GetErrorDetail(plan.status())->kind(), ErrorKind::kConfig);
  }
  // One token short of the end is still a valid state.
  PlannerState edge = state;
  edge.sources[1].head_start = head->meta.tokens - 1;
  MemoryJob ok(config, sources, edge);
  EXPECT_EQ(ok.Plan(2).size(), 2u);
}

TEST(PlannerTest, StateJsonRejectsOtherConfigs) {
  auto sources = ThreeSources();
  const Config config = MakeConfig(sources, Shape{});
  MemoryJob job(config, sources);
  job.Plan(3);
  const std::string saved = PlannerStateToJson(job.planner().state(), config, 2);
  int64_t consumed = 0;
  ASSERT_TRUE(PlannerStateFromJson(saved, config, &consumed).ok());
  EXPECT_EQ(consumed, 2);

  Config other_seed = config;
  other_seed.seed += 1;
  auto st = PlannerStateFromJson(saved, other_seed).status();
  EXPECT_TRUE(st.IsInvalid());
  EXPECT_THAT(st.message(), ::testing::StartsWith("state.fingerprint"));

  Config renamed = config;
  renamed.sources[1].name = "other";
  st = PlannerStateFromJson(saved, renamed).status();
  EXPECT_FALSE(st.ok());

  Config new_weights = config;  // weights and dp may change on resume
  new_weights.sources[0].weight = Constant(0.1);
  new_weights.topology.dp = 1;
  EXPECT_TRUE(PlannerStateFromJson(saved, new_weights).ok());

  for (const std::string bad :
       {"", "[]", "{\"version\": 2}", "{\"version\": 1}", "nope"}) {
    st = PlannerStateFromJson(bad, config).status();
    EXPECT_TRUE(st.IsInvalid()) << bad;
    EXPECT_THAT(st.message(), ::testing::StartsWith("state")) << bad;
    const auto* detail = GetErrorDetail(st);
    ASSERT_NE(detail, nullptr) << bad;
    EXPECT_EQ(detail->kind(), ErrorKind::kConfig);
  }
}

// ---------------------------------------------------------------------------
// Oversize documents.

std::vector<MemorySource> OneLongSource(Oversize oversize, uint64_t seed = 21) {
  // Half the documents exceed seq_len = 256.
  return {Src("long", Constant(1.0), LongTailDocs(300, seed, 256, 1500, 1.0), oversize)};
}

TEST(PlannerOversizeTest, SplitSpreadsLongDocumentsOverSequences) {
  auto sources = OneLongSource(Oversize::kSplit);
  Shape shape;
  const Config config = MakeConfig(sources, shape);
  MemoryJob job(config, sources);
  const auto plans = job.Plan(20);
  int long_docs = 0;
  for (const auto& plan : plans) {
    CheckStepShape(plan, config, [&](int32_t s, int32_t f, int64_t r) -> const auto& {
      return job.Doc(s, f, r);
    });
    for (const auto& p : PieceSet(plan)) {
      long_docs += std::get<4>(p) >= shape.seq_len;  // a piece starting past seq_len
    }
  }
  CheckCoverage(plans, config);
  EXPECT_GT(long_docs, 0);
}

TEST(PlannerOversizeTest, TruncateKeepsOnlyTheFirstSeqLenTokens) {
  auto sources = OneLongSource(Oversize::kTruncate);
  Shape shape;
  const Config config = MakeConfig(sources, shape);
  MemoryJob job(config, sources);
  const auto plans = job.Plan(20);
  int truncated = 0;
  for (const auto& plan : plans) {
    CheckStepShape(plan, config, [&](int32_t s, int32_t f, int64_t r) -> const auto& {
      return job.Doc(s, f, r);
    });
    for (const auto& rank : plan.buckets) {
      for (const auto& mb : rank.micro_batches) {
        for (const auto& seq : mb.sequences) {
          for (const auto& d : seq.docs) {
            EXPECT_LE(d.start + d.len, shape.seq_len);
            EXPECT_LE(d.doc_tokens, shape.seq_len);
            truncated += int64_t(job.Doc(d.source, d.file, d.row).size()) > shape.seq_len;
          }
        }
      }
    }
  }
  CheckCoverage(plans, config);  // each truncated document: [0, seq_len) once
  EXPECT_GT(truncated, 0);
  EXPECT_EQ(plans.back().state_after.sources[0].skipped, 0);
}

TEST(PlannerOversizeTest, SkipDropsLongDocumentsAndCountsThem) {
  auto sources = OneLongSource(Oversize::kSkip);
  sources[0].null_rows = {5, 6, 7};
  Shape shape;
  const Config config = MakeConfig(sources, shape);
  MemoryJob job(config, sources);
  const auto plans = job.Plan(20);
  for (const auto& plan : plans) {
    CheckStepShape(plan, config, [&](int32_t s, int32_t f, int64_t r) -> const auto& {
      return job.Doc(s, f, r);
    });
  }
  const auto planned = CheckCoverage(plans, config);
  const SourceCursor& cursor = plans.back().state_after.sources[0];
  int64_t expected_skipped = 0;
  const auto& docs = *sources[0].docs;
  const auto prefix = StreamPrefix(
      job.stream(0), 0, sources[0].window_rows, cursor,
      [&](int64_t row) {
        return int64_t(docs[size_t(row)].size()) > shape.seq_len ||
               std::count(sources[0].null_rows.begin(), sources[0].null_rows.end(), row);
      },
      &expected_skipped);
  EXPECT_EQ(planned[0], prefix);
  EXPECT_GT(expected_skipped, 50);
  EXPECT_EQ(cursor.skipped, expected_skipped);
}

TEST(PlannerOversizeTest, EverySampleSkippedIsADataError) {
  // Every document longer than seq_len, with skip: no progress is possible.
  auto docs = std::make_shared<const Docs>(Docs(20, std::vector<int32_t>(300, 1)));
  std::vector<MemorySource> sources{Src("long", Constant(1.0), docs, Oversize::kSkip)};
  const Config config = MakeConfig(sources, Shape{});
  MemoryJob job(config, sources);
  auto plan = job.planner().PlanStep();
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(plan.status().IsInvalid());
  EXPECT_THAT(plan.status().message(), HasSubstr("every sample of an epoch was skipped"));
  const auto* detail = GetErrorDetail(plan.status());
  ASSERT_NE(detail, nullptr);
  EXPECT_EQ(detail->kind(), ErrorKind::kData);
}

// ---------------------------------------------------------------------------
// Weight 0, balance.

TEST(PlannerTest, ZeroWeightSourceIsNeverRead) {
  auto sources = ThreeSources(0.7, 0.0, 0.3);
  sources[2].weight = WeightSchedule{{{0, 0.0}, {10, 0.0}, {11, 0.5}}};  // off, then on
  const Config config = MakeConfig(sources, Shape{});
  MemoryJob job(config, sources);
  const auto plans = job.Plan(11);
  EXPECT_EQ(job.stream(1).next_calls(), 0);
  EXPECT_EQ(job.stream(2).next_calls(), 0);  // weight 0 through step 10
  for (const auto& p : plans) {
    EXPECT_EQ(p.source_tokens[1], 0);
    EXPECT_EQ(p.source_tokens[2], 0);
  }
  job.Plan(1);  // step 11: weight 0.5
  EXPECT_GT(job.stream(2).next_calls(), 0);
  EXPECT_EQ(job.stream(1).next_calls(), 0);
}

TEST(PlannerTest, KarmarkarKarpBalancesBetterThanNoneAtDp8) {
  // dp=8, 8 micro-batches of one sequence per rank; long-tail documents; linear term 0 so
  // attention dominates as at long context.
  Shape shape;
  shape.dp = 8;
  shape.sequences = 64;
  shape.seq_len = 1024;
  std::vector<MemorySource> sources{
      Src("web", Constant(0.7), LongTailDocs(2000, 31, 400, 4096, 1.3)),
      Src("code", Constant(0.3), LongTailDocs(1000, 32, 900, 4096, 1.1)),
  };
  std::map<BalanceAlgorithm, double> mean;
  for (BalanceAlgorithm a : {BalanceAlgorithm::kKarmarkarKarp, BalanceAlgorithm::kGreedy,
                             BalanceAlgorithm::kNone}) {
    shape.algorithm = a;
    const auto plans = MemoryJob(MakeConfig(sources, shape), sources).Plan(30);
    ASSERT_EQ(plans.size(), 30u);
    mean[a] = MeanImbalance(plans);
    for (const auto& p : plans) {
      // The reported imbalance is max rank cost / mean rank cost.
      double max_cost = 0, sum = 0;
      for (const auto& r : p.buckets) {
        max_cost = std::max(max_cost, r.cost);
        sum += r.cost;
      }
      EXPECT_NEAR(p.imbalance, max_cost / (sum / 8), 1e-9);
    }
  }
  std::printf("[ planner imbalance dp=8 ] KK %.4f  LPT %.4f  none %.4f\n",
              mean[BalanceAlgorithm::kKarmarkarKarp], mean[BalanceAlgorithm::kGreedy],
              mean[BalanceAlgorithm::kNone]);
  EXPECT_LE(mean[BalanceAlgorithm::kKarmarkarKarp], mean[BalanceAlgorithm::kNone]);
  // With the swaps after both, KK and LPT end within 1e-4 of each other here (1.00115
  // and 1.00113 on the whole-document stream, 1.00105 and 1.00109 per step).
  EXPECT_LE(mean[BalanceAlgorithm::kKarmarkarKarp],
            mean[BalanceAlgorithm::kGreedy] + 1e-4);
  EXPECT_LT(mean[BalanceAlgorithm::kKarmarkarKarp], 1.05);
  EXPECT_GT(mean[BalanceAlgorithm::kNone], 1.1);
}

TEST(PlannerTest, MakeRejectsMismatchedStreams) {
  auto sources = ThreeSources();
  const Config config = MakeConfig(sources, Shape{});
  MemoryStream only(sources[0].docs, {});
  auto planner = Planner::Make(config, {&only}, Planner::InitialState(config));
  EXPECT_TRUE(planner.status().IsInvalid());
  PlannerState short_state;
  short_state.sources.resize(1);
  std::vector<SampleStream*> three{&only, &only, &only};
  EXPECT_TRUE(Planner::Make(config, three, short_state).status().IsInvalid());
}

// ---------------------------------------------------------------------------
// Real Parquet files through SourceLoader.

class PlannerParquetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* names[] = {"web", "code", "math"};
    const double weights[] = {0.5, 0.2, 0.3};
    const double medians[] = {300, 600, 120};
    for (int s = 0; s < 3; ++s) {
      SourceConfig sc;
      sc.name = names[s];
      sc.path = dir_.Sub(names[s]);
      sc.tokens_column = "input_ids";
      sc.weight = Constant(weights[s]);
      sc.shuffle_window_rows = 50;
      docs_.emplace_back();
      for (int f = 0; f < 3; ++f) {
        testing::LengthSpec spec;
        spec.median_tokens = medians[s];
        spec.max_tokens = 2048;
        auto docs = testing::RandomDocs(120 + 10 * f, spec, uint64_t(100 * s + f));
        testing::TokenFileOptions opts;
        opts.row_group_rows = 32;
        ASSERT_TRUE(testing::WriteTokenFile(dir_.Sub(std::string(names[s]) + "/part-" +
                                                     std::to_string(f) + ".parquet"),
                                            docs, opts)
                        .ok());
        docs_.back().push_back(std::move(docs));
      }
      config_.sources.push_back(sc);
    }
    config_.seed = 99;
    config_.topology.dp = 4;
    config_.batch.seq_len = 512;
    config_.batch.global_tokens = 512 * 16;
    ASSERT_TRUE(ValidateConfig(config_).ok());
  }

  std::vector<StepPlan> PlanParquet(const Config& config, const PlannerState& state,
                                    int64_t steps, bool payloads) {
    std::vector<std::unique_ptr<SourceLoader>> loaders;
    std::vector<SampleStream*> raw;
    SourceLoader::Options options;
    options.read_payloads = payloads;
    for (int32_t i = 0; i < 3; ++i) {
      auto loader = SourceLoader::Make(config, i, state.sources[size_t(i)].next, options);
      EXPECT_TRUE(loader.ok()) << loader.status().ToString();
      if (!loader.ok()) return {};
      raw.push_back(loader->get());
      loaders.push_back(std::move(*loader));
    }
    auto planner = Planner::Make(config, raw, state);
    EXPECT_TRUE(planner.ok());
    std::vector<StepPlan> out;
    for (int64_t s = 0; s < steps; ++s) {
      auto plan = (*planner)->PlanStep();
      EXPECT_TRUE(plan.ok()) << plan.status().ToString();
      if (!plan.ok()) break;
      out.push_back(std::move(*plan));
    }
    return out;
  }

  testing::ScopedTempDir dir_{"braid-planner"};
  Config config_;
  std::vector<std::vector<Docs>> docs_;  // [source][file][row]
};

TEST_F(PlannerParquetTest, InvariantsHoldOnRealFiles) {
  const auto plans = PlanParquet(config_, Planner::InitialState(config_), 40, true);
  ASSERT_EQ(plans.size(), 40u);
  const DocLookup lookup = [&](int32_t s, int32_t f, int64_t r) -> const auto& {
    return docs_[size_t(s)][size_t(f)][size_t(r)];
  };
  for (const auto& plan : plans) {
    SCOPED_TRACE("step " + std::to_string(plan.step));
    CheckStepShape(plan, config_, lookup);
  }
  const auto planned = CheckCoverage(plans, config_);
  // "math" (390 docs, ~77K tokens) gets 40 * 8192 * 0.3 = 98K tokens: it wraps into
  // epoch 1, and every row of epoch 0 was planned (exactly once, by CheckCoverage).
  std::set<std::pair<int32_t, int64_t>> epoch0;
  for (const auto& [s, f, r, e] : planned[2]) {
    if (e == 0) epoch0.emplace(f, r);
  }
  EXPECT_EQ(epoch0.size(), 120u + 130u + 140u);
  EXPECT_GE(plans.back().state_after.sources[2].next.epoch, 1);
}

TEST_F(PlannerParquetTest, MetadataOnlyPlansEqualPayloadPlans) {
  const auto with = PlanParquet(config_, Planner::InitialState(config_), 10, true);
  const auto without = PlanParquet(config_, Planner::InitialState(config_), 10, false);
  ASSERT_EQ(with.size(), 10u);
  ASSERT_EQ(without.size(), 10u);
  for (size_t i = 0; i < with.size(); ++i) {
    EXPECT_EQ(StepPlanToJson(with[i], config_), StepPlanToJson(without[i], config_));
  }
  EXPECT_EQ(without[0].buckets[0].micro_batches[0].sequences[0].docs[0].payload, nullptr);
  // A metadata-only plan is freed with its arena without visiting its pieces; one with
  // payloads releases each piece's payload.
  EXPECT_TRUE(without[0].arena.pieces_without_payloads());
  EXPECT_FALSE(with[0].arena.pieces_without_payloads());
}

TEST_F(PlannerParquetTest, ResumeOnRealFilesContinuesExactly) {
  const auto full = PlanParquet(config_, Planner::InitialState(config_), 30, false);
  ASSERT_EQ(full.size(), 30u);
  const auto head = PlanParquet(config_, Planner::InitialState(config_), 20, false);
  ASSERT_EQ(head.size(), 20u);
  auto state =
      PlannerStateFromJson(PlannerStateToJson(head.back().state_after, config_), config_);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  const auto tail = PlanParquet(config_, *state, 10, false);
  ASSERT_EQ(tail.size(), 10u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(StepPlanToJson(head[i], config_), StepPlanToJson(full[i], config_));
  }
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(StepPlanToJson(tail[i], config_), StepPlanToJson(full[20 + i], config_))
        << "step " << 20 + i;
  }
}

TEST_F(PlannerParquetTest, DpDoesNotChangeTheDocumentsOnRealFiles) {
  Config dp1 = config_;
  ASSERT_TRUE(SetDataParallel(&dp1, 1).ok());
  Config dp8 = config_;
  ASSERT_TRUE(SetDataParallel(&dp8, 8).ok());
  const auto a = PlanParquet(dp1, Planner::InitialState(dp1), 8, false);
  const auto b = PlanParquet(dp8, Planner::InitialState(dp8), 8, false);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(PieceSet(a[i]), PieceSet(b[i]));
}


// ---------------------------------------------------------------------------
// Phases, stepwise schedules, micro-batch order, elastic and changed-mix resume (issue 4).

// Steps [0, 20) at seq_len 128 with web off; later steps at batch.seq_len 256.
Config PhasedConfig(const std::vector<MemorySource>& sources, Shape shape,
                    int64_t until = 20, int64_t phase_len = 128) {
  Config c = MakeConfig(sources, shape);
  PhaseConfig phase;
  phase.until_step = until;
  phase.seq_len = phase_len;
  phase.weights.resize(c.sources.size());
  phase.weights[0] = Constant(0.0);
  phase.weights[1] = Constant(0.5);
  c.phases.push_back(phase);
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c).ToString();
  return c;
}

TEST(PlannerPhaseTest, PhaseSetsSeqLenAndWeightsThenBatchShapeResumes) {
  auto sources = ThreeSources();
  Shape shape;
  shape.seq_len = 256;
  shape.sequences = 16;
  shape.dp = 2;
  for (const bool per_step : {false, true}) {
    SCOPED_TRACE(per_step ? "mix.exact: step" : "mix.exact: time");
    Config config = PhasedConfig(sources, shape);
    if (per_step) config = PerStep(config);
    MemoryJob job(config, sources);
    const auto early = job.Plan(20);
    ASSERT_EQ(early.size(), 20u);
    EXPECT_EQ(job.stream(0).next_calls(), 0);  // weight 0 in the phase: never read
    double code = 0;
    for (const auto& plan : early) {
      CheckStepShape(plan, config, [&](int32_t s, int32_t f, int64_t r) -> const auto& {
        return job.Doc(s, f, r);
      });
      EXPECT_EQ(plan.seq_len, 128);
      for (const auto& rank : plan.buckets) EXPECT_EQ(rank.micro_batches.size(), 16u);
      EXPECT_EQ(plan.source_tokens[0], 0);
      // code 0.5 vs math 0.1 (its own weight): 5/6 of the tokens, every step (step) or
      // within two sequences of it so far (time).
      code += double(plan.source_tokens[1]);
      if (per_step) {
        EXPECT_NEAR(double(plan.source_tokens[1]), 4096.0 * 5 / 6, 1.0);
      } else {
        EXPECT_NEAR(code, 4096.0 * 5 / 6 * double(plan.step + 1), 2.0 * 128);
      }
      EXPECT_NE(StepPlanToJson(plan, config).find("\"seq_len\":128"), std::string::npos);
    }
    const auto late = job.Plan(10);
    double web = 0;
    for (const auto& plan : late) {
      CheckStepShape(plan, config, [&](int32_t s, int32_t f, int64_t r) -> const auto& {
        return job.Doc(s, f, r);
      });
      EXPECT_EQ(plan.seq_len, 256);
      for (const auto& rank : plan.buckets) EXPECT_EQ(rank.micro_batches.size(), 8u);
      web += double(plan.source_tokens[0]);
      if (per_step) {
        EXPECT_NEAR(double(plan.source_tokens[0]), 4096.0 * 0.6, 2.0);
      } else {
        EXPECT_NEAR(web, 4096.0 * 0.6 * double(plan.step - 19), 2.0 * 256);
      }
    }
    EXPECT_GT(job.stream(0).next_calls(), 0);
  }
}

TEST(PlannerPhaseTest, ShareWithinOnePercentOverAnyHundredStepsOfAPhase) {
  auto sources = ThreeSources();
  Shape shape;
  shape.seq_len = 256;
  shape.sequences = 8;
  const Config config = PhasedConfig(sources, shape, /*until=*/150, /*phase_len=*/128);
  MemoryJob job(config, sources);
  const auto plans = job.Plan(300);
  ASSERT_EQ(plans.size(), 300u);
  for (int64_t begin : {0, 25, 50, 150, 175, 200}) {
    std::vector<double> tokens(3, 0.0), target(3, 0.0);
    double all = 0;
    for (int64_t t = begin; t < begin + 100; ++t) {
      double wsum = 0;
      for (size_t s = 0; s < 3; ++s) wsum += config.WeightAt(s, t);
      for (size_t s = 0; s < 3; ++s) {
        tokens[s] += double(plans[size_t(t)].source_tokens[s]);
        target[s] += config.WeightAt(s, t) / wsum / 100.0;
        all += double(plans[size_t(t)].source_tokens[s]);
      }
    }
    for (size_t s = 0; s < 3; ++s) {
      EXPECT_NEAR(tokens[s] / all, target[s], 0.01) << "window " << begin << " src " << s;
    }
  }
}

TEST(PlannerPhaseTest, ResumeAcrossAPhaseBoundaryContinuesExactly) {
  for (Oversize oversize : {Oversize::kSplit, Oversize::kTruncate, Oversize::kSkip}) {
    auto sources = ThreeSources();
    for (auto& s : sources) s.oversize = oversize;
    Shape shape;
    shape.seq_len = 1024;
    shape.sequences = 4;
    const Config config = PhasedConfig(sources, shape, /*until=*/12, /*phase_len=*/256);
    const auto full = MemoryJob(config, sources).PlanJson(24);
    ASSERT_EQ(full.size(), 24u);
    for (int64_t cut : {5, 12, 13, 20}) {
      MemoryJob first(config, sources);
      auto head = first.PlanJson(cut);
      auto restored =
          PlannerStateFromJson(PlannerStateToJson(first.planner().state(), config), config);
      ASSERT_TRUE(restored.ok()) << restored.status().ToString();
      MemoryJob second(config, sources, *restored);
      auto tail = second.PlanJson(24 - cut);
      head.insert(head.end(), tail.begin(), tail.end());
      ASSERT_EQ(head.size(), full.size());
      for (size_t i = 0; i < full.size(); ++i) {
        EXPECT_EQ(head[i], full[i]) << ToString(oversize) << " cut " << cut << " step " << i;
      }
    }
  }
}

TEST(PlannerPhaseTest, FingerprintIgnoresPhasesAndWeights) {
  auto sources = ThreeSources();
  const Config plain = MakeConfig(sources, Shape{});
  const Config phased = PhasedConfig(sources, Shape{});
  EXPECT_EQ(plain.Fingerprint(), phased.Fingerprint());
}

TEST(PlannerPhaseTest, StepwiseScheduleIsPiecewiseConstant) {
  WeightSchedule w{{{0, 0.1}, {10, 0.5}, {20, 0.0}}};
  w.stepwise = true;
  EXPECT_EQ(w.At(0), 0.1);
  EXPECT_EQ(w.At(9), 0.1);
  EXPECT_EQ(w.At(10), 0.5);
  EXPECT_EQ(w.At(19), 0.5);
  EXPECT_EQ(w.At(20), 0.0);
  EXPECT_EQ(w.At(1000), 0.0);
  w.stepwise = false;
  EXPECT_DOUBLE_EQ(w.At(5), 0.3);
}

TEST(PlannerPhaseTest, ParsesPhasesAndStepsAndNamesBadKeys) {
  const std::string base = R"(
batch: {global_tokens: 4096, seq_len: 1024}
topology: {dp: 2}
sources:
  - {name: a, path: /x/a, tokens_column: t, weight: {steps: [[0, 0.1], [100, 0.3]]}}
  - {name: b, path: /x/b, tokens_column: t}
)";
  auto ok = ParseConfig(base + R"(phases:
  - {until_step: 10, seq_len: 512, weights: {b: 0}}
  - {until_step: 20, seq_len: 2048, weights: {a: {schedule: [[10, 1], [20, 2]]}}}
)", "/");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(ok->sources[0].weight.stepwise);
  EXPECT_EQ(ok->SeqLenAt(0), 512);
  EXPECT_EQ(ok->SeqLenAt(10), 2048);
  EXPECT_EQ(ok->SeqLenAt(20), 1024);
  EXPECT_EQ(ok->WeightAt(1, 5), 0.0);
  EXPECT_EQ(ok->WeightAt(1, 15), 1.0);
  EXPECT_DOUBLE_EQ(ok->WeightAt(0, 15), 1.5);
  EXPECT_DOUBLE_EQ(ok->WeightAt(0, 50), 0.1);
  EXPECT_DOUBLE_EQ(ok->WeightAt(0, 150), 0.3);
  struct Bad {
    std::string text;
    std::string key;
  };
  for (const Bad& bad : std::vector<Bad>{
           {"phases:\n  - {until_step: 10, seq_len: 4096}\n", "phases[0].seq_len"},
           {"phases:\n  - {until_step: 10, seq_len: 3000}\n", "phases[0].seq_len"},
           {"phases:\n  - {until_step: 10}\n  - {until_step: 5}\n", "phases[1].until_step"},
           {"phases:\n  - {until_step: 10, weights: {c: 1}}\n", "phases[0].weights.c"},
           {"phases:\n  - {until_step: 10, bogus: 1}\n", "phases[0].bogus"},
           {"phases:\n  - {seq_len: 512}\n", "phases[0].until_step"},
           {"phases:\n  - {until_step: 10, weights: {a: 0, b: 0}}\n", "phases"},
       }) {
    auto r = ParseConfig(base + bad.text, "/");
    ASSERT_FALSE(r.ok()) << bad.text;
    EXPECT_THAT(r.status().message(), HasSubstr(bad.key)) << r.status().ToString();
  }
}

TEST(PlannerOrderTest, HeaviestMicroBatchesSitInTheMiddle) {
  auto sources = ThreeSources();
  Shape shape;
  shape.seq_len = 256;
  shape.sequences = 32;
  shape.dp = 2;
  shape.mbs = 2;  // 8 micro-batches per rank
  const Config config = MakeConfig(sources, shape);
  const auto plans = MemoryJob(config, sources).Plan(10);
  for (const auto& plan : plans) {
    for (const auto& rank : plan.buckets) {
      const auto& mb = rank.micro_batches;
      const size_t peak = (mb.size() - 1) / 2;  // costs may tie: compare with <=
      for (size_t k = 0; k < peak; ++k) EXPECT_LE(mb[k].cost, mb[k + 1].cost);
      for (size_t k = peak; k + 1 < mb.size(); ++k) EXPECT_GE(mb[k].cost, mb[k + 1].cost);
    }
  }
}

// Elastic resume: a state saved at dp=8 continues at dp=4 and dp=16 with the documents of
// every step unchanged.
TEST(PlannerElasticTest, StateSavedAtDp8ResumesAtDp4AndDp16WithTheSameDocuments) {
  auto sources = ThreeSources();
  Shape shape;
  shape.seq_len = 256;
  shape.sequences = 32;
  shape.dp = 8;
  const Config config8 = MakeConfig(sources, shape);
  const auto full = MemoryJob(config8, sources).Plan(20);
  MemoryJob first(config8, sources);
  first.Plan(8);
  const std::string saved = PlannerStateToJson(first.planner().state(), config8);
  for (int64_t dp : {4, 16}) {
    Config other = config8;
    ASSERT_TRUE(SetDataParallel(&other, dp).ok());
    auto state = PlannerStateFromJson(saved, other);
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    const auto tail = MemoryJob(other, sources, *state).Plan(12);
    ASSERT_EQ(tail.size(), 12u);
    for (size_t i = 0; i < tail.size(); ++i) {
      EXPECT_EQ(tail[i].buckets.size(), size_t(dp));
      EXPECT_EQ(PieceSet(tail[i]), PieceSet(full[8 + i])) << "dp " << dp << " step " << i;
      EXPECT_EQ(tail[i].state_after, full[8 + i].state_after);
    }
  }
}

// Changed-mix resume: every source continues from its own cursor (its consumed tokens form
// a gap-free, overlap-free prefix of its stream) and the new weights hold from that step.
TEST(PlannerElasticTest, ChangedWeightsContinueEverySourceFromItsCursor) {
  auto sources = ThreeSources(0.6, 0.3, 0.1);
  Shape shape;
  shape.seq_len = 256;
  shape.sequences = 16;
  const Config before = MakeConfig(sources, shape);
  MemoryJob first(before, sources);
  auto plans = first.Plan(10);
  const std::string saved = PlannerStateToJson(first.planner().state(), before);
  auto changed = ThreeSources(0.1, 0.2, 0.7);
  const Config after = MakeConfig(changed, shape);
  auto state = PlannerStateFromJson(saved, after);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  MemoryJob second(after, changed, *state);
  const auto tail = second.Plan(10);
  // The new weights hold from the resumed step: each source's tokens are its new share
  // plus what it was owed when saved, to within two sequences (the bound of its carry).
  std::vector<double> tail_tokens(3, 0.0);
  for (const auto& p : tail) {
    for (size_t s = 0; s < 3; ++s) {
      tail_tokens[s] += double(p.source_tokens[s]);
      EXPECT_LE(std::abs(p.state_after.sources[s].carry), 2.0 * 256) << p.step;
    }
  }
  const double new_weights[] = {0.1, 0.2, 0.7};
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(tail_tokens[s], new_weights[s] * 10 * 4096 + state->sources[s].carry,
                2.0 * 256)
        << "source " << s;
  }
  plans.insert(plans.end(), tail.begin(), tail.end());
  for (int32_t s = 0; s < 3; ++s) {
    // Pieces of this source per document, in stream order.
    std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> by_row;  // row -> (start,len)
    for (const auto& p : plans) {
      for (const auto& piece : PieceSet(p)) {
        if (std::get<0>(piece) != s) continue;
        ASSERT_EQ(std::get<3>(piece), 0);  // one epoch is enough here
        const int64_t row = first.stream(size_t(s)).GlobalRow(std::get<1>(piece),
                                                              std::get<2>(piece));
        by_row[row].emplace_back(std::get<4>(piece), std::get<5>(piece));
      }
    }
    const auto order = first.stream(size_t(s)).EpochOrder(0);
    size_t k = 0;
    for (; k < order.size() && by_row.count(order[k]); ++k) {
      auto pieces = by_row[order[k]];
      std::sort(pieces.begin(), pieces.end());
      int64_t next = 0;
      for (const auto& [start, len] : pieces) {
        EXPECT_EQ(start, next) << "source " << s << " row " << order[k];
        next = start + len;
      }
      if (k + 1 < by_row.size()) {
        EXPECT_EQ(next, int64_t(first.Doc(s, int32_t(order[k] / kRowsPerFile),
                                          order[k] % kRowsPerFile).size()))
            << "source " << s << ": a document was left unfinished";
      }
    }
    EXPECT_EQ(k, by_row.size()) << "source " << s << ": documents skipped in the stream";
  }
}


// Under mix.exact: step the splitting levers cut long documents differently but draw the
// same documents and tokens, keep every sequence full, and never produce a piece above
// the cap. (Under time they choose the units: LeversCapPiecesAndCutAtTheirPoints.)
TEST(PlannerSplitTest, LeversKeepTheDrawAndCapPieces) {
  auto sources = ThreeSources();
  Shape shape;
  shape.seq_len = 512;
  shape.sequences = 16;
  shape.dp = 4;
  const Config base = PerStep(MakeConfig(sources, shape));
  const auto reference = MemoryJob(base, sources).Plan(12);
  struct Lever {
    BalanceConfig::Split split;
    int64_t max_piece;
  };
  for (const Lever& lever : {Lever{BalanceConfig::Split::kEven, 0},
                             Lever{BalanceConfig::Split::kEven, 200},
                             Lever{BalanceConfig::Split::kBoundary, 256}}) {
    Config config = base;
    config.balance.split = lever.split;
    config.balance.max_piece = lever.max_piece;
    MemoryJob job(config, sources);
    const auto plans = job.Plan(12);
    ASSERT_EQ(plans.size(), reference.size());
    const int64_t cap = lever.max_piece > 0 ? lever.max_piece : shape.seq_len;
    for (size_t i = 0; i < plans.size(); ++i) {
      CheckStepShape(plans[i], config, [&](int32_t s, int32_t f, int64_t r) -> const auto& {
        return job.Doc(s, f, r);
      });
      EXPECT_EQ(plans[i].state_after, reference[i].state_after);
      EXPECT_EQ(plans[i].source_tokens, reference[i].source_tokens);
      // Same tokens of the same documents: per document, the covered token count.
      std::map<DocKey, int64_t> a, b;
      for (const auto& p : PieceSet(plans[i])) {
        EXPECT_LE(std::get<5>(p), cap);
        a[DocKey{std::get<0>(p), std::get<1>(p), std::get<2>(p), std::get<3>(p)}] +=
            std::get<5>(p);
      }
      for (const auto& p : PieceSet(reference[i])) {
        b[DocKey{std::get<0>(p), std::get<1>(p), std::get<2>(p), std::get<3>(p)}] +=
            std::get<5>(p);
      }
      EXPECT_EQ(a, b) << "step " << i;
    }
  }
}

// After Karmarkar-Karp (or greedy) the planner swaps sequences between the costliest and
// the cheapest rank: the plan's imbalance is never above the partition's alone, and lower
// on some steps.
TEST(PlannerBalanceTest, SwapsAfterThePartitionNeverRaiseTheImbalance) {
  for (auto algorithm : {BalanceAlgorithm::kKarmarkarKarp, BalanceAlgorithm::kGreedy}) {
    Shape shape;
    shape.seq_len = 1024;
    shape.sequences = 64;
    shape.dp = 8;
    shape.algorithm = algorithm;
    const Config config = MakeConfig(ThreeSources(), shape);
    MemoryJob job(config, ThreeSources());
    int64_t lower = 0;
    for (const StepPlan& plan : job.Plan(20)) {
      std::vector<double> costs;
      for (const BucketPlan& rank : plan.buckets) {
        for (const MicroBatch& mb : rank.micro_batches) {
          for (const Sequence& seq : mb.sequences) costs.push_back(seq.cost);
        }
      }
      // The same sequences, partitioned without the swaps.
      const double partition_only =
          Imbalance(costs, PartitionEqualCount(costs, shape.dp, algorithm));
      EXPECT_LE(plan.imbalance, partition_only * (1 + 1e-12)) << "step " << plan.step;
      lower += plan.imbalance < partition_only * (1 - 1e-9);
    }
    EXPECT_GT(lower, 0) << ToString(algorithm);
  }
}

// ---------------------------------------------------------------------------
// Vision cost term and multimodal documents (balance.cost.vision / mode).

// A text source and a multimodal one: every other document of `vlm` leads with
// min(len, 32 + row % 200) image tokens; rows 7 and 8 have more image tokens than
// `image_cap` (skipped when that exceeds seq_len).
std::vector<MemorySource> VisionSources(int64_t image_cap = 0) {
  auto text = Src("web", Constant(0.5), LongTailDocs(500, 21, 300, 2048, 1.2));
  auto vlm = Src("vlm", Constant(0.5), LongTailDocs(400, 22, 400, 2048, 0.9));
  vlm.image_tokens.resize(vlm.docs->size(), 0);
  for (size_t r = 0; r < vlm.image_tokens.size(); r += 2) {
    vlm.image_tokens[r] =
        std::min<int64_t>(int64_t((*vlm.docs)[r].size()), 32 + int64_t(r) % 200);
  }
  if (image_cap > 0) {
    for (size_t r : {size_t{7}, size_t{8}}) vlm.image_tokens[r] = image_cap;
  }
  return {std::move(text), std::move(vlm)};
}

TEST(PlannerVisionTest, MultimodalDocumentsAreNeverCutInsideTheirImages) {
  for (int64_t seq_len : {512, 1024, -512}) {
    const bool lever = seq_len < 0;  // split: even, max_piece: 128 (< many images)
    seq_len = std::abs(seq_len);
    auto sources = VisionSources(/*image_cap=*/seq_len + 1);
    Shape shape;
    shape.seq_len = seq_len;
    shape.sequences = 16;
    shape.dp = 4;
    shape.linear = 100;
    Config config = MakeConfig(sources, shape);
    config.balance.vision = 50;
    if (lever) {
      config.balance.split = BalanceConfig::Split::kEven;
      config.balance.max_piece = 128;
    }
    MemoryJob job(config, sources);
    const auto plans = job.Plan(60);
    ASSERT_EQ(plans.size(), 60u);
    const auto& images = sources[1].image_tokens;
    int64_t multimodal_pieces = 0, short_steps = 0, total = 0, vlm_total = 0;
    for (const StepPlan& plan : plans) {
      int64_t step_tokens = 0;
      std::vector<int64_t> by_source(2, 0);
      for (const BucketPlan& rank : plan.buckets) {
        for (const MicroBatch& mb : rank.micro_batches) {
          for (const Sequence& seq : mb.sequences) {
            double cost = 0;
            int64_t tokens = 0;
            for (const DocPiece& d : seq.docs) {
              EXPECT_GT(d.len, 0);
              const int64_t global = int64_t(d.file) * kRowsPerFile + d.row;
              const int64_t img = d.source == 1 ? images[size_t(global)] : 0;
              EXPECT_LE(img, seq_len) << "image tokens beyond seq_len are skipped";
              EXPECT_EQ(d.image_tokens, d.start == 0 ? img : 0);
              if (img > 0) {
                ++multimodal_pieces;
                // No cut inside the image tokens, none at all when the document fits.
                EXPECT_FALSE(d.start > 0 && d.start < img);
                EXPECT_GE(d.start + d.len, std::min(d.doc_tokens, img));
                if (d.doc_tokens <= seq_len) {
                  EXPECT_EQ(d.start, 0);
                  EXPECT_EQ(d.len, d.doc_tokens);
                }
              }
              if (lever && img == 0) EXPECT_LE(d.len, 128);
              cost += PieceCost(config.balance, d.len, d.image_tokens);
              tokens += d.len;
              by_source[size_t(d.source)] += d.len;
            }
            EXPECT_EQ(seq.tokens, tokens);
            EXPECT_LE(seq.tokens, seq_len);
            EXPECT_NEAR(seq.cost, cost, 1e-9 * std::max(1.0, cost));
            step_tokens += seq.tokens;
          }
        }
      }
      EXPECT_EQ(by_source, plan.source_tokens);
      EXPECT_LE(step_tokens, config.batch.global_tokens);
      if (step_tokens < config.batch.global_tokens) ++short_steps;
      total += step_tokens;
      vlm_total += by_source[1];
    }
    CheckCoverage(plans, config);
    EXPECT_GT(multimodal_pieces, 100);
    // Deferred documents leave a little padding; the carry keeps the shares on target.
    EXPECT_GT(double(total), 0.97 * 60 * double(config.batch.global_tokens));
    EXPECT_NEAR(double(vlm_total) / double(total), 0.5, 0.02);
    EXPECT_GE(plans.back().state_after.sources[1].skipped, 2);
    std::printf("seq_len %lld%s: %lld multimodal pieces, %lld of 60 steps short, fill %.4f\n",
                (long long)seq_len, lever ? " (even, max_piece 128)" : "",
                (long long)multimodal_pieces, (long long)short_steps,
                double(total) / (60.0 * double(config.batch.global_tokens)));
  }
}

// Only multimodal documents, each longer than half a sequence: a third of a step's
// documents find no sequence with room for them whole. They are cut after their image
// tokens (never inside), in a room that holds those, and counted in
// StepPlan::multimodal_cut. (A document whose image tokens no room holds waits for the
// next step: StepPlan::multimodal_deferred.)
TEST(PlannerVisionTest, DocumentsWithNoRoomAreCutAfterTheirImagesAndCounted) {
  constexpr int64_t kSeqLen = 512;
  auto docs = std::make_shared<Docs>();
  std::vector<int64_t> images;
  for (int64_t r = 0; r < 300; ++r) {
    const int64_t len = 300 + (r * 37) % 150;  // 300..449 tokens: one per sequence
    docs->push_back(std::vector<int32_t>(size_t(len), int32_t(7 + r)));
    images.push_back(20 + (r * 13) % 40);     // 20..59 image tokens, leading
  }
  auto vlm = Src("vlm", Constant(1.0), docs);
  vlm.image_tokens = images;
  std::vector<MemorySource> sources{vlm};
  Shape shape;
  shape.seq_len = kSeqLen;
  shape.sequences = 16;
  shape.dp = 4;
  const Config config = MakeConfig(sources, shape);
  MemoryJob job(config, sources);
  const auto plans = job.Plan(10);
  ASSERT_EQ(plans.size(), 10u);
  int64_t cut = 0;
  for (const StepPlan& plan : plans) {
    cut += plan.multimodal_cut;
    for (const BucketPlan& rank : plan.buckets) {
      for (const MicroBatch& mb : rank.micro_batches) {
        for (const Sequence& seq : mb.sequences) {
          EXPECT_LE(seq.tokens, kSeqLen);
          for (const DocPiece& d : seq.docs) {
            const int64_t img = images[size_t(int64_t(d.file) * kRowsPerFile + d.row)];
            EXPECT_FALSE(d.start > 0 && d.start < img) << "cut inside the image tokens";
            if (d.start == 0) EXPECT_GE(d.len, img);
          }
        }
      }
    }
  }
  CheckCoverage(plans, config);
  EXPECT_GT(cut, 10);  // ~10 of ~26 documents per step
}

TEST(PlannerVisionTest, HybridAddsTheVisionTermAndBackboneIgnoresIt) {
  auto sources = VisionSources();
  Shape shape;
  shape.seq_len = 1024;
  shape.sequences = 8;
  shape.dp = 2;
  Config hybrid = MakeConfig(sources, shape);
  hybrid.balance.vision = 1e4;
  Config backbone = hybrid;
  backbone.balance.cost_mode = BalanceConfig::CostMode::kBackbone;
  const auto a = MemoryJob(hybrid, sources).Plan(5);
  const auto b = MemoryJob(backbone, sources).Plan(5);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  double all_extra = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(PieceSet(a[i]), PieceSet(b[i]));  // the same documents, the same pieces
    double ca = 0, cb = 0, extra = 0;
    for (const BucketPlan& r : a[i].buckets) ca += r.cost;
    for (const BucketPlan& r : b[i].buckets) cb += r.cost;
    for (const BucketPlan& r : a[i].buckets) {
      for (const MicroBatch& mb : r.micro_batches) {
        for (const Sequence& s : mb.sequences) {
          for (const DocPiece& d : s.docs) extra += 1e4 * double(d.image_tokens);
        }
      }
    }
    all_extra += extra;
    EXPECT_NEAR(ca, cb + extra, 1e-9 * ca);
  }
  EXPECT_GT(all_extra, 0);
  EXPECT_EQ(PieceCost(hybrid.balance, 10, 3), 100 + 3e4);
  EXPECT_EQ(PieceCost(backbone.balance, 10, 3), 100);
}

TEST(PlannerVisionTest, ParsesVisionAndModeAndNamesBadValues) {
  const std::string base = R"(
batch: {global_tokens: 4096, seq_len: 1024}
sources:
  - {name: a, path: /x/a, tokens_column: t}
)";
  auto def = ParseConfig(base, "/");
  ASSERT_TRUE(def.ok()) << def.status().ToString();
  EXPECT_EQ(def->balance.vision, 0.0);
  EXPECT_EQ(def->balance.cost_mode, BalanceConfig::CostMode::kHybrid);
  auto ok = ParseConfig(base + "balance: {cost: {attn: 2, vision: 0.5, mode: backbone}}\n",
                        "/");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->balance.vision, 0.5);
  EXPECT_EQ(ok->balance.attn, 2.0);
  EXPECT_EQ(ok->balance.cost_mode, BalanceConfig::CostMode::kBackbone);
  for (const std::string bad : {"balance: {cost: {vision: -1}}\n",
                                "balance: {cost: {mode: vision}}\n"}) {
    auto r = ParseConfig(base + bad, "/");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("balance.cost.")) << r.status().ToString();
  }
}

TEST(PlannerVisionTest, TextOnlySourcesPlanAsBefore) {
  // Image tokens 0 everywhere and a vision coefficient: nothing changes.
  auto sources = ThreeSources();
  Shape shape;
  const Config base = MakeConfig(sources, shape);
  Config vision = base;
  vision.balance.vision = 123;
  EXPECT_EQ(MemoryJob(base, sources).PlanJson(10), MemoryJob(vision, sources).PlanJson(10));
}

TEST(PlannerVisionTest, ResumeWithMultimodalDocumentsContinuesExactly) {
  auto sources = VisionSources(/*image_cap=*/600);
  Shape shape;
  shape.seq_len = 512;
  const Config config = MakeConfig(sources, shape);
  const auto full = MemoryJob(config, sources).PlanJson(40);
  ASSERT_EQ(full.size(), 40u);
  for (int64_t cut : {1, 13, 27}) {
    MemoryJob first(config, sources);
    auto head = first.PlanJson(cut);
    auto restored = PlannerStateFromJson(PlannerStateToJson(first.planner().state(), config),
                                         config);
    ASSERT_TRUE(restored.ok()) << restored.status().ToString();
    MemoryJob second(config, sources, *restored);
    auto rest = second.PlanJson(40 - cut);
    head.insert(head.end(), rest.begin(), rest.end());
    EXPECT_EQ(head, full) << "cut at " << cut;
  }
  EXPECT_NE(full[0].find("\"img\":"), std::string::npos);
}

// Balancing on the hybrid cost beats balancing on the backbone alone when the vision
// encoder's work is large, measured with the hybrid cost.
TEST(PlannerVisionTest, HybridModeBalancesTheVisionWork) {
  auto sources = VisionSources();
  Shape shape;
  shape.seq_len = 1024;
  shape.sequences = 64;
  shape.dp = 16;
  shape.linear = 1024;
  for (double vision : {4.0 * 1024, 256.0 * 1024, 4.0 * 1024 * 1024}) {
    Config hybrid = MakeConfig(sources, shape);
    hybrid.balance.vision = vision;  // per image token (a text token's linear: 1024)
    Config backbone = hybrid;
    backbone.balance.cost_mode = BalanceConfig::CostMode::kBackbone;
    auto measured = [&](const StepPlan& plan) {
      double max_cost = 0, total = 0;
      for (const BucketPlan& r : plan.buckets) {
        double c = 0;
        for (const MicroBatch& mb : r.micro_batches) {
          for (const Sequence& s : mb.sequences) {
            for (const DocPiece& d : s.docs) {
              c += PieceCost(hybrid.balance, d.len, d.image_tokens);
            }
          }
        }
        max_cost = std::max(max_cost, c);
        total += c;
      }
      return max_cost / (total / double(plan.buckets.size()));
    };
    double h = 0, b = 0;
    const auto hp = MemoryJob(hybrid, sources).Plan(20);
    const auto bp = MemoryJob(backbone, sources).Plan(20);
    ASSERT_EQ(hp.size(), 20u);
    ASSERT_EQ(bp.size(), 20u);
    for (size_t i = 0; i < hp.size(); ++i) {
      h += measured(hp[i]) / 20;
      b += measured(bp[i]) / 20;
      EXPECT_NEAR(measured(hp[i]), hp[i].imbalance, 1e-9);
    }
    std::printf("vision %.0f: imbalance under the hybrid cost, mean of 20 steps (dp 16, "
                "4 seq/rank): hybrid %.4f, backbone %.4f\n", vision, h, b);
    EXPECT_LE(h, b);
  }
}

// ---------------------------------------------------------------------------
// Token slack (balance.slack): sequences packed short of L, pieces moved between ranks.

// Two sequences per rank (the hard case for balancing), linear = L.
Config SlackConfig(const std::vector<MemorySource>& sources, int64_t dp, double slack) {
  Shape shape;
  shape.seq_len = 512;
  shape.sequences = 2 * dp;
  shape.dp = dp;
  shape.linear = 512;
  Config config = MakeConfig(sources, shape);
  config.balance.slack = slack;
  return config;
}

TEST(PlannerSlackTest, BudgetLeavesTheSlackAndNoSequenceExceedsCapacity) {
  auto sources = ThreeSources();
  double mean_without = 0;
  for (double slack : {0.0, 0.02, 0.1}) {
    const Config config = SlackConfig(sources, /*dp=*/8, slack);
    const int64_t L = config.batch.seq_len;
    const int64_t fill = L - std::llround(slack * double(L));
    ASSERT_EQ(FillTokens(config.balance, L), fill);
    MemoryJob job(config, sources);
    const auto plans = job.Plan(30);
    ASSERT_EQ(plans.size(), 30u);
    int64_t over_fill = 0;  // sequences that received pieces beyond the fill
    double mean = 0;
    for (const StepPlan& plan : plans) {
      int64_t step_tokens = 0;
      std::vector<int64_t> by_source(config.sources.size(), 0);
      std::vector<double> rank_costs;
      for (const BucketPlan& rank : plan.buckets) {
        ASSERT_EQ(rank.micro_batches.size(), 2u);
        double rank_cost = 0;
        for (const MicroBatch& mb : rank.micro_batches) {
          for (const Sequence& seq : mb.sequences) {
            int64_t tokens = 0;
            double cost = 0;
            for (const DocPiece& d : seq.docs) {
              tokens += d.len;
              cost += PieceCost(config.balance, d.len);
              by_source[size_t(d.source)] += d.len;
            }
            EXPECT_EQ(seq.tokens, tokens);
            EXPECT_LE(seq.tokens, L) << "the capacity is hard";
            EXPECT_NEAR(seq.cost, cost, 1e-9 * cost);
            if (seq.tokens > fill) ++over_fill;
            step_tokens += seq.tokens;
            rank_cost += seq.cost;
          }
        }
        EXPECT_NEAR(rank.cost, rank_cost, 1e-9 * rank_cost);
        rank_costs.push_back(rank_cost);
      }
      // The budget is the slack's: exactly `fill` tokens per sequence on average.
      EXPECT_EQ(step_tokens, config.sequences_per_step() * fill);
      EXPECT_EQ(by_source, plan.source_tokens);
      const double max_cost = *std::max_element(rank_costs.begin(), rank_costs.end());
      double total = 0;
      for (double c : rank_costs) total += c;
      EXPECT_NEAR(plan.imbalance, max_cost / (total / double(rank_costs.size())), 1e-9);
      mean += plan.imbalance / double(plans.size());
    }
    CheckCoverage(plans, config);  // every document's tokens once, in order
    if (slack == 0) {
      EXPECT_EQ(over_fill, 0);
      mean_without = mean;
    } else {
      EXPECT_GT(over_fill, 0) << "pieces moved into the slack";
      EXPECT_LT(mean, mean_without) << "slack " << slack;
    }
    std::printf("slack %.2f: mean imbalance %.4f, %lld sequences past the fill\n", slack,
                mean, (long long)over_fill);
  }
}

TEST(PlannerSlackTest, DocumentsOfEachStepDoNotDependOnDp) {
  auto sources = ThreeSources();
  std::vector<std::vector<StepPlan>> runs;
  for (int64_t dp : {1, 2, 4, 8}) {
    Config config = SlackConfig(sources, /*dp=*/dp, /*slack=*/0.05);
    config.batch.global_tokens = 16 * config.batch.seq_len;  // 16 sequences at any dp
    runs.push_back(MemoryJob(config, sources).Plan(20));
    ASSERT_EQ(runs.back().size(), 20u);
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    for (size_t step = 0; step < 20; ++step) {
      EXPECT_EQ(PieceSet(runs[r][step]), PieceSet(runs[0][step])) << "step " << step;
      EXPECT_EQ(runs[r][step].source_tokens, runs[0][step].source_tokens);
      EXPECT_EQ(runs[r][step].state_after, runs[0][step].state_after);
    }
  }
}

TEST(PlannerSlackTest, SameConfigSamePlansAndResumeContinuesExactly) {
  auto sources = ThreeSources();
  const Config config = SlackConfig(sources, /*dp=*/8, /*slack=*/0.05);
  const auto a = MemoryJob(config, sources).PlanJson(12);
  const auto b = MemoryJob(config, sources).PlanJson(12);
  EXPECT_EQ(a, b);
  MemoryJob first(config, sources);
  const auto head = first.Plan(5);
  ASSERT_EQ(head.size(), 5u);
  MemoryJob resumed(config, sources, head.back().state_after);
  const auto rest = resumed.PlanJson(7);
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i], a[5 + i]) << "step " << 5 + i;
  }
}

TEST(PlannerSlackTest, MultimodalDocumentsStayWholeWithSlack) {
  auto sources = VisionSources();
  Shape shape;
  shape.seq_len = 1024;
  shape.sequences = 16;
  shape.dp = 8;
  shape.linear = 1024;
  Config config = MakeConfig(sources, shape);
  config.balance.slack = 0.05;
  MemoryJob job(config, sources);
  const auto plans = job.Plan(30);
  ASSERT_EQ(plans.size(), 30u);
  int64_t multimodal = 0;
  for (const StepPlan& plan : plans) {
    for (const BucketPlan& rank : plan.buckets) {
      for (const MicroBatch& mb : rank.micro_batches) {
        for (const Sequence& seq : mb.sequences) {
          EXPECT_LE(seq.tokens, shape.seq_len);
          for (const DocPiece& d : seq.docs) {
            const int64_t global = int64_t(d.file) * kRowsPerFile + d.row;
            if (d.source == 1 && sources[1].image_tokens[size_t(global)] > 0 &&
                d.doc_tokens <= shape.seq_len) {
              ++multimodal;
              EXPECT_EQ(d.start, 0);
              EXPECT_EQ(d.len, d.doc_tokens);
            }
          }
        }
      }
    }
  }
  CheckCoverage(plans, config);
  EXPECT_GT(multimodal, 100);
}

TEST(PlannerSlackTest, ParsesSlackAndNamesBadValues) {
  const std::string base = R"(
batch: {global_tokens: 4096, seq_len: 1024}
sources:
  - {name: a, path: /x/a, tokens_column: t}
)";
  auto def = ParseConfig(base, "/");
  ASSERT_TRUE(def.ok()) << def.status().ToString();
  EXPECT_EQ(def->balance.slack, 0.0);
  auto ok = ParseConfig(base + "balance: {slack: 0.05}\n", "/");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->balance.slack, 0.05);
  EXPECT_EQ(FillTokens(ok->balance, 1024), 1024 - 51);
  for (const std::string bad : {"balance: {slack: -0.1}\n", "balance: {slack: 0.5}\n",
                                "balance: {slack: lots}\n"}) {
    auto r = ParseConfig(base + bad, "/");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("balance.slack"))
        << r.status().ToString();
  }
}


// ---------------------------------------------------------------------------
// Multimodal documents under every cut (issue: an image-caption source failed after a few
// steps because the last documents of a step found no room whole and one was packed like
// text, its image cut by a sequence boundary). The draw places each multimodal document
// as it takes it; one that has no room for its image tokens waits for the next step.

// Image-caption documents: row r leads with 1..max_images images of 16..64 placeholder
// tokens each, then its caption (lengths from `caption`). image_tokens per row.
MemorySource ImageCaptions(std::string name, double weight, int64_t rows, uint64_t seed,
                           int64_t max_images, const testing::LengthSpec& caption) {
  auto captions = testing::RandomDocs(rows, caption, seed, /*vocab=*/30000);
  auto docs = std::make_shared<Docs>();
  std::vector<int64_t> images;
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  auto next = [&](int64_t n) {  // SplitMix64, platform-independent
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return int64_t((z ^ (z >> 31)) % uint64_t(n));
  };
  for (int64_t r = 0; r < rows; ++r) {
    int64_t img = 0;
    for (int64_t k = 0, n = 1 + next(max_images); k < n; ++k) img += 16 + next(49);
    std::vector<int32_t> doc(size_t(img), 31999);  // the placeholder id
    doc.insert(doc.end(), captions[size_t(r)].begin(), captions[size_t(r)].end());
    docs->push_back(std::move(doc));
    images.push_back(img);
  }
  MemorySource s = Src(std::move(name), Constant(weight), std::move(docs));
  s.image_tokens = std::move(images);
  return s;
}

struct MultimodalCase {
  std::string name;
  int64_t seq_len = 8192;
  int64_t sequences = 4;
  int64_t dp = 1;
  int64_t mbs = 1;
  BalanceAlgorithm algorithm = BalanceAlgorithm::kKarmarkarKarp;
  BalanceConfig::Split split = BalanceConfig::Split::kBoundary;
  int64_t max_piece = 0;
  double slack = 0;
  bool text = false;           // a text source beside the captions (0.5 / 0.5)
  bool long_captions = false;  // captions up to 3 * seq_len (oversize: split)
  int64_t max_images = 1;
  int64_t phase_len = 0;       // > 0: steps [0, 10) at this seq_len
};

Config MultimodalConfig(const MultimodalCase& c, const std::vector<MemorySource>& sources) {
  Shape shape;
  shape.seq_len = c.seq_len;
  shape.sequences = c.sequences;
  shape.dp = c.dp;
  shape.mbs = c.mbs;
  shape.algorithm = c.algorithm;
  shape.linear = 64;
  Config config = MakeConfig(sources, shape);
  config.balance.split = c.split;
  config.balance.max_piece = c.max_piece;
  config.balance.slack = c.slack;
  config.balance.vision = 16;
  if (c.phase_len > 0) {
    PhaseConfig phase;
    phase.until_step = 10;
    phase.seq_len = c.phase_len;
    phase.weights.resize(config.sources.size());
    config.phases.push_back(phase);
  }
  EXPECT_TRUE(ValidateConfig(config).ok()) << ValidateConfig(config).ToString();
  return config;
}

std::vector<MemorySource> MultimodalSources(const MultimodalCase& c) {
  testing::LengthSpec caption;
  caption.median_tokens = c.long_captions ? double(c.seq_len) / 3 : 12;
  caption.sigma = c.long_captions ? 1.2 : 0.4;
  caption.max_tokens = c.long_captions ? 3 * c.seq_len : 40;
  std::vector<MemorySource> out;
  if (c.text) out.push_back(Src("web", Constant(0.5), LongTailDocs(500, 31, 300, 4096, 1.2)));
  out.push_back(ImageCaptions("captions", c.text ? 0.5 : 1.0, 700, 32, c.max_images, caption));
  return out;
}

class MultimodalCutsTest : public ::testing::TestWithParam<MultimodalCase> {};

TEST_P(MultimodalCutsTest, ImageTokensAreNeverCutAndDeferralsResumeExactly) {
  const MultimodalCase c = GetParam();
  const auto sources = MultimodalSources(c);
  const Config config = MultimodalConfig(c, sources);
  const size_t vlm = sources.size() - 1;
  const auto& images = sources[vlm].image_tokens;
  constexpr int64_t kSteps = 24;
  MemoryJob job(config, sources);
  const auto plans = job.Plan(kSteps);
  ASSERT_EQ(plans.size(), size_t(kSteps));
  int64_t deferred = 0, cut = 0, total = 0, vlm_total = 0, multimodal_heads = 0;
  for (const StepPlan& plan : plans) {
    const int64_t L = config.SeqLenAt(plan.step);
    int64_t fitting_cut = 0;
    for (const BucketPlan& rank : plan.buckets) {
      for (const MicroBatch& mb : rank.micro_batches) {
        for (const Sequence& seq : mb.sequences) {
          EXPECT_LE(seq.tokens, L);
          for (const DocPiece& d : seq.docs) {
            total += d.len;
            if (size_t(d.source) != vlm) continue;
            vlm_total += d.len;
            const int64_t img = images[size_t(int64_t(d.file) * kRowsPerFile + d.row)];
            ASSERT_LE(img, L);
            EXPECT_FALSE(d.start > 0 && d.start < img)
                << "step " << plan.step << ": a piece starts inside the image tokens";
            if (d.start == 0) {
              ++multimodal_heads;
              EXPECT_EQ(d.image_tokens, img);
              EXPECT_GE(d.len, img) << "step " << plan.step << ": image tokens cut";
              if (d.doc_tokens <= L && d.len < d.doc_tokens) ++fitting_cut;
            }
          }
        }
      }
    }
    EXPECT_LE(fitting_cut, plan.multimodal_cut) << "step " << plan.step;
    deferred += plan.multimodal_deferred;
    cut += plan.multimodal_cut;
  }
  CheckCoverage(plans, config);
  EXPECT_GT(multimodal_heads, 50);
  EXPECT_GT(deferred, 0);  // every step of a multimodal source ends with one
  // Deferrals leave little padding, and the carry keeps the share on target.
  EXPECT_GT(double(total), 0.9 * double(kSteps * config.batch.global_tokens));
  if (c.text) EXPECT_NEAR(double(vlm_total) / double(total), 0.5, 0.05);
  // The stream is a pure function of (seed, state): resume from a mid-run state.
  const auto full = MemoryJob(config, sources).PlanJson(kSteps);
  for (int64_t at : {int64_t{7}, int64_t{13}}) {
    MemoryJob first(config, sources);
    auto head = first.PlanJson(at);
    auto state = PlannerStateFromJson(PlannerStateToJson(first.planner().state(), config),
                                      config);
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    MemoryJob second(config, sources, *state);
    auto tail = second.PlanJson(kSteps - at);
    head.insert(head.end(), tail.begin(), tail.end());
    ASSERT_EQ(head.size(), full.size());
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_EQ(head[i], full[i]) << "resumed at " << at << ", step " << i;
    }
  }
  std::printf("%s: %lld deferred, %lld cut after their images, fill %.4f\n",
              c.name.c_str(), (long long)deferred, (long long)cut,
              double(total) / double(kSteps * config.batch.global_tokens));
}

// Small image documents of a first source spread over every sequence and leave no room
// for the large images (0.6 * L) of a second source; that source draws first after it
// defers, so its documents are planned at its share instead of waiting forever.
TEST(PlannerVisionTest, ASourceThatDeferredDrawsFirstAndIsNotStarved) {
  constexpr int64_t kSeqLen = 1024;
  testing::LengthSpec caption;
  caption.median_tokens = 8;
  caption.sigma = 0.3;
  caption.max_tokens = 16;
  MemorySource small = ImageCaptions("icons", 0.7, 800, 41, /*max_images=*/1, caption);
  auto docs = std::make_shared<Docs>();
  std::vector<int64_t> images;
  for (int64_t r = 0; r < 200; ++r) {
    const int64_t img = 600 + r % 40;
    std::vector<int32_t> doc(size_t(img), 31999);
    doc.resize(size_t(img + 20 + r % 30), 5);
    docs->push_back(std::move(doc));
    images.push_back(img);
  }
  MemorySource large = Src("figures", Constant(0.3), docs);
  large.image_tokens = images;
  const std::vector<MemorySource> sources{small, large};
  Shape shape;
  shape.seq_len = kSeqLen;
  shape.sequences = 8;
  shape.dp = 2;
  const Config config = MakeConfig(sources, shape);
  MemoryJob job(config, sources);
  const auto plans = job.Plan(40);
  ASSERT_EQ(plans.size(), 40u);
  int64_t total = 0, large_tokens = 0;
  for (const StepPlan& plan : plans) {
    for (int64_t t : plan.source_tokens) total += t;
    large_tokens += plan.source_tokens[1];
  }
  CheckCoverage(plans, config);
  EXPECT_NEAR(double(large_tokens) / double(total), 0.3, 0.05);
  for (const auto& c : plans.back().state_after.sources) {
    EXPECT_LT(std::abs(c.carry), 2.0 * double(config.batch.global_tokens));
  }
}

MultimodalCase Case(std::string name, std::function<void(MultimodalCase*)> edit) {
  MultimodalCase c;
  c.name = std::move(name);
  edit(&c);
  return c;
}

// A text source beside captions of up to 3 * seq_len, 16 sequences of 1024 over dp 4.
MultimodalCase Mixed(std::string name, std::function<void(MultimodalCase*)> edit) {
  return Case(std::move(name), [&](MultimodalCase* c) {
    c->seq_len = 1024;
    c->sequences = 16;
    c->dp = 4;
    c->text = true;
    c->long_captions = true;
    edit(c);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Levers, MultimodalCutsTest,
    ::testing::Values(
        // The reported case: short captions of one image, one source, 4 sequences.
        Case("short_captions_only", [](MultimodalCase*) {}),
        Case("several_images", [](MultimodalCase* c) { c->max_images = 4; }),
        Case("with_text", [](MultimodalCase* c) { c->text = true; }),
        Mixed("long_captions_with_text", [](MultimodalCase* c) { c->max_images = 3; }),
        Mixed("long_captions_only",
              [](MultimodalCase* c) {
                c->seq_len = 512;
                c->text = false;
              }),
        Mixed("even_split_max_piece",
              [](MultimodalCase* c) {
                c->split = BalanceConfig::Split::kEven;
                c->max_piece = 96;
              }),
        Mixed("boundary_max_piece", [](MultimodalCase* c) { c->max_piece = 128; }),
        Mixed("slack", [](MultimodalCase* c) { c->slack = 0.05; }),
        Mixed("greedy_mbs2",
              [](MultimodalCase* c) {
                c->dp = 2;
                c->mbs = 2;
                c->long_captions = false;
                c->algorithm = BalanceAlgorithm::kGreedy;
              }),
        Mixed("in_order", [](MultimodalCase* c) { c->algorithm = BalanceAlgorithm::kNone; }),
        Mixed("phases",
              [](MultimodalCase* c) {
                c->max_images = 2;
                c->phase_len = 256;
              })),
    [](const ::testing::TestParamInfo<MultimodalCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------
// Shares exact over time (mix.exact: time, the default): whole documents per step,
// every source's cumulative tokens within two sequence lengths of its share.

// Checks, at every step, each source's tokens so far against its share of the tokens
// planned, computed here from the config's weights: |received - share| <= 2 * the
// longest seq_len so far, and the plan's carry is share less received. Returns the
// largest |received - share| / longest seq_len.
double CheckDrift(const std::vector<StepPlan>& plans, const Config& config) {
  const size_t n = config.sources.size();
  std::vector<double> received(n, 0.0), share(n, 0.0);
  int64_t longest = 0;
  double worst = 0;
  for (const StepPlan& plan : plans) {
    longest = std::max(longest, plan.seq_len);
    double total_weight = 0, tokens = 0;
    for (size_t i = 0; i < n; ++i) total_weight += config.WeightAt(i, plan.step);
    for (size_t i = 0; i < n; ++i) tokens += double(plan.source_tokens[i]);
    for (size_t i = 0; i < n; ++i) {
      received[i] += double(plan.source_tokens[i]);
      share[i] += config.WeightAt(i, plan.step) / total_weight * tokens;
      const double drift = received[i] - share[i];
      EXPECT_LE(std::abs(drift), 2.0 * double(longest))
          << "step " << plan.step << " source " << config.sources[i].name;
      EXPECT_NEAR(-plan.state_after.sources[i].carry, drift, 1e-6 * (1 + share[i]))
          << "step " << plan.step << " source " << i;
      worst = std::max(worst, std::abs(drift) / double(longest));
    }
  }
  return worst;
}

struct DriftCase {
  std::string name;
  int sources = 3;         // ThreeSources, or this many long-tail sources (Zipf weights)
  bool schedules = false;  // linear and stepwise schedules, a source off and on again
  bool phases = false;     // seq_len 128, then 2048, then 512
  int64_t max_piece = 0;
  BalanceConfig::Split split = BalanceConfig::Split::kBoundary;
};

class PlannerDriftTest : public ::testing::TestWithParam<DriftCase> {};

TEST_P(PlannerDriftTest, DriftWithinTwoSeqLensAtEveryStep) {
  const DriftCase c = GetParam();
  std::vector<MemorySource> sources;
  if (c.sources == 3) {
    sources = ThreeSources();
  } else {
    for (int k = 0; k < c.sources; ++k) {
      sources.push_back(Src("s" + std::to_string(k), Constant(1.0 / (k + 1)),
                            LongTailDocs(300, 40 + uint64_t(k),
                                         60.0 * std::pow(1.25, k % 20), 6000, 1.0)));
    }
  }
  if (c.schedules) {
    sources[0].weight = WeightSchedule{{{0, 0.8}, {60, 0.1}}};    // falls
    sources[1].weight = WeightSchedule{{{20, 0.05}, {90, 0.6}}};  // rises
    WeightSchedule off{{{0, 0.2}, {30, 0.0}, {50, 0.3}, {70, 0.02}}};
    off.stepwise = true;  // off at step 30, on again at 50, low from 70
    sources[2].weight = off;
  }
  Shape shape;
  shape.seq_len = 512;
  shape.sequences = 16;
  shape.dp = 4;
  Config config = MakeConfig(sources, shape);
  config.balance.max_piece = c.max_piece;
  config.balance.split = c.split;
  if (c.phases) {
    PhaseConfig shorter;  // steps [0, 40): 64 sequences of 128 tokens
    shorter.until_step = 40;
    shorter.seq_len = 128;
    shorter.weights.resize(config.sources.size());
    PhaseConfig longer;  // [40, 80): 4 sequences of 2048, the first source at 0.05
    longer.until_step = 80;
    longer.seq_len = 2048;
    longer.weights.resize(config.sources.size());
    longer.weights[0] = Constant(0.05);
    config.phases = {shorter, longer};  // then 512 again
  }
  ASSERT_TRUE(ValidateConfig(config).ok()) << ValidateConfig(config).ToString();
  MemoryJob job(config, sources);
  const auto plans = job.Plan(120);
  ASSERT_EQ(plans.size(), 120u);
  const double worst = CheckDrift(plans, config);
  const DocLookup lookup = [&](int32_t s, int32_t f, int64_t r) -> const auto& {
    return job.Doc(s, f, r);
  };
  for (const auto& plan : plans) CheckStepShape(plan, config, lookup);
  CheckCoverage(plans, config);
  if (c.max_piece > 0) {
    for (const auto& plan : plans) {
      for (const auto& p : PieceSet(plan)) EXPECT_LE(std::get<5>(p), c.max_piece);
    }
  }
  std::printf("[ drift ] %s: largest |drift| %.2f x the longest seq_len so far\n",
              c.name.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(
    Mixes, PlannerDriftTest,
    ::testing::Values(DriftCase{"constant"}, DriftCase{"schedules", 3, true},
                      DriftCase{"phases", 3, false, true},
                      DriftCase{"schedules_and_phases", 3, true, true},
                      DriftCase{"forty_sources", 40},
                      DriftCase{"forty_sources_schedules_phases", 40, true, true},
                      DriftCase{"max_piece", 3, true, true, 200},
                      DriftCase{"even", 3, true, true, 300, BalanceConfig::Split::kEven},
                      DriftCase{"aligned", 3, true, true, 0,
                                BalanceConfig::Split::kAligned}),
    [](const auto& info) { return info.param.name; });

// Per source: sum of the context figures of a run's pieces (ContextOf), and of what the
// plans report.
struct Context {
  int64_t context = 0, bound = 0, reported_context = 0, reported_bound = 0;
  double ratio() const { return double(context) / double(std::max<int64_t>(bound, 1)); }
};
std::vector<Context> ContextOfRun(const std::vector<StepPlan>& plans, size_t sources) {
  std::vector<Context> out(sources);
  for (const StepPlan& plan : plans) {
    for (size_t s = 0; s < sources; ++s) {
      out[s].reported_context += plan.source_context[s];
      out[s].reported_bound += plan.source_bound[s];
    }
    for (const BucketPlan& rank : plan.buckets) {
      for (const MicroBatch& mb : rank.micro_batches) {
        for (const Sequence& seq : mb.sequences) {
          for (const DocPiece& d : seq.docs) {
            const PieceContext c = ContextOf(d.start, d.len, plan.seq_len);
            out[size_t(d.source)].context += c.context;
            out[size_t(d.source)].bound += c.bound;
          }
        }
      }
    }
  }
  return out;
}

// A source of 2% weight whose documents are longer than its share of a step (328 tokens):
// per-step quotas cut each into pieces of about that share; shares exact over time keep
// those that fit a sequence whole and cut the longer ones only every seq_len tokens.
TEST(PlannerTimeTest, LowWeightLongDocumentSourceKeepsWholeDocuments) {
  constexpr int64_t kSeqLen = 1024;
  std::vector<MemorySource> sources{
      Src("web", Constant(0.98), LongTailDocs(4000, 51, 200, 2048, 1.0)),
      Src("books", Constant(0.02), LongTailDocs(300, 52, 900, 3 * kSeqLen, 0.6)),
  };
  Shape shape;
  shape.seq_len = kSeqLen;
  shape.sequences = 16;
  shape.dp = 4;
  double per_step_ratio = 0;
  for (const auto mode : {MixConfig::Exact::kStep, MixConfig::Exact::kTime}) {
    for (const auto split :
         {BalanceConfig::Split::kBoundary, BalanceConfig::Split::kAligned}) {
      Config config = MakeConfig(sources, shape);
      config.mix.exact = mode;
      config.balance.split = split;
      MemoryJob job(config, sources);
      const auto plans = job.Plan(300);
      ASSERT_EQ(plans.size(), 300u);
      CheckCoverage(plans, config);
      // The books' documents planned in full, their pieces per document.
      std::map<DocKey, std::vector<std::pair<int64_t, int64_t>>> books;
      std::map<DocKey, int64_t> doc_tokens;
      for (const StepPlan& plan : plans) {
        for (const BucketPlan& rank : plan.buckets) {
          for (const MicroBatch& mb : rank.micro_batches) {
            for (const Sequence& seq : mb.sequences) {
              for (const DocPiece& d : seq.docs) {
                if (d.source != 1) continue;
                const DocKey key{d.source, d.file, d.row, d.epoch};
                books[key].emplace_back(d.start, d.len);
                doc_tokens[key] = d.doc_tokens;

              }
            }
          }
        }
      }
      int64_t fitting = 0, whole = 0, long_pieces = 0, aligned = 0;
      for (auto& [key, pieces] : books) {
        if (doc_tokens[key] <= kSeqLen) {
          ++fitting;
          whole += pieces.size() == 1;
        } else {
          for (const auto& [start, len] : pieces) {
            ++long_pieces;
            aligned += start % kSeqLen == 0;
          }
        }
      }
      const auto context = ContextOfRun(plans, 2);
      for (const Context& c : context) {
        EXPECT_EQ(c.reported_context, c.context);  // the plans report what they hold
        EXPECT_EQ(c.reported_bound, c.bound);
      }
      const double ratio = context[1].ratio();
      std::printf("[ books ] %s, split %s: %lld of %lld fitting documents whole, %lld of "
                  "%lld pieces of longer ones at multiples of seq_len, context / bound "
                  "%.3f (web %.3f)\n",
                  mode == MixConfig::Exact::kStep ? "step" : "time",
                  split == BalanceConfig::Split::kAligned ? "aligned" : "boundary",
                  (long long)whole, (long long)fitting, (long long)aligned,
                  (long long)long_pieces, ratio, context[0].ratio());
      ASSERT_GT(fitting, 20);
      if (mode == MixConfig::Exact::kStep) {
        EXPECT_LT(whole, fitting / 4);
        EXPECT_LT(ratio, 0.6);
        per_step_ratio = ratio;
        continue;
      }
      EXPECT_GE(double(whole), 0.95 * double(fitting));
      EXPECT_GT(ratio, per_step_ratio + 0.5);
      if (split == BalanceConfig::Split::kAligned) {  // the most context
        EXPECT_GE(double(aligned), 0.9 * double(long_pieces));
        EXPECT_GE(ratio, 0.97);
      } else {  // longer documents cut every seq_len from a phase
        EXPECT_GE(ratio, 0.9);
      }
    }
  }
}

// Under the time accounting the levers choose the units a step takes: no piece above
// the cap, `even` pieces at its near-equal points, every sequence full.
TEST(PlannerTimeTest, LeversCapPiecesAndCutAtTheirPoints) {
  auto sources = ThreeSources();
  Shape shape;
  shape.seq_len = 512;
  shape.sequences = 16;
  shape.dp = 4;
  for (const auto& [split, max_piece] :
       std::vector<std::pair<BalanceConfig::Split, int64_t>>{
           {BalanceConfig::Split::kEven, 0},
           {BalanceConfig::Split::kEven, 200},
           {BalanceConfig::Split::kBoundary, 256},
           {BalanceConfig::Split::kAligned, 256}}) {
    Config config = MakeConfig(sources, shape);
    config.balance.split = split;
    config.balance.max_piece = max_piece;
    MemoryJob job(config, sources);
    const auto plans = job.Plan(30);
    ASSERT_EQ(plans.size(), 30u);
    const int64_t cap = max_piece > 0 ? max_piece : shape.seq_len;
    int64_t at_points = 0, cut_pieces = 0;
    for (const auto& plan : plans) {
      CheckStepShape(plan, config, [&](int32_t s, int32_t f, int64_t r) -> const auto& {
        return job.Doc(s, f, r);
      });
      for (const auto& rank : plan.buckets) {
        for (const auto& mb : rank.micro_batches) {
          for (const auto& seq : mb.sequences) {
            for (const DocPiece& d : seq.docs) {
              EXPECT_LE(d.len, cap);
              if (d.doc_tokens <= cap) continue;
              ++cut_pieces;
              // A piece's start is one of the lever's cut points (or where a step or a
              // sequence ended, the rare exception).
              const int64_t n = (d.doc_tokens + cap - 1) / cap;
              bool point = d.start == 0;
              for (int64_t k = 1; k < n && !point; ++k) {
                if (split == BalanceConfig::Split::kEven) {
                  point = d.start == k * d.doc_tokens / n;
                } else if (split == BalanceConfig::Split::kAligned) {
                  point = d.start == k * cap;
                } else {
                  point = true;  // boundary: every cap tokens from a phase
                }
              }
              at_points += point;
            }
          }
        }
      }
    }
    CheckCoverage(plans, config);
    EXPECT_GT(cut_pieces, 50);
    EXPECT_GE(double(at_points), 0.75 * double(cut_pieces));
  }
}

// Resume anywhere inside a run with schedules, phases and long documents under the time
// accounting: the resumed plans equal the uninterrupted run's, byte for byte at the same
// dp, and with the same pieces at another dp.
TEST(PlannerTimeTest, ResumeMidRunEqualsTheUninterruptedRun) {
  auto sources = ThreeSources();
  sources[0].weight = WeightSchedule{{{0, 0.7}, {30, 0.2}}};
  WeightSchedule off{{{0, 0.1}, {10, 0.0}, {20, 0.4}}};
  off.stepwise = true;
  sources[2].weight = off;
  for (Oversize oversize : {Oversize::kSplit, Oversize::kTruncate, Oversize::kSkip}) {
    for (auto& s : sources) s.oversize = oversize;
    Shape shape;
    shape.seq_len = 512;
    shape.sequences = 16;
    shape.dp = 4;
    Config config = MakeConfig(sources, shape);
    PhaseConfig phase;
    phase.until_step = 15;
    phase.seq_len = 128;
    phase.weights.resize(3);
    config.phases = {phase};
    ASSERT_TRUE(ValidateConfig(config).ok());
    const auto full = MemoryJob(config, sources).Plan(40);
    ASSERT_EQ(full.size(), 40u);
    int inside = 0;
    for (int64_t cut : {1, 9, 14, 15, 16, 27}) {
      MemoryJob first(config, sources);
      first.Plan(cut);
      for (const auto& c : first.planner().state().sources) inside += c.head_start > 0;
      const std::string saved = PlannerStateToJson(first.planner().state(), config);
      for (int64_t dp : {4, 2}) {
        Config other = config;
        ASSERT_TRUE(SetDataParallel(&other, dp).ok());
        auto state = PlannerStateFromJson(saved, other);
        ASSERT_TRUE(state.ok()) << state.status().ToString();
        const auto tail = MemoryJob(other, sources, *state).Plan(40 - cut);
        ASSERT_EQ(tail.size(), size_t(40 - cut));
        for (size_t i = 0; i < tail.size(); ++i) {
          const StepPlan& want = full[size_t(cut) + i];
          if (dp == 4) {
            EXPECT_EQ(StepPlanToJson(tail[i], other), StepPlanToJson(want, config))
                << ToString(oversize) << " cut " << cut << " step " << want.step;
          } else {
            EXPECT_EQ(PieceSet(tail[i]), PieceSet(want)) << "dp 2, step " << want.step;
          }
          EXPECT_EQ(tail[i].state_after, want.state_after);
        }
      }
    }
    if (oversize == Oversize::kSplit) {
      EXPECT_GT(inside, 0);  // some states are inside a document
    }
  }
}

// A state saved before the time accounting (version 1) is refused under it, naming
// state.version and what to do; under mix.exact: step it resumes as it was saved.
TEST(PlannerTimeTest, AStateOfVersionOneIsRefusedUnlessPerStep) {
  auto sources = ThreeSources();
  const Config time = MakeConfig(sources, Shape{});
  const Config step = PerStep(time);
  MemoryJob first(step, sources);
  first.Plan(6);
  std::string v1 = PlannerStateToJson(first.planner().state(), step);
  const std::string v2 = v1;
  const std::string tag = "\"version\":" + std::to_string(kStateVersion);
  ASSERT_NE(v1.find(tag), std::string::npos);
  v1.replace(v1.find(tag), tag.size(), "\"version\":1");
  auto refused = PlannerStateFromJson(v1, time);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), ::testing::StartsWith("state.version: 1: "));
  EXPECT_THAT(refused.status().message(), HasSubstr("mix: {exact: step}"));
  ASSERT_NE(GetErrorDetail(refused.status()), nullptr);
  EXPECT_EQ(GetErrorDetail(refused.status())->kind(), ErrorKind::kConfig);
  for (const std::string bad : {"3", "0", "\"2\""}) {
    std::string other = v2;
    other.replace(other.find(tag), tag.size(), "\"version\":" + bad);
    auto st = PlannerStateFromJson(other, time).status();
    EXPECT_THAT(st.message(), ::testing::StartsWith("state.version: must be 2")) << bad;
  }
  auto accepted = PlannerStateFromJson(v1, step);
  ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
  const auto full = MemoryJob(step, sources).PlanJson(12);
  const auto tail = MemoryJob(step, sources, *accepted).PlanJson(6);
  ASSERT_EQ(tail.size(), 6u);
  for (size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(tail[i], full[6 + i]) << i;
}

TEST(PlannerTimeTest, ParsesMixExactAndNamesBadValues) {
  const std::string base = R"(
batch: {global_tokens: 4096, seq_len: 1024}
sources:
  - {name: a, path: /x/a, tokens_column: t}
)";
  auto def = ParseConfig(base, "/");
  ASSERT_TRUE(def.ok()) << def.status().ToString();
  EXPECT_EQ(def->mix.exact, MixConfig::Exact::kTime);
  auto step = ParseConfig(base + "mix: {exact: step}\nbalance: {split: aligned}\n", "/");
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(step->mix.exact, MixConfig::Exact::kStep);
  EXPECT_EQ(step->balance.split, BalanceConfig::Split::kAligned);
  EXPECT_EQ(step->Fingerprint(), def->Fingerprint());  // resumable under either
  for (const auto& [bad, key] : std::vector<std::pair<std::string, std::string>>{
           {"mix: {exact: always}\n", "mix.exact"},
           {"mix: {exact: [time]}\n", "mix.exact"},
           {"mix: {weights: 1}\n", "mix.weights"},
           {"mix: time\n", "mix"}}) {
    auto r = ParseConfig(base + bad, "/");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), ::testing::StartsWith(key))
        << r.status().ToString();
  }
}

// Per-step quotas still resume exactly (the accounting kept behind mix.exact: step).
TEST(PlannerTimeTest, PerStepAccountingResumesExactly) {
  auto sources = ThreeSources();
  Shape shape;
  shape.seq_len = 256;
  const Config config = PerStep(MakeConfig(sources, shape));
  const auto full = MemoryJob(config, sources).PlanJson(20);
  MemoryJob first(config, sources);
  auto head = first.PlanJson(7);
  auto state =
      PlannerStateFromJson(PlannerStateToJson(first.planner().state(), config), config);
  ASSERT_TRUE(state.ok());
  auto tail = MemoryJob(config, sources, *state).PlanJson(13);
  head.insert(head.end(), tail.begin(), tail.end());
  EXPECT_EQ(head, full);
}

}  // namespace
}  // namespace braid
