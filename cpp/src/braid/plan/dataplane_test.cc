#include "braid/plan/dataplane.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "braid/runtime/job.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::HasSubstr;

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
  auto planned = DataPlane(Base()).Plan();
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_EQ(PlanLines(*planned, 3), PlanLines(Base(), 3));
}

TEST_F(DataPlaneTest, SamePlanAsTheEquivalentYaml) {
  const Config yaml = Parse(Yaml(", weight: 0.7", ", weight: {schedule: [[0, 0.1], [4, 0.3]]}",
                                 "balance: {cost: {attn: 1.0, linear: 4096}, "
                                 "algorithm: greedy}\n"));
  WeightSchedule code;
  code.points = {{0, 0.1}, {4, 0.3}};
  auto built = DataPlane(Base())
                   .Mix("web", 0.7)
                   .Mix("code", code)
                   .Distribute("dp")
                   .Cost(1.0, 4096)
                   .Balance("greedy")
                   .BroadcastAt("tp")
                   .Plan();
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
  auto built = DataPlane(Base()).Mix({{"web", web}, {"code", code}}).Balance("none").Plan();
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  EXPECT_EQ(PlanLines(*built, 6), PlanLines(yaml, 6));
}

Status PlanStatus(const DataPlane& plane) { return plane.Plan().status(); }

TEST_F(DataPlaneTest, BadArgumentsNameThePrimitive) {
  auto message = [](const DataPlane& p) { return PlanStatus(p).message(); };
  EXPECT_THAT(message(DataPlane(Base()).Mix("web", -1.0)),
              HasSubstr("mix.web: must be a finite number >= 0"));
  EXPECT_THAT(message(DataPlane(Base()).Mix("nope", 1.0)), HasSubstr("mix.nope: unknown source"));
  WeightSchedule bad;
  bad.points = {{0, 0.1}, {0, 0.2}};
  EXPECT_THAT(message(DataPlane(Base()).Mix("code", bad)),
              HasSubstr("mix.code.schedule[1][0]: steps must be >= 0 and strictly increasing"));
  bad.points = {{0, 0.1}, {5, -0.2}};
  EXPECT_THAT(message(DataPlane(Base()).Mix("code", bad)),
              HasSubstr("mix.code.schedule[1][1]: must be a finite number >= 0"));
  EXPECT_THAT(message(DataPlane(Base()).Mix("web", 0.0).Mix("code", 0.0)),
              HasSubstr("mix: all weights are 0 at step 0"));
  EXPECT_THAT(message(DataPlane(Base()).Balance("x")), HasSubstr("balance: unknown method 'x'"));
  EXPECT_THAT(message(DataPlane(Base()).Cost(-1, 0)), HasSubstr("cost.attn: must be"));
  EXPECT_THAT(message(DataPlane(Base()).Cost(1, -2)), HasSubstr("cost.linear: must be"));
  EXPECT_THAT(message(DataPlane(Base()).Distribute("rows")),
              HasSubstr("distribute: unknown axis 'rows'"));
  // world != dp here (tp = 2): not the same buckets as dp.
  EXPECT_THAT(message(DataPlane(Base()).Distribute("world")),
              HasSubstr("distribute: axis 'world'"));
  EXPECT_THAT(message(DataPlane(Base()).BroadcastAt("dp")), HasSubstr("broadcast_at: 'dp'"));
  EXPECT_THAT(message(DataPlane(Base()).BroadcastAt("cp")), HasSubstr("broadcast_at: 'cp'"));
  EXPECT_THAT(message(DataPlane(Base()).BroadcastAt("ep")),
              HasSubstr("broadcast_at: unknown dimension 'ep'"));
  // Errors are config errors (exit code 2, braid.ConfigError), and the first one wins.
  const Status st = PlanStatus(DataPlane(Base()).Balance("x").Mix("web", -1.0));
  ASSERT_NE(GetErrorDetail(st), nullptr);
  EXPECT_EQ(GetErrorDetail(st)->kind(), ErrorKind::kConfig);
  EXPECT_EQ(GetErrorDetail(st)->where(), "balance");
}

TEST_F(DataPlaneTest, AxesAndBroadcastDims) {
  DataPlane plane(Base());
  EXPECT_EQ(plane.distribute_axis(), "dp");
  EXPECT_EQ(plane.broadcast_dims(), (std::vector<std::string>{"tp", "pp"}));
  plane.Distribute("cp").BroadcastAt("pp").BroadcastAt("tp").BroadcastAt("pp");
  EXPECT_EQ(plane.distribute_axis(), "cp");  // cp == 1: the same buckets as dp
  EXPECT_EQ(plane.broadcast_dims(), (std::vector<std::string>{"pp", "tp"}));
  auto planned = plane.Plan();
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_EQ(PlanLines(*planned, 2), PlanLines(Base(), 2));
}

}  // namespace
}  // namespace braid
