#include "braid/runtime/engine.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "braid/cli/job.h"
#include "braid/construct/constructor.h"
#include "braid/construct/views.h"
#include "braid/io/source_files.h"
#include "braid/plan/planner.h"
#include "braid/source/sharded_source.h"
#include "braid/source/source_loader.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/sentencepiece_fixture.h"
#include "braid/testing/temp_dir.h"
#include "braid/transform/image.h"

namespace braid {
namespace {

using ::testing::HasSubstr;
using Docs = std::vector<std::vector<int32_t>>;

// Every document of a source, read back independently: [file][row].
std::vector<Docs> ReadSourceDocs(const SourceConfig& source) {
  std::vector<Docs> out;
  auto files = SourceFiles::Open(source, "sources[?]");
  EXPECT_TRUE(files.ok()) << files.status().ToString();
  if (!files.ok()) return out;
  for (size_t f = 0; f < (*files)->files().size(); ++f) {
    Docs docs;
    for (size_t rg = 0; rg < (*files)->files()[f].row_group_rows.size(); ++rg) {
      auto array = (*files)->ReadTokens(int(f), int(rg));
      EXPECT_TRUE(array.ok());
      const auto& list = static_cast<const arrow::ListArray&>(**array);
      const auto& values = static_cast<const arrow::Int32Array&>(*list.values());
      for (int64_t i = 0; i < list.length(); ++i) {
        docs.emplace_back(
            values.raw_values() + list.value_offset(i),
            values.raw_values() + list.value_offset(i) + list.value_length(i));
      }
    }
    out.push_back(std::move(docs));
  }
  return out;
}

void ExpectSameBatch(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.dp, b.dp);
  EXPECT_EQ(a.micro_batch, b.micro_batch);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const Tensor &x = a.tensors[i], &y = b.tensors[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.shape, y.shape);
    EXPECT_EQ(*x.storage, *y.storage)
        << x.name << " of step " << a.step << " dp " << a.dp << " mb " << a.micro_batch;
  }
}

std::vector<std::shared_ptr<const Batch>> Take(Engine* engine, int64_t n) {
  std::vector<std::shared_ptr<const Batch>> out;
  for (int64_t i = 0; i < n; ++i) {
    auto b = engine->Next();
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) break;
    out.push_back(*b);
  }
  return out;
}

std::unique_ptr<Engine> MakeEngine(const Config& config, Engine::Options options = {}) {
  auto engine = Engine::Make(config, std::move(options));
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// The demo dataset (three sources, long-tail lengths, several files and row groups),
// small: seq_len 512, dp 4, 2 micro-batches per rank.
class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::ScopedTempDir("braid-engine");
    auto demo =
        testing::MakeDemoDataset(dir_->path().string(), /*seed=*/3, /*seq_len=*/512,
                                 /*dp=*/4, /*micro_batches=*/2, /*scale=*/0.05);
    ASSERT_TRUE(demo.ok()) << demo.status().ToString();
    auto config = LoadConfigFile(demo->config_path);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = new Config(*config);
    docs_ = new std::vector<std::vector<Docs>>();
    for (const auto& s : config_->sources) docs_->push_back(ReadSourceDocs(s));
  }
  static void TearDownTestSuite() {
    delete docs_;
    delete config_;
    delete dir_;
  }

  static testing::ScopedTempDir* dir_;
  static Config* config_;
  static std::vector<std::vector<Docs>>* docs_;  // [source][file][row]
};

testing::ScopedTempDir* EngineTest::dir_ = nullptr;
Config* EngineTest::config_ = nullptr;
std::vector<std::vector<Docs>>* EngineTest::docs_ = nullptr;

TEST_F(EngineTest, EveryMicroBatchArrivesInOrderWithThePlannedTokens) {
  const Config& config = *config_;
  ASSERT_EQ(config.sources.size(), 3u);
  ASSERT_EQ(config.topology.dp, 4);
  ASSERT_EQ(config.micro_batches_per_rank(), 2);
  std::mutex mu;
  std::vector<std::shared_ptr<const StepPlan>> plans;
  Engine::Options options;
  options.on_plan = [&](const StepPlan& p) {
    std::lock_guard<std::mutex> lock(mu);
    plans.push_back(std::make_shared<const StepPlan>(p));
  };
  auto engine = MakeEngine(config, options);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->local_micro_batches_per_step(0), 8);
  constexpr int64_t kSteps = 8;
  const auto batches = Take(engine.get(), kSteps * 8);
  ASSERT_EQ(batches.size(), size_t(kSteps * 8));

  // Independently: the same plans from RunPlanJob (metadata only).
  std::vector<std::string> lines;
  auto state = RunPlanJob(config, kSteps, "", [&](const std::string& line) {
    lines.push_back(line);
    return Status::OK();
  });
  ASSERT_TRUE(state.ok()) << state.status().ToString();

  std::vector<int64_t> source_tokens(3, 0);
  int64_t doc_tokens_checked = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    const Batch& b = *batches[i];
    ASSERT_EQ(b.step, int64_t(i) / 8);
    ASSERT_EQ(b.dp, (int64_t(i) % 8) / 2);
    ASSERT_EQ(b.micro_batch, int64_t(i) % 2);
    std::shared_ptr<const StepPlan> plan;
    {
      std::lock_guard<std::mutex> lock(mu);
      ASSERT_GT(plans.size(), size_t(b.step));
      plan = plans[size_t(b.step)];
    }
    ASSERT_EQ(plan->step, b.step);
    EXPECT_EQ(StepPlanToJson(*plan, config), lines[size_t(b.step)]);
    auto rebuilt = BuildMicroBatch(*plan, b.dp, b.micro_batch);
    ASSERT_TRUE(rebuilt.ok());
    ExpectSameBatch(b, *rebuilt);
    // The tokens are the files' tokens at the planned offsets.
    const auto* ids = b.Find("input_ids")->data<int64_t>();
    const auto* src = b.Find("source_ids")->data<int32_t>();
    int64_t t = 0;
    for (const Sequence& seq :
         plan->buckets[size_t(b.dp)].micro_batches[size_t(b.micro_batch)].sequences) {
      for (const DocPiece& d : seq.docs) {
        const auto& doc = (*docs_)[size_t(d.source)][size_t(d.file)][size_t(d.row)];
        for (int64_t k = 0; k < d.len; ++k, ++t) {
          ASSERT_EQ(ids[t], doc[size_t(d.start + k)]);
          ASSERT_EQ(src[t], d.source);
        }
        doc_tokens_checked += d.len;
      }
    }
    for (int64_t k = 0; k < b.Find("source_ids")->num_elements(); ++k)
      ++source_tokens[size_t(src[k])];
  }
  EXPECT_EQ(doc_tokens_checked, kSteps * config.batch.global_tokens);
  // The demo's 0.6 / 0.3 / 0.1 mix, each source within two sequences of its share.
  const double total = double(kSteps * config.batch.global_tokens);
  const double within = 2.0 * double(config.batch.seq_len) / total;
  EXPECT_NEAR(source_tokens[0] / total, 0.6, within);
  EXPECT_NEAR(source_tokens[1] / total, 0.3, within);
  EXPECT_NEAR(source_tokens[2] / total, 0.1, within);
}

TEST_F(EngineTest, TwoEnginesWithOneRankEachEqualOneWithBoth) {
  Config config = *config_;
  ASSERT_TRUE(SetDataParallel(&config, 2).ok());  // 4 micro-batches per rank
  auto both = MakeEngine(config);
  Engine::Options o0, o1;
  o0.buckets = {0};
  o1.buckets = {1};
  auto r0 = MakeEngine(config, o0);
  auto r1 = MakeEngine(config, o1);
  ASSERT_TRUE(both && r0 && r1);
  EXPECT_EQ(r0->local_micro_batches_per_step(0), 4);
  EXPECT_EQ(both->local_micro_batches_per_step(0), 8);
  for (int step = 0; step < 5; ++step) {
    const auto all = Take(both.get(), 8);
    const auto a = Take(r0.get(), 4);
    const auto b = Take(r1.get(), 4);
    ASSERT_EQ(all.size(), 8u);
    ASSERT_EQ(a.size(), 4u);
    ASSERT_EQ(b.size(), 4u);
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(a[size_t(k)]->dp, 0);
      EXPECT_EQ(b[size_t(k)]->dp, 1);
      ExpectSameBatch(*all[size_t(k)], *a[size_t(k)]);
      ExpectSameBatch(*all[size_t(4 + k)], *b[size_t(k)]);
    }
  }
}

TEST_F(EngineTest, BatchesAreTheSameWithOneOrThreeLoadersPerSource) {
  Config one = *config_;
  for (auto& s : one.sources) {
    s.shuffle_window_rows = 8;
    s.workers = 2;
  }
  Config three = one;
  for (size_t i = 0; i < three.sources.size(); ++i) {
    three.sources[i].loaders = 3;
    // Every source really is read by several loaders (three where it has the windows).
    auto sharded = ShardedSource::Make(three, int32_t(i), {}, {}, /*shards=*/3);
    ASSERT_TRUE(sharded.ok()) << sharded.status().ToString();
    EXPECT_GE((*sharded)->shards(), 2) << three.sources[i].name;
    std::printf("[ loaders ] %s: %lld\n", three.sources[i].name.c_str(),
                static_cast<long long>((*sharded)->shards()));
  }
  auto a = MakeEngine(one);
  auto b = MakeEngine(three);
  ASSERT_TRUE(a && b);
  const auto expected = Take(a.get(), 40);
  const auto got = Take(b.get(), 40);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) ExpectSameBatch(*got[i], *expected[i]);
  // A state saved with one loader resumes with three (the loader count is not part of
  // the stream), mid-step.
  Engine::Options resume;
  resume.state_json = a->StateJson();
  const auto more = Take(a.get(), 12);
  auto c = MakeEngine(three, resume);
  ASSERT_NE(c, nullptr);
  const auto resumed = Take(c.get(), 12);
  ASSERT_EQ(resumed.size(), more.size());
  for (size_t i = 0; i < more.size(); ++i) ExpectSameBatch(*resumed[i], *more[i]);
}

TEST_F(EngineTest, AutoscaleKeepsTheStreamAndAWeightZeroSourceReadsNothingBeforeItsRise) {
  // The last source is drawn from step 10 on; the lookahead (2 + 2 + 2 steps) starts
  // its read-ahead when step 4 is planned.
  Config off = *config_;
  off.runtime.autoscale = false;
  const size_t late = off.sources.size() - 1;
  WeightSchedule rise;
  rise.stepwise = true;
  rise.points = {{0, 0.0}, {10, off.sources[late].weight.At(0)}};
  off.sources[late].weight = rise;
  Config on = off;
  on.runtime.autoscale = true;
  const int64_t per_step = on.sequences_per_step() / on.batch.micro_batch_size;
  auto a = MakeEngine(off);
  auto b = MakeEngine(on);
  ASSERT_TRUE(a && b);
  const auto first = Take(b.get(), per_step);  // step 0: planned through step 2 or so
  EXPECT_EQ(b->source_profiles()[late].rows_read, 0);
  const auto changes = b->share_changes();
  ASSERT_FALSE(changes.empty());
  EXPECT_EQ(changes.front().step, 0);
  EXPECT_FALSE(changes.front().shares[late].active);
  EXPECT_EQ(changes.front().shares[late].workers, 0);
  const auto rest = Take(b.get(), 13 * per_step);
  const auto expected = Take(a.get(), 14 * per_step);
  ASSERT_EQ(first.size() + rest.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ExpectSameBatch(i < first.size() ? *first[i] : *rest[i - first.size()], *expected[i]);
  }
  bool started = false;
  for (const auto& c : b->share_changes()) {
    if (!c.shares[late].active) continue;
    EXPECT_EQ(c.step, 4);  // six steps ahead of its first draw
    started = true;
    break;
  }
  EXPECT_TRUE(started);
  EXPECT_GT(b->source_profiles()[late].samples, 0);
  EXPECT_TRUE(a->share_changes().empty());  // autoscale off: the fixed allocation
}

struct ResumeCase {
  int64_t taken;  // micro-batches received before the state is saved
  std::vector<int64_t> dp_ranks;
};

class EngineResumeTest : public EngineTest,
                         public ::testing::WithParamInterface<ResumeCase> {};

TEST_P(EngineResumeTest, ResumeFromStateJsonContinuesExactly) {
  const auto& [taken, dp_ranks] = GetParam();
  Engine::Options options;
  options.buckets = dp_ranks;
  auto first = MakeEngine(*config_, options);
  ASSERT_NE(first, nullptr);
  ASSERT_EQ(Take(first.get(), taken).size(), size_t(taken));
  const std::string state = first->StateJson();
  const auto expected = Take(first.get(), 20);

  options.state_json = state;
  auto second = MakeEngine(*config_, options);
  ASSERT_NE(second, nullptr);
  const auto got = Take(second.get(), 20);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) ExpectSameBatch(*got[i], *expected[i]);
  // Both report the same state at the same point.
  EXPECT_EQ(second->StateJson(), first->StateJson());
}

INSTANTIATE_TEST_SUITE_P(
    Points, EngineResumeTest,
    ::testing::Values(ResumeCase{0, {}},       // before anything
                      ResumeCase{3, {}},       // mid-step
                      ResumeCase{16, {}},      // at a step boundary (8 per step)
                      ResumeCase{21, {}},      // mid-step, later
                      ResumeCase{3, {2}},      // one rank: 2 per step, so mid-step 1
                      ResumeCase{5, {1, 3}}),  // two ranks: 4 per step
    [](const auto& info) {
      std::string name = "taken" + std::to_string(info.param.taken) + "_ranks";
      if (info.param.dp_ranks.empty()) name += "all";
      for (int64_t r : info.param.dp_ranks) name += std::to_string(r);
      return name;
    });

TEST_F(EngineTest, StateJsonAtBoundaryAndMidStep) {
  auto engine = MakeEngine(*config_);
  ASSERT_NE(engine, nullptr);
  auto parse = [&](const std::string& json, int64_t* consumed) {
    auto s = PlannerStateFromJson(json, *config_, consumed);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? s->step : -1;
  };
  int64_t consumed = -1;
  EXPECT_EQ(parse(engine->StateJson(), &consumed), 0);
  EXPECT_EQ(consumed, 0);
  Take(engine.get(), 3);
  EXPECT_EQ(parse(engine->StateJson(), &consumed), 0);
  EXPECT_EQ(consumed, 3);
  Take(engine.get(), 5);
  EXPECT_EQ(parse(engine->StateJson(), &consumed), 1);
  EXPECT_EQ(consumed, 0);
}

TEST_F(EngineTest, DestroyWhileThreadsAreBlockedDoesNotHang) {
  Config config = *config_;
  config.runtime.read_ahead_bytes = 1;  // loaders block almost at once
  config.runtime.prefetch_steps = 1;
  auto done = std::async(std::launch::async, [&] {
    {
      auto engine = MakeEngine(config);
      if (engine) {
        EXPECT_TRUE(engine->Next().ok());
      }
    }  // destroyed with the planner, constructor and loaders blocked on full queues
    {
      auto untouched = MakeEngine(config);  // destroyed without a single Next()
    }
    {
      auto engine = MakeEngine(*config_);
      Take(engine.get(), 9);
      std::this_thread::sleep_for(std::chrono::milliseconds(30));  // let queues fill
    }
  });
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    // The future's destructor would wait for the hung thread: fail the process instead.
    std::fprintf(stderr, "FAILED: engine destruction hung\n");
    std::fflush(stderr);
    std::_Exit(1);
  }
  done.get();
}

TEST_F(EngineTest, StopEndsNextWithCancelledAndKeepsTheState) {
  auto engine = MakeEngine(*config_);
  ASSERT_NE(engine, nullptr);
  Take(engine.get(), 3);
  const std::string state = engine->StateJson();
  engine->Stop();
  auto next = engine->Next();
  EXPECT_TRUE(next.status().IsCancelled()) << next.status().ToString();
  EXPECT_EQ(engine->StateJson(), state);  // what a SIGTERM handler saves
  engine->Stop();                         // idempotent; the destructor stops again
}

TEST_F(EngineTest, AnInterruptedNextLeavesTheStreamWhereItWas) {
  auto plain = MakeEngine(*config_);
  ASSERT_NE(plain, nullptr);
  const auto expected = Take(plain.get(), 24);
  ASSERT_EQ(expected.size(), 24u);
  // Step 1's plan takes 400 ms, so a Next() waits (at the latest for step 1); the first
  // ask of the interrupt ends that wait (as a signal would), the later ones do not.
  std::atomic<int> asked{0};
  Engine::Options options;
  options.on_plan = [](const StepPlan& plan) {
    if (plan.step == 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
  };
  options.interrupt = [&] {
    return asked.fetch_add(1) == 0 ? Status::Cancelled("test: interrupted")
                                   : Status::OK();
  };
  auto engine = MakeEngine(*config_, options);
  ASSERT_NE(engine, nullptr);
  std::vector<std::shared_ptr<const Batch>> got;
  int interrupted = 0;
  while (got.size() < expected.size() && interrupted < 3) {
    const std::string before = engine->StateJson();
    auto next = engine->Next();
    if (!next.ok()) {
      EXPECT_TRUE(next.status().IsCancelled()) << next.status().ToString();
      EXPECT_THAT(next.status().message(), HasSubstr("test: interrupted"));
      EXPECT_EQ(engine->StateJson(), before);  // the stream did not move
      ++interrupted;
      continue;
    }
    got.push_back(*next);
  }
  EXPECT_EQ(interrupted, 1);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(i);
    ExpectSameBatch(*got[i], *expected[i]);
  }
}

TEST_F(EngineTest, StopFromAnotherThreadEndsTheConsumersNext) {
  Config config = *config_;
  config.runtime.read_ahead_bytes = 1;
  config.runtime.prefetch_steps = 1;
  auto engine = MakeEngine(config);
  ASSERT_NE(engine, nullptr);
  std::promise<Status> last;
  std::future<Status> consumer_done = last.get_future();
  std::thread consumer([&] {
    Status st;
    while (st.ok()) st = engine->Next().status();
    last.set_value(st);
  });
  engine->Stop();
  if (consumer_done.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: Next() did not return after Stop()\n");
    std::fflush(stderr);
    std::_Exit(1);
  }
  consumer.join();
  const Status st = consumer_done.get();
  EXPECT_TRUE(st.IsCancelled()) << st.ToString();
}

TEST_F(EngineTest, RunPlanJobLinesEqualAPlannersJson) {
  const Config& config = *config_;
  std::vector<std::string> lines;
  auto state = RunPlanJob(config, 6, "", [&](const std::string& line) {
    lines.push_back(line);
    return Status::OK();
  });
  ASSERT_TRUE(state.ok());
  ASSERT_EQ(lines.size(), 6u);

  std::vector<std::unique_ptr<SourceLoader>> loaders;
  std::vector<SampleStream*> streams;
  for (int32_t i = 0; i < 3; ++i) {
    auto l = SourceLoader::Make(config, i, {}, {});
    ASSERT_TRUE(l.ok());
    streams.push_back(l->get());
    loaders.push_back(std::move(*l));
  }
  auto planner = Planner::Make(config, streams, Planner::InitialState(config));
  ASSERT_TRUE(planner.ok());
  for (size_t i = 0; i < 6; ++i) {
    auto plan = (*planner)->PlanStep();
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(StepPlanToJson(*plan, config), lines[i]) << "step " << i;
  }
  EXPECT_EQ(*state, PlannerStateToJson((*planner)->state(), config));

  // --state-out / --state-in: 4 + 2 steps equal 6 steps.
  std::vector<std::string> split;
  auto mid = RunPlanJob(config, 4, "", [&](const std::string& l) {
    split.push_back(l);
    return Status::OK();
  });
  ASSERT_TRUE(mid.ok());
  auto end = RunPlanJob(config, 2, *mid, [&](const std::string& l) {
    split.push_back(l);
    return Status::OK();
  });
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(split, lines);
  EXPECT_EQ(*end, *state);

  // A state inside a step cannot seed `plan`; a callback's error stops the job.
  auto inside =
      RunPlanJob(config, 1, PlannerStateToJson(Planner::InitialState(config), config, 3),
                 [](const std::string&) { return Status::OK(); });
  EXPECT_THAT(inside.status().message(), HasSubstr("state.consumed_micro_batches"));
  auto stopped = RunPlanJob(
      config, 5, "", [](const std::string&) { return Status::IOError("stdout closed"); });
  EXPECT_TRUE(stopped.status().IsIOError());
}

// --- Views: this rank's part of the one build per DP group ---
TEST_F(EngineTest, ViewOptionGivesTheRanksViewOfTheSameMicroBatches) {
  Config config = *config_;
  config.topology.tp = 2;
  config.topology.pp = 3;
  config.topology.cp = 2;
  Engine::Options whole_options;
  whole_options.buckets = {1};
  auto whole = MakeEngine(config, whole_options);
  ASSERT_NE(whole, nullptr);
  std::vector<std::unique_ptr<Engine>> ranks;
  std::vector<RankCoords> coords;
  for (RankCoords c : {RankCoords{0, 1, 0, 0}, RankCoords{0, 0, 1, 1},
                       RankCoords{0, 1, 2, 1}}) {
    Engine::Options o = whole_options;
    o.view = c;
    ranks.push_back(MakeEngine(config, o));
    ASSERT_NE(ranks.back(), nullptr);
    coords.push_back(c);
  }
  Engine::Options unsplit = whole_options;
  unsplit.view = RankCoords{0, 0, 0, 1};
  unsplit.split_context = false;
  auto megatron_style = MakeEngine(config, unsplit);
  ASSERT_NE(megatron_style, nullptr);
  for (int i = 0; i < 6; ++i) {
    auto full = whole->Next();
    ASSERT_TRUE(full.ok());
    for (size_t r = 0; r < ranks.size(); ++r) {
      auto got = ranks[r]->Next();
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      RankCoords c = coords[r];
      c.dp = 1;
      auto want = ViewFor(**full, config.topology, c);
      ASSERT_TRUE(want.ok());
      ExpectSameBatch(**got, *want);
      EXPECT_EQ((*got)->tensors.size(), ViewTensorNames(c.pp, 3).size());
    }
    // Without the CP split the first stage gets the whole micro-batch's inputs.
    auto unsplit_batch = megatron_style->Next();
    ASSERT_TRUE(unsplit_batch.ok());
    EXPECT_EQ(*(*unsplit_batch)->Find("input_ids")->storage,
              *(*full)->Find("input_ids")->storage);
    EXPECT_EQ((*unsplit_batch)->Find("labels"), nullptr);  // not the last stage
  }
  // Several ranks served from one build: TP and PP views share its buffers.
  auto full = whole->Next();
  ASSERT_TRUE(full.ok());
  Topology no_cp = config.topology;
  no_cp.cp = 1;
  auto first = ViewFor(**full, no_cp, RankCoords{1, 0, 0, 0});
  auto last_tp1 = ViewFor(**full, no_cp, RankCoords{1, 1, 2, 0});
  ASSERT_TRUE(first.ok() && last_tp1.ok());
  EXPECT_EQ(first->Find("position_ids")->storage.get(),
            last_tp1->Find("position_ids")->storage.get());
  EXPECT_EQ(first->Find("input_ids")->storage.get(),
            (*full)->Find("input_ids")->storage.get());
  EXPECT_EQ(last_tp1->Find("input_ids"), nullptr);

  // NextViews: the same from one Next() of an engine without a view.
  auto reference = MakeEngine(config, whole_options);
  auto shared = MakeEngine(config, whole_options);
  ASSERT_TRUE(reference && shared);
  for (int i = 0; i < 3; ++i) {
    auto full_batch = reference->Next();
    auto views = shared->NextViews(coords);
    ASSERT_TRUE(full_batch.ok() && views.ok()) << views.status().ToString();
    ASSERT_EQ(views->size(), coords.size());
    for (size_t r = 0; r < coords.size(); ++r) {
      RankCoords c = coords[r];
      c.dp = 1;
      auto want = ViewFor(**full_batch, config.topology, c);
      ASSERT_TRUE(want.ok());
      ExpectSameBatch(*(*views)[r], *want);
    }
  }
  auto viewed = MakeEngine(config, [&] {
    Engine::Options o = whole_options;
    o.view = RankCoords{};
    return o;
  }());
  ASSERT_NE(viewed, nullptr);
  EXPECT_FALSE(viewed->NextViews(coords).ok());

  Engine::Options outside = whole_options;
  outside.view = RankCoords{0, /*tp=*/2, 0, 0};
  auto bad = Engine::Make(config, outside);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), ::testing::StartsWith("rank:"));
}
// --- end views ---

TEST_F(EngineTest, MakeRejectsBadRanksAndStates) {
  Engine::Options bad_rank;
  bad_rank.buckets = {4};
  auto e = Engine::Make(*config_, bad_rank);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), ::testing::StartsWith("rank:"));

  Engine::Options bad_state;
  bad_state.state_json = "{\"version\": 1}";
  e = Engine::Make(*config_, bad_state);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), ::testing::StartsWith("state"));

  Engine::Options too_far;
  too_far.state_json = PlannerStateToJson(Planner::InitialState(*config_), *config_, 8);
  e = Engine::Make(*config_, too_far);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("consumed_micro_batches"));
}

TEST_F(EngineTest, StateThatDoesNotMatchTheDataFailsNextAndPlanWithoutACrash) {
  // A state whose head_start exceeds every document (as if the files changed).
  PlannerState state = Planner::InitialState(*config_);
  for (auto& c : state.sources) c.head_start = int64_t{1} << 40;
  const std::string json = PlannerStateToJson(state, *config_);
  Engine::Options options;
  options.state_json = json;
  auto engine = MakeEngine(*config_, options);
  ASSERT_NE(engine, nullptr);
  auto b = engine->Next();
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(),
              ::testing::StartsWith("state.sources[0].head_start:"));
  auto lines =
      RunPlanJob(*config_, 2, json, [](const std::string&) { return Status::OK(); });
  ASSERT_FALSE(lines.ok());
  EXPECT_THAT(lines.status().message(), HasSubstr("head_start"));
}

TEST_F(EngineTest, RunJobSummarizesTheRun) {
  auto summary = RunJob(*config_, 4, nullptr);
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->steps, 4);
  EXPECT_EQ(summary->micro_batches, 4 * 8);
  EXPECT_EQ(summary->tokens, 4 * config_->batch.global_tokens);
  ASSERT_EQ(summary->source_share.size(), 3u);
  EXPECT_NEAR(summary->source_share[0], 0.6,  // within two sequences of the share
              2.0 * double(config_->batch.seq_len) / double(summary->tokens));
  EXPECT_NEAR(summary->target_share[0], 0.6, 1e-9);
  EXPECT_GE(summary->imbalance_max, summary->imbalance_mean);
  EXPECT_GE(summary->imbalance_mean, 1.0);
  EXPECT_EQ(summary->step_imbalance.size(), 4u);
}

// ---------------------------------------------------------------------------
// Bad data surfaces from Next() as a Status.

Config TwoSourceConfig(const std::string& good, const std::string& bad,
                       OnError on_error) {
  Config c;
  c.seed = 1;
  c.topology.dp = 2;
  c.batch.seq_len = 64;
  c.batch.global_tokens = 64 * 4;
  for (const auto& [name, path] : {std::pair{"good", good}, std::pair{"bad", bad}}) {
    SourceConfig s;
    s.name = name;
    s.path = path;
    s.tokens_column = "input_ids";
    s.shuffle_window_rows = 8;
    s.on_error = on_error;
    c.sources.push_back(s);
  }
  EXPECT_TRUE(ValidateConfig(c).ok());
  return c;
}

TEST(EngineErrorTest, NullRowFailsNextWithTheFileAndRow) {
  testing::ScopedTempDir dir("braid-engine-bad");
  ASSERT_TRUE(
      testing::WriteTokenFile(dir.Sub("good.parquet"), testing::RandomDocs(100, {}, 1))
          .ok());
  testing::TokenFileOptions opts;
  opts.row_group_rows = 10;
  opts.null_rows = {35};
  testing::LengthSpec spec;
  spec.median_tokens = 30;
  const std::string bad = dir.Sub("bad.parquet");
  ASSERT_TRUE(testing::WriteTokenFile(bad, testing::RandomDocs(60, spec, 2), opts).ok());

  auto engine = MakeEngine(TwoSourceConfig(dir.Sub("good.parquet"), bad, OnError::kFail));
  ASSERT_NE(engine, nullptr);
  Status st;
  int64_t ok_batches = 0;
  for (int i = 0; i < 10000 && st.ok(); ++i) {
    auto b = engine->Next();
    st = b.status();
    if (b.ok()) ++ok_batches;
  }
  ASSERT_FALSE(st.ok()) << "the null row was never reached";
  EXPECT_TRUE(st.IsInvalid()) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr(bad));
  EXPECT_THAT(st.message(), HasSubstr("row 35"));
  ASSERT_NE(GetErrorDetail(st), nullptr);
  EXPECT_EQ(GetErrorDetail(st)->kind(), ErrorKind::kData);
  EXPECT_EQ(engine->Next().status().message(), st.message());  // sticky
  engine.reset();  // clean shutdown after an error

  // With on_error: skip the same data flows, and the skip is counted in the state.
  auto skipping =
      MakeEngine(TwoSourceConfig(dir.Sub("good.parquet"), bad, OnError::kSkip));
  ASSERT_NE(skipping, nullptr);
  Take(skipping.get(), ok_batches + 40);
  auto state =
      PlannerStateFromJson(skipping->StateJson(),
                           TwoSourceConfig(dir.Sub("good.parquet"), bad, OnError::kSkip));
  ASSERT_TRUE(state.ok());
  EXPECT_GE(state->sources[1].skipped, 1);
}

TEST(EngineErrorTest, CorruptColumnChunkFailsNext) {
  testing::ScopedTempDir dir("braid-engine-corrupt");
  ASSERT_TRUE(
      testing::WriteTokenFile(dir.Sub("good.parquet"), testing::RandomDocs(100, {}, 1))
          .ok());
  const std::string bad = dir.Sub("bad.parquet");
  testing::TokenFileOptions opts;
  opts.row_group_rows = 10;
  ASSERT_TRUE(testing::WriteTokenFile(bad, testing::RandomDocs(60, {}, 2), opts).ok());
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4);
    const std::string junk(2048, '\x5a');
    f.write(junk.data(), std::streamsize(junk.size()));
  }
  auto engine =
      Engine::Make(TwoSourceConfig(dir.Sub("good.parquet"), bad, OnError::kFail), {});
  Status st = engine.status();
  if (engine.ok()) {
    for (int i = 0; i < 10000 && st.ok(); ++i) st = (*engine)->Next().status();
  }
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr(bad));
  ASSERT_NE(GetErrorDetail(st), nullptr);
  EXPECT_EQ(GetErrorDetail(st)->kind(), ErrorKind::kData);
}

// on_error: skip over a folder with a truncated file (no footer) and a file with a
// corrupt row group: the job runs, and the run summary counts the skipped files, those
// whose rows are unknown, and the corrupt row group's rows among the skipped samples.
TEST(EngineErrorTest, RunJobCountsSkippedFilesUnderSkip) {
  testing::ScopedTempDir dir("braid-engine-skipfiles");
  testing::LengthSpec spec;
  spec.median_tokens = 10;
  spec.max_tokens = 60;
  ASSERT_TRUE(
      testing::WriteTokenFile(dir.Sub("good.parquet"), testing::RandomDocs(100, spec, 1))
          .ok());
  testing::TokenFileOptions opts;
  opts.row_group_rows = 10;
  for (const char* name : {"a", "b", "c"}) {
    ASSERT_TRUE(testing::WriteTokenFile(dir.Sub(std::string("bad/") + name + ".parquet"),
                                        testing::RandomDocs(60, spec, 2), opts)
                    .ok());
  }
  ASSERT_TRUE(testing::TruncateFile(dir.Sub("bad/b.parquet")).ok());
  ASSERT_TRUE(testing::CorruptRowGroup(dir.Sub("bad/c.parquet"), 2).ok());
  const Config config =
      TwoSourceConfig(dir.Sub("good.parquet"), dir.Sub("bad/*.parquet"), OnError::kSkip);
  ::testing::internal::CaptureStderr();
  auto summary = RunJob(config, /*steps=*/40, nullptr);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->steps, 40);
  EXPECT_EQ(summary->skipped_files, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(summary->skipped_files_rows_unknown, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(summary->skipped[0], 0);
  EXPECT_GE(summary->skipped[1], 10);  // 40 steps read the bad source at least once
  EXPECT_THAT(log, HasSubstr("skipped file " + dir.Sub("bad/b.parquet")));
  EXPECT_THAT(log, HasSubstr(dir.Sub("bad/c.parquet") + " (row group 2)"));

  // The same under on_error: fail: the engine does not start, naming the file.
  auto failing = Engine::Make(
      TwoSourceConfig(dir.Sub("good.parquet"), dir.Sub("bad/*.parquet"), OnError::kFail),
      {});
  ASSERT_FALSE(failing.ok());
  EXPECT_THAT(failing.status().message(), HasSubstr(dir.Sub("bad/b.parquet")));
}

TEST(EngineErrorTest, MissingSourceFailsMake) {
  testing::ScopedTempDir dir("braid-engine-missing");
  ASSERT_TRUE(
      testing::WriteTokenFile(dir.Sub("good.parquet"), testing::RandomDocs(10, {}, 1))
          .ok());
  auto engine = Engine::Make(
      TwoSourceConfig(dir.Sub("good.parquet"), dir.Sub("gone.parquet"), OnError::kFail),
      {});
  ASSERT_FALSE(engine.ok());
  EXPECT_THAT(engine.status().message(), HasSubstr("gone.parquet"));
}

// ---------------------------------------------------------------------------
// Image-caption sources: metadata first, images decoded behind it.

// 24 rows of small PNG images (4 rows per row group) and captions; row `cut_row` keeps
// only its PNG header, so its body cannot decode.
Config CaptionConfig(const std::string& path, const std::string& model, OnError on_error,
                     int64_t workers) {
  Config c;
  c.seed = 4;
  c.batch.seq_len = 64;
  c.batch.global_tokens = 128;
  c.tokenizer.model = model;
  c.sources.push_back(
      testing::CaptionSource(path, on_error, workers, /*window_rows=*/8));
  EXPECT_TRUE(ValidateConfig(c).ok());
  return c;
}

// A caption job in `dir`: a tiny tokenizer (tok.model) and captions.parquet, whose row
// `cut_row` (-1: none) does not decode.
Status WriteCaptionJob(const testing::ScopedTempDir& dir, int cut_row) {
  ARROW_RETURN_NOT_OK(testing::TrainTinySentencePiece(testing::RandomSentences(300, 5),
                                                      dir.Sub("tok"), 100));
  return testing::WriteCaptionFile(dir.Sub("captions.parquet"), cut_row);
}

TEST(EngineImageTest, BodyThatDoesNotDecodeFailsNextNamingTheRow) {
  testing::ScopedTempDir dir("braid-engine-images");
  ASSERT_TRUE(WriteCaptionJob(dir, /*cut_row=*/9).ok());
  const std::string path = dir.Sub("captions.parquet");
  auto engine =
      MakeEngine(CaptionConfig(path, dir.Sub("tok.model"), OnError::kFail, /*workers=*/2));
  ASSERT_NE(engine, nullptr);
  Status st;
  for (int i = 0; i < 1000 && st.ok(); ++i) st = engine->Next().status();
  ASSERT_FALSE(st.ok()) << "row 9 was never reached";
  EXPECT_TRUE(st.IsInvalid()) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("captions.parquet (row group 2, row 9)"));
  EXPECT_THAT(st.message(), HasSubstr("cannot decode image: PNG"));
  ASSERT_NE(GetErrorDetail(st), nullptr);
  EXPECT_EQ(GetErrorDetail(st)->kind(), ErrorKind::kData);
}

TEST(EngineImageTest, SameBatchesForAnyWorkerCountWithABlankedImageUnderSkip) {
  testing::ScopedTempDir dir("braid-engine-images-skip");
  ASSERT_TRUE(WriteCaptionJob(dir, /*cut_row=*/9).ok());
  const std::string path = dir.Sub("captions.parquet");
  const std::string model = dir.Sub("tok.model");
  auto one = MakeEngine(CaptionConfig(path, model, OnError::kSkip, /*workers=*/1));
  auto three = MakeEngine(CaptionConfig(path, model, OnError::kSkip, /*workers=*/3));
  ASSERT_NE(one, nullptr);
  ASSERT_NE(three, nullptr);
  const auto a = Take(one.get(), 30);  // several epochs: row 9 is in every one
  const auto b = Take(three.get(), 30);
  ASSERT_EQ(a.size(), 30u);
  ASSERT_EQ(b.size(), 30u);
  int64_t with_images = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ExpectSameBatch(*a[i], *b[i]);
    with_images += a[i]->Find("pixel_values") != nullptr;
  }
  EXPECT_EQ(with_images, 30);
  // The blanked row is counted per source (run summaries report it).
  EXPECT_GE(one->blanked_payloads().at(0), 1);
  EXPECT_EQ(one->blanked_payloads().size(), 1u);
}

TEST(EngineImageTest, DecodesTheImagesOfItsOwnRanksOnly) {
  testing::ScopedTempDir dir("braid-engine-images-own");
  ASSERT_TRUE(WriteCaptionJob(dir, /*cut_row=*/-1).ok());
  const std::string path = dir.Sub("captions.parquet");
  Config config = CaptionConfig(path, dir.Sub("tok.model"), OnError::kFail, /*workers=*/2);
  config.topology.dp = 2;
  config.batch.global_tokens = 256;  // 2 micro-batches per rank
  ASSERT_TRUE(ValidateConfig(config).ok());
  // Every piece of every plan, with its rank (copies share the payload's handle).
  struct Planned {
    int64_t step, dp;
    DocPiece piece;
  };
  std::mutex mu;
  std::vector<Planned> planned;
  Engine::Options options;
  options.buckets = {1};
  options.on_plan = [&](const StepPlan& plan) {
    std::lock_guard<std::mutex> lock(mu);
    for (const BucketPlan& rank : plan.buckets) {
      for (const MicroBatch& mb : rank.micro_batches) {
        for (const Sequence& seq : mb.sequences) {
          for (const DocPiece& d : seq.docs) planned.push_back({plan.step, rank.bucket, d});
        }
      }
    }
  };
  auto engine = MakeEngine(config, options);
  ASSERT_NE(engine, nullptr);
  constexpr int64_t kSteps = 6;
  const auto batches = Take(engine.get(), kSteps * 2);
  ASSERT_EQ(batches.size(), size_t(kSteps * 2));
  std::lock_guard<std::mutex> lock(mu);
  using Key = std::tuple<int32_t, int32_t, int64_t, int64_t>;
  std::set<Key> own;
  for (const Planned& p : planned) {
    if (p.dp == 1) own.insert({p.piece.source, p.piece.file, p.piece.row, p.piece.epoch});
  }
  int64_t own_checked = 0, others_checked = 0;
  for (const Planned& p : planned) {
    if (p.step >= kSteps || !p.piece.payload) continue;
    const Key key{p.piece.source, p.piece.file, p.piece.row, p.piece.epoch};
    if (p.dp == 1) {
      EXPECT_TRUE(p.piece.payload.ready()) << "row " << p.piece.row;  // built
      ++own_checked;
    } else if (own.count(key) == 0) {
      // Rank 0's documents are built by another process: never decoded here.
      EXPECT_FALSE(p.piece.payload.ready()) << "row " << p.piece.row << " was decoded";
      ++others_checked;
    }
  }
  EXPECT_GT(own_checked, 0);
  EXPECT_GT(others_checked, 0);
}

TEST(EngineImageTest, RanksSharingCountsDecodeTheirOwnImagesToTheSameBatches) {
  // An image-caption row counted by another rank: its caption encoded and its images
  // decoded on demand, in the process that builds it.
  testing::ScopedTempDir dir("braid-engine-images-shared");
  ASSERT_TRUE(WriteCaptionJob(dir, /*cut_row=*/-1).ok());
  Config config = CaptionConfig(dir.Sub("captions.parquet"), dir.Sub("tok.model"),
                                OnError::kFail, /*workers=*/2);
  config.topology.dp = 2;
  config.batch.global_tokens = 256;  // 2 micro-batches per rank
  ASSERT_TRUE(ValidateConfig(config).ok());
  constexpr int64_t kSteps = 6;
  auto both = MakeEngine(config);
  ASSERT_NE(both, nullptr);
  const auto all = Take(both.get(), kSteps * 4);
  ASSERT_EQ(all.size(), size_t(kSteps * 4));
  config.sources[0].length_cache_dir = dir.Sub("lens");
  std::vector<std::shared_ptr<const Batch>> got[3];
  auto rank = [&](int k, int64_t bucket) {
    Engine::Options options;
    options.buckets = {bucket};
    auto engine = MakeEngine(config, options);
    if (engine != nullptr) got[k] = Take(engine.get(), kSteps * 2);
  };
  std::thread r0(rank, 0, 0), r1(rank, 1, 1);
  r0.join();
  r1.join();
  rank(2, 0);  // every count kept
  int64_t with_images = 0;
  for (int k = 0; k < 3; ++k) {
    const int64_t bucket = k == 1 ? 1 : 0;
    ASSERT_EQ(got[k].size(), size_t(kSteps * 2)) << k;
    for (int64_t i = 0; i < kSteps * 2; ++i) {
      const auto& want = *all[size_t((i / 2) * 4 + bucket * 2 + i % 2)];
      ExpectSameBatch(want, *got[k][size_t(i)]);
      with_images += got[k][size_t(i)]->Find("pixel_values") != nullptr;
    }
  }
  EXPECT_GT(with_images, 0);
}

TEST(EngineImageTest, TpPeersOnANodeBuildEachMicroBatchOnceBetweenThem) {
  testing::ScopedTempDir dir("braid-engine-images-peers");
  ASSERT_TRUE(WriteCaptionJob(dir, /*cut_row=*/-1).ok());
  Config config = CaptionConfig(dir.Sub("captions.parquet"), dir.Sub("tok.model"),
                                OnError::kFail, /*workers=*/2);
  config.topology.dp = 2;
  config.topology.tp = 2;
  config.batch.global_tokens = 256;  // 2 micro-batches per DP rank
  ASSERT_TRUE(ValidateConfig(config).ok());
  Engine::Options whole;
  whole.buckets = {1};
  auto reference = MakeEngine(config, whole);  // builds alone
  std::unique_ptr<Engine> peers[2];
  for (int tp = 0; tp < 2; ++tp) {
    Engine::Options o = whole;
    o.view = RankCoords{1, tp, 0, 0};
    o.share_builds_dir = dir.Sub("builds");
    peers[tp] = MakeEngine(config, o);
  }
  ASSERT_TRUE(reference && peers[0] && peers[1]);
  constexpr int64_t kSteps = 8;
  for (int64_t i = 0; i < kSteps * 2; ++i) {
    auto full = reference->Next();
    ASSERT_TRUE(full.ok()) << full.status().ToString();
    for (int tp = 0; tp < 2; ++tp) {
      auto got = peers[tp]->Next();
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      auto want = ViewFor(**full, config.topology, RankCoords{1, tp, 0, 0});
      ASSERT_TRUE(want.ok());
      ExpectSameBatch(**got, *want);
    }
  }
  // Every step both took was built by one of them and mapped by the other.
  EXPECT_GE(peers[0]->shared_builds() + peers[1]->shared_builds(), kSteps);
  EXPECT_EQ(reference->shared_builds(), 0);
  peers[0].reset();
  peers[1].reset();
  // Each removes the builds it wrote and the locks it took when it goes: nothing is
  // left of the folder.
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("builds")));
}

// ---------------------------------------------------------------------------
// Ranks of one node that share a tokenized source's counts (runtime.length_cache).

TEST(EngineSharedCountsTest, RanksAtOnceBuildWhatOneProcessBuildsAndTokenizeTheirRows) {
  testing::ScopedTempDir dir("braid-engine-shared-counts");
  ASSERT_TRUE(testing::TrainTinySentencePiece(testing::RandomSentences(300, 5),
                                              dir.Sub("tok"), 100)
                  .ok());
  const auto texts = testing::RandomSentences(200, 7, 10, 120);
  ASSERT_TRUE(testing::WriteTextFile(dir.Sub("text/part-0.parquet"), "text",
                                     {texts.begin(), texts.end()}, /*row_group_rows=*/16)
                  .ok());
  Config config;
  config.seed = 6;
  config.topology.dp = 2;
  config.batch.seq_len = 128;
  config.batch.global_tokens = 512;  // 2 micro-batches per rank
  config.tokenizer.model = dir.Sub("tok.model");
  SourceConfig text;
  text.name = "text";
  text.path = dir.Sub("text");
  text.text_column = "text";
  text.shuffle_window_rows = 32;
  config.sources.push_back(text);
  ASSERT_TRUE(ValidateConfig(config).ok());
  constexpr int64_t kSteps = 8;
  auto both = MakeEngine(config);  // one process builds both ranks, no cache
  ASSERT_NE(both, nullptr);
  const auto all = Take(both.get(), kSteps * 4);
  ASSERT_EQ(all.size(), size_t(kSteps * 4));
  config.sources[0].length_cache_dir = dir.Sub("lens");
  // Both ranks at once (their loaders meet at each entry's lock), then rank 1 again with
  // every count kept.
  std::vector<std::shared_ptr<const Batch>> got[3];
  std::vector<SourceProfile> profiles[3];
  auto rank = [&](int k, int64_t bucket) {
    Engine::Options options;
    options.buckets = {bucket};
    auto engine = MakeEngine(config, options);
    if (engine == nullptr) return;
    got[k] = Take(engine.get(), kSteps * 2);
    profiles[k] = engine->source_profiles();
  };
  std::thread r0(rank, 0, 0), r1(rank, 1, 1);
  r0.join();
  r1.join();
  rank(2, 1);
  for (int k = 0; k < 3; ++k) {
    const int64_t bucket = k == 0 ? 0 : 1;
    ASSERT_EQ(got[k].size(), size_t(kSteps * 2)) << k;
    for (int64_t step = 0; step < kSteps; ++step) {
      for (int64_t mb = 0; mb < 2; ++mb) {
        ExpectSameBatch(*all[size_t(step * 4 + bucket * 2 + mb)],
                        *got[k][size_t(step * 2 + mb)]);
      }
    }
  }
  // The last found every count kept: it tokenized only rows it was asked for, when
  // planned for its rank, never in its read steps.
  ASSERT_EQ(profiles[2].size(), 1u);
  EXPECT_GT(profiles[2][0].payloads_finished, 0);
  EXPECT_LT(profiles[2][0].payloads_finished, profiles[2][0].samples);
}

}  // namespace
}  // namespace braid
