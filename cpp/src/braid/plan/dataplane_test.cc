#include "braid/dataplane.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "braid/cli/job.h"
#include "braid/config/job_config_internal.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::HasSubstr;

// The public DataPlane takes and returns JobConfigs; these tests look inside them.
JobConfig Job(Config config) { return JobConfigInternal::Wrap(std::move(config)); }
Config ToConfig(const JobConfig& job) { return JobConfigInternal::Get(job); }

class DataPlaneTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::ScopedTempDir("braid-dataplane");
    testing::LengthSpec spec;
    spec.median_tokens = 200;
    spec.max_tokens = 2048;
    ASSERT_TRUE(testing::WriteTokenFile(dir_->Sub("web.parquet"),
                                        testing::RandomDocs(2000, spec, 1))
                    .ok());
    ASSERT_TRUE(testing::WriteTokenFile(dir_->Sub("code.parquet"),
                                        testing::RandomDocs(2000, spec, 2))
                    .ok());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // The base: seed, topology, batch, sources with default weights and balance.
  static std::string Yaml(const std::string& web_weight, const std::string& code_weight,
                          const std::string& balance) {
    return "seed: 7\n"
           "topology: {dp: 4, tp: 2}\n"
           "runtime: {kind: local, prefetch_steps: 2}\n"
           "batch: {global_tokens: 16384, seq_len: 1024, micro_batch_size: 1}\n" +
           balance +
           "sources:\n"
           "  - {name: web, path: web.parquet, tokens_column: input_ids" +
           web_weight +
           "}\n"
           "  - {name: code, path: code.parquet, tokens_column: input_ids" +
           code_weight + "}\n";
  }
  static Config Parse(const std::string& text) {
    auto c = ParseConfig(text, dir_->path().string());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ValueOrDie();
  }
  static Config Base() { return Parse(Yaml("", "", "")); }
  static DataPlane Plane() { return DataPlane(Job(Base())); }

  static std::vector<std::string> PlanLines(const Config& config, int64_t steps) {
    std::vector<std::string> lines;
    auto state = RunPlanJob(config, steps, "", [&](const std::string& line) {
      lines.push_back(line);
      return Status::OK();
    });
    EXPECT_TRUE(state.ok()) << state.status().ToString();
    if (state.ok()) lines.push_back(*state);
    return lines;
  }

  static testing::ScopedTempDir* dir_;
};
testing::ScopedTempDir* DataPlaneTest::dir_ = nullptr;

TEST_F(DataPlaneTest, NoCallsPlansTheBase) {
  auto planned = Plane().Plan().Map(ToConfig);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_EQ(PlanLines(*planned, 3), PlanLines(Base(), 3));
}

TEST_F(DataPlaneTest, SamePlanAsTheEquivalentYaml) {
  const Config yaml = Parse(Yaml(", weight: 0.7", ", weight: {schedule: [[0, 0.1], [4, 0.3]]}",
                                 "balance: {cost: {attn: 1.0, linear: 4096}, "
                                 "algorithm: greedy}\n"));
  WeightSchedule code;
  code.points = {{0, 0.1}, {4, 0.3}};
  auto built = Plane()
                   .Mix("web", 0.7)
                   .Mix("code", code)
                   .Distribute("dp")
                   .Cost(1.0, 4096)
                   .Balance("greedy")
                   .BroadcastAt("tp")
                   .Plan().Map(ToConfig);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  EXPECT_EQ(built->Fingerprint(), yaml.Fingerprint());
  const auto a = PlanLines(*built, 8);
  const auto b = PlanLines(yaml, 8);
  ASSERT_EQ(a.size(), 9u);
  EXPECT_EQ(a, b);
  // The mix and the balance took effect: not the base's plan.
  EXPECT_NE(a, PlanLines(Base(), 8));
}

TEST_F(DataPlaneTest, StepwiseAndBatchMixMatchYaml) {
  const Config yaml = Parse(Yaml(", weight: {steps: [[0, 1], [3, 0]]}", ", weight: 0.5",
                                 "balance: {algorithm: none}\n"));
  WeightSchedule web;
  web.points = {{0, 1.0}, {3, 0.0}};
  web.stepwise = true;
  WeightSchedule code;
  code.points = {{0, 0.5}};
  auto built =
      Plane().Mix({{"web", web}, {"code", code}}).Balance("none").Plan().Map(ToConfig);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  EXPECT_EQ(PlanLines(*built, 6), PlanLines(yaml, 6));
}

Status PlanStatus(const DataPlane& plane) { return plane.Plan().status(); }

TEST_F(DataPlaneTest, BadArgumentsNameThePrimitive) {
  auto message = [](const DataPlane& p) { return PlanStatus(p).message(); };
  EXPECT_THAT(message(Plane().Mix("web", -1.0)),
              HasSubstr("mix.web: must be a finite number >= 0"));
  EXPECT_THAT(message(Plane().Mix("nope", 1.0)), HasSubstr("mix.nope: unknown source"));
  WeightSchedule bad;
  bad.points = {{0, 0.1}, {0, 0.2}};
  EXPECT_THAT(message(Plane().Mix("code", bad)),
              HasSubstr("mix.code.schedule[1][0]: steps must be >= 0 and strictly increasing"));
  bad.points = {{0, 0.1}, {5, -0.2}};
  EXPECT_THAT(message(Plane().Mix("code", bad)),
              HasSubstr("mix.code.schedule[1][1]: must be a finite number >= 0"));
  EXPECT_THAT(message(Plane().Mix("web", 0.0).Mix("code", 0.0)),
              HasSubstr("mix: all weights are 0 at step 0"));
  EXPECT_THAT(message(Plane().Balance("x")), HasSubstr("balance: unknown method 'x'"));
  EXPECT_THAT(message(Plane().Cost(-1, 0)), HasSubstr("cost.attn: must be"));
  EXPECT_THAT(message(Plane().Cost(1, -2)), HasSubstr("cost.linear: must be"));
  EXPECT_THAT(message(Plane().Distribute("rows")),
              HasSubstr("distribute: unknown axis 'rows'"));
  // world here: dp 4 x tp 2 = 8 slots; a group of 3 does not divide them.
  EXPECT_THAT(message(Plane().Distribute("world", 3)),
              HasSubstr("distribute.group: must divide"));
  EXPECT_THAT(message(Plane().Distribute("dp", 0)),
              HasSubstr("distribute.group: must be > 0"));
  EXPECT_THAT(message(Plane().Cost(1, 0, -1, "hybrid")),
              HasSubstr("cost.vision: must be"));
  EXPECT_THAT(message(Plane().Cost(1, 0, 1, "x")),
              HasSubstr("cost.mode: unknown mode 'x'"));
  EXPECT_THAT(message(Plane().Phase(4, 512).Phase(4, 512)),
              HasSubstr("phase[1].until_step: must be > 0 and greater"));
  EXPECT_THAT(message(Plane().Phase(4, 512, {{"nope", WeightSchedule{}}})),
              HasSubstr("phase[0].weights.nope: is not a source name"));
  EXPECT_THAT(message(Plane().BroadcastAt("dp")), HasSubstr("broadcast_at: 'dp'"));
  EXPECT_THAT(message(Plane().BroadcastAt("cp")), HasSubstr("broadcast_at: 'cp'"));
  EXPECT_THAT(message(Plane().BroadcastAt("ep")),
              HasSubstr("broadcast_at: unknown dimension 'ep'"));
  // Errors are config errors (exit code 2, braid.ConfigError), and the first one wins.
  const Status st = PlanStatus(Plane().Balance("x").Mix("web", -1.0));
  ASSERT_NE(GetErrorDetail(st), nullptr);
  EXPECT_EQ(GetErrorDetail(st)->kind(), ErrorKind::kConfig);
  EXPECT_EQ(GetErrorDetail(st)->where(), "balance");
}

TEST_F(DataPlaneTest, AxesAndBroadcastDims) {
  DataPlane plane = Plane();
  EXPECT_EQ(plane.distribute_axis(), "dp");
  EXPECT_EQ(plane.broadcast_dims(), (std::vector<std::string>{"tp", "pp"}));
  plane.Distribute("cp").BroadcastAt("pp").BroadcastAt("tp").BroadcastAt("pp");
  EXPECT_EQ(plane.distribute_axis(), "cp");  // cp == 1: the same buckets as dp
  EXPECT_EQ(plane.broadcast_dims(), (std::vector<std::string>{"tp", "pp"}));
  auto planned = plane.Plan().Map(ToConfig);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_EQ(planned->topology.buckets(), 4);
  EXPECT_EQ(PlanLines(*planned, 2), PlanLines(Base(), 2));
}

// distribute("world") gives every rank (dp 4 x tp 2) its own bucket, as the YAML
// topology.distribute does; broadcast_at("tp") brings back one bucket per DP rank.
TEST_F(DataPlaneTest, DistributeWorldMatchesYamlAndBroadcastAtTakesDimsBack) {
  auto world = Plane().Distribute("world").Plan().Map(ToConfig);
  ASSERT_TRUE(world.ok()) << world.status().ToString();
  EXPECT_EQ(world->topology.buckets(), 8);
  EXPECT_EQ(world->micro_batches_per_rank(), 2);
  EXPECT_TRUE(world->topology.distributed(Dim::kTp));
  std::string yaml = Yaml("", "", "");
  yaml.replace(yaml.find("{dp: 4, tp: 2}"), 14, "{dp: 4, tp: 2, distribute: world}");
  const Config from_yaml = Parse(yaml);
  EXPECT_EQ(from_yaml.topology.buckets(), 8);
  const auto lines = PlanLines(*world, 3);
  EXPECT_EQ(lines, PlanLines(from_yaml, 3));
  EXPECT_NE(lines, PlanLines(Base(), 3));
  // Every plan line lists 8 buckets.
  EXPECT_NE(lines[0].find("\"dp\":7"), std::string::npos);

  DataPlane back = Plane();
  back.Distribute("world").BroadcastAt("tp");
  EXPECT_EQ(back.broadcast_dims(), (std::vector<std::string>{"tp"}));
  auto tp_shared = back.Plan().Map(ToConfig);
  ASSERT_TRUE(tp_shared.ok()) << tp_shared.status().ToString();
  EXPECT_EQ(tp_shared->topology.buckets(), 4);
  EXPECT_EQ(PlanLines(*tp_shared, 3), PlanLines(Base(), 3));

  auto grouped = Plane().Distribute("world", 2).Plan().Map(ToConfig);
  ASSERT_TRUE(grouped.ok()) << grouped.status().ToString();
  EXPECT_EQ(grouped->topology.buckets(), 4);
}

TEST_F(DataPlaneTest, PhaseAndVisionCostMatchYaml) {
  const Config yaml =
      Parse(Yaml("", "",
                 "balance: {cost: {attn: 1.0, linear: 16, vision: 8, mode: backbone}}\n"
                 "phases:\n"
                 "  - {until_step: 2, seq_len: 512, weights: {web: 0}}\n"
                 "  - {until_step: 4, weights: {code: {schedule: [[0, 1], [4, 3]]}}}\n"));
  WeightSchedule off;
  off.points = {{0, 0.0}};
  WeightSchedule ramp;
  ramp.points = {{0, 1.0}, {4, 3.0}};
  auto built = Plane()
                   .Phase(/*until_step=*/2, /*seq_len=*/512, {{"web", off}})
                   .Phase(/*until_step=*/4, /*seq_len=*/0, {{"code", ramp}})
                   .Cost(1.0, 16, /*vision=*/8, "backbone")
                   .Plan().Map(ToConfig);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  ASSERT_EQ(built->phases.size(), 2u);
  EXPECT_EQ(built->SeqLenAt(1), 512);
  EXPECT_EQ(built->SeqLenAt(2), 1024);
  EXPECT_EQ(built->WeightAt(0, 1), 0.0);
  EXPECT_EQ(built->balance.vision, 8.0);
  EXPECT_EQ(built->balance.cost_mode, BalanceConfig::CostMode::kBackbone);
  EXPECT_EQ(built->Fingerprint(), yaml.Fingerprint());
  const auto a = PlanLines(*built, 6);
  EXPECT_EQ(a, PlanLines(yaml, 6));
  EXPECT_NE(a, PlanLines(Base(), 6));
}

}  // namespace
}  // namespace braid
