// Planner time per step at scale: dp=1024, 306 (and 1,000) sources, ~16k sequences per
// step, metadata only (no payloads), as `braid plan` runs it.
//
// The streams are a metadata-only SampleStream over one shared table of long-tail document
// lengths (testing::RandomDocs lengths), each source in its own seeded order; MemoryStream
// would copy every document's tokens per source, gigabytes at 1,000 sources.
//
// The Time column is milliseconds per planned step (wall; CPU beside it), the plan's
// destruction included; the label names the balancing. BM_StreamsOnly times the same
// streams read alone: the part of a step that is the harness's metadata, not planning.
//
//   BRAID_BUILD_BENCHMARKS=ON scripts/dev-build build/mine
//   build/mine/planner_benchmark
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "braid/plan/planner.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/util/rng_internal.h"

namespace braid {
namespace {

// Lengths only; Next() hands out metadata in a per-source seeded order, one window per
// epoch (the planner never looks at windows).
class LengthStream : public SampleStream {
 public:
  LengthStream(std::shared_ptr<const std::vector<int64_t>> lengths, int32_t source,
               uint64_t seed)
      : lengths_(std::move(lengths)), source_(source), seed_(seed) {}

  Result<Sample> Next() override {
    if (order_.empty() || offset_ == int64_t(order_.size())) {
      if (!order_.empty()) ++epoch_;
      order_ = internal::Permutation(
          int64_t(lengths_->size()),
          internal::DeriveSeed({seed_, uint64_t(source_), uint64_t(epoch_)}));
      offset_ = 0;
    }
    const int64_t row = order_[size_t(offset_)];
    Sample s;
    s.meta.source = source_;
    s.meta.file = static_cast<int32_t>(row / 1000);
    s.meta.row = row % 1000;
    s.meta.epoch = epoch_;
    s.meta.tokens = (*lengths_)[size_t(row)];
    s.meta.pos = StreamPos{epoch_, 0, offset_};
    ++offset_;
    return s;
  }
  int64_t rows_per_epoch() const override { return int64_t(lengths_->size()); }

 private:
  std::shared_ptr<const std::vector<int64_t>> lengths_;
  int32_t source_;
  uint64_t seed_;
  std::vector<int64_t> order_;
  int64_t epoch_ = 0;
  int64_t offset_ = 0;
};

std::shared_ptr<const std::vector<int64_t>> Lengths(int64_t seq_len) {
  testing::LengthSpec spec;
  spec.median_tokens = 600;
  spec.sigma = 1.2;
  spec.max_tokens = 4 * seq_len;
  spec.near_fraction = 0.01;
  spec.near_tokens = seq_len;
  auto docs = testing::RandomDocs(20000, spec, 99, /*vocab=*/16);
  auto out = std::make_shared<std::vector<int64_t>>();
  for (const auto& d : docs) out->push_back(int64_t(d.size()));
  return out;
}

// Args: sources, dp, micro-batches per rank (mbs 1), seq_len, algorithm, slack in
// percent, mix.exact (0 time, the default; 1 step).
void BM_PlanStep(benchmark::State& state) {
  const int64_t num_sources = state.range(0);
  const int64_t dp = state.range(1);
  const int64_t per_rank = state.range(2);
  const int64_t seq_len = state.range(3);
  Config config;
  config.seed = 1234;
  config.topology.dp = dp;
  config.batch.seq_len = seq_len;
  config.batch.global_tokens = dp * per_rank * seq_len;
  config.balance.linear = double(seq_len);
  config.balance.algorithm = static_cast<BalanceAlgorithm>(state.range(4));
  config.balance.slack = double(state.range(5)) / 100;
  if (state.range(6) == 1) config.mix.exact = MixConfig::Exact::kStep;
  const auto lengths = Lengths(seq_len);
  std::vector<std::unique_ptr<LengthStream>> owned;
  std::vector<SampleStream*> streams;
  for (int64_t i = 0; i < num_sources; ++i) {
    SourceConfig s;
    s.name = "s" + std::to_string(i);
    s.path = "memory://" + s.name;
    s.tokens_column = "input_ids";
    s.weight.points = {{0, 1.0 + double(i % 7)}};  // uneven weights
    config.sources.push_back(s);
    owned.push_back(std::make_unique<LengthStream>(lengths, int32_t(i), config.seed));
    streams.push_back(owned.back().get());
  }
  auto planner = Planner::Make(config, streams, Planner::InitialState(config));
  if (!planner.ok()) {
    state.SkipWithError(planner.status().ToString().c_str());
    return;
  }
  double imbalance = 0;
  int64_t steps = 0, pieces = 0;
  for (auto _ : state) {
    auto plan = (*planner)->PlanStep();
    if (!plan.ok()) {
      state.SkipWithError(plan.status().ToString().c_str());
      return;
    }
    imbalance += plan->imbalance;
    for (const auto& r : plan->buckets) {
      for (const auto& mb : r.micro_batches) {
        for (const auto& seq : mb.sequences) pieces += int64_t(seq.docs.size());
      }
    }
    ++steps;
    benchmark::DoNotOptimize(plan->buckets.data());
  }
  state.SetLabel(std::string(ToString(config.balance.algorithm)) +
                 (state.range(5) > 0 ? " + slack" : "") +
                 (state.range(6) == 1 ? ", mix.exact: step" : "") + ", ms per step");
  state.counters["sequences"] = double(config.sequences_per_step());
  state.counters["pieces/step"] = double(pieces) / double(std::max<int64_t>(steps, 1));
  state.counters["imbalance"] = imbalance / double(std::max<int64_t>(steps, 1));
}

// The baseline for the figures above: the same streams read alone, each source up to its
// token share of a step (what the planner's draw pulls), no planning. Planner time less
// this is the planner's own.
void BM_StreamsOnly(benchmark::State& state) {
  const int64_t num_sources = state.range(0);
  const int64_t capacity = state.range(1) * state.range(2) * state.range(3);
  const auto lengths = Lengths(state.range(3));
  std::vector<std::unique_ptr<LengthStream>> streams;
  double total_weight = 0;
  for (int64_t i = 0; i < num_sources; ++i) {
    streams.push_back(std::make_unique<LengthStream>(lengths, int32_t(i), /*seed=*/1234));
    total_weight += 1.0 + double(i % 7);
  }
  std::vector<double> owed(size_t(num_sources), 0.0);
  int64_t samples = 0;
  for (auto _ : state) {
    for (int64_t i = 0; i < num_sources; ++i) {
      owed[size_t(i)] += (1.0 + double(i % 7)) / total_weight * double(capacity);
      while (owed[size_t(i)] > 0) {
        auto s = streams[size_t(i)]->Next();
        owed[size_t(i)] -= double(s->meta.tokens);
        benchmark::DoNotOptimize(s);
        ++samples;
      }
    }
  }
  state.counters["samples/step"] =
      benchmark::Counter(double(samples), benchmark::Counter::kAvgIterations);
}

BENCHMARK(BM_StreamsOnly)
    ->ArgNames({"sources", "dp", "per_rank", "seq_len"})
    ->Args({306, 1024, 16, 4096})
    ->Args({1000, 1024, 16, 4096})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

// 306 sources, dp=1024, 16 sequences per rank = 16,384 sequences of 4096 (64M tokens);
// each row with the default accounting (shares exact over time) and per-step quotas.
BENCHMARK(BM_PlanStep)
    ->ArgNames({"sources", "dp", "per_rank", "seq_len", "algo", "slack_pct", "per_step"})
    ->ArgsProduct({{306}, {1024}, {16}, {4096}, {int(BalanceAlgorithm::kKarmarkarKarp)},
                   {0}, {0, 1}})
    ->Args({306, 1024, 16, 4096, int(BalanceAlgorithm::kGreedy), 0, 0})
    ->Args({306, 1024, 16, 4096, int(BalanceAlgorithm::kNone), 0, 0})
    ->Args({306, 1024, 16, 1024, int(BalanceAlgorithm::kKarmarkarKarp), 0, 0})
    ->Args({1000, 1024, 16, 4096, int(BalanceAlgorithm::kKarmarkarKarp), 0, 0})
    ->Args({1000, 1024, 16, 4096, int(BalanceAlgorithm::kKarmarkarKarp), 0, 1})
    // The token-slack lever's cost at this scale (exchanges between ranks after KK).
    ->Args({306, 1024, 16, 4096, int(BalanceAlgorithm::kKarmarkarKarp), 5, 0})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);

}  // namespace
}  // namespace braid

BENCHMARK_MAIN();
