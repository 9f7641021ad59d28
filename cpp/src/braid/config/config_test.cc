#include "braid/config/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A token-column job as README.md shows one (tokenizer, phases, text and image sources
// are tested below).
constexpr const char* kSketch = R"(
seed: 1234
topology: {dp: 8, tp: 2, pp: 1, cp: 1}
batch: {global_tokens: 262144, seq_len: 8192, micro_batch_size: 1, packing: true}
# micro-batches per DP rank = global_tokens / (dp * micro_batch_size * seq_len) = 4 here
balance: {cost: {attn: 1.0, linear: 4096}, algorithm: karmarkar_karp}
sources:
  - name: web
    path: data/web/*.parquet
    tokens_column: input_ids
    weight: 0.6
    oversize: split
    on_error: fail
  - name: code
    path: data/code/*.parquet
    tokens_column: input_ids
    weight: {schedule: [[0, 0.1], [1000, 0.3]]}
  - name: captions
    path: /abs/captions
    tokens_column: tokens
    weight: 0.1
    oversize: truncate
    on_error: skip
    shuffle_window: 128
runtime: {kind: local, read_ahead_bytes: 1048576, prefetch_steps: 3}
)";

// A minimal valid config with `extra` YAML appended under the root.
std::string Minimal(const std::string& batch = "{global_tokens: 4096, seq_len: 1024}",
                    const std::string& source_extra = "") {
  return "batch: " + batch +
         "\nsources:\n  - {name: a, path: a.parquet, tokens_column: ids" + source_extra +
         "}\n  - {name: b, path: b.parquet, tokens_column: ids}\n";
}

// Parses and expects a config error whose message starts with `key` + ":".
void ExpectConfigError(const std::string& text, const std::string& key,
                       const std::string& what = "") {
  auto c = ParseConfig(text, "/base");
  ASSERT_FALSE(c.ok()) << "expected an error at " << key << " for:\n" << text;
  const Status& st = c.status();
  EXPECT_TRUE(st.IsInvalid()) << st.ToString();
  EXPECT_THAT(st.message(), StartsWith(key + ":")) << text;
  if (!what.empty()) {
    EXPECT_THAT(st.message(), HasSubstr(what));
  }
  const auto* detail = GetErrorDetail(st);
  ASSERT_NE(detail, nullptr);
  EXPECT_EQ(detail->kind(), ErrorKind::kConfig);
  EXPECT_EQ(detail->where(), key);
}

TEST(ConfigTest, ParsesTheDesignSketch) {
  auto parsed = ParseConfig(kSketch, "/jobs/run1");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const Config& c = *parsed;
  EXPECT_EQ(c.seed, 1234u);
  EXPECT_EQ(c.topology.dp, 8);
  EXPECT_EQ(c.topology.tp, 2);
  EXPECT_EQ(c.topology.pp, 1);
  EXPECT_EQ(c.topology.cp, 1);
  EXPECT_EQ(c.topology.world_size(), 16);
  EXPECT_EQ(c.batch.global_tokens, 262144);
  EXPECT_EQ(c.batch.seq_len, 8192);
  EXPECT_EQ(c.batch.micro_batch_size, 1);
  EXPECT_TRUE(c.batch.packing);
  EXPECT_EQ(c.sequences_per_step(), 32);
  EXPECT_EQ(c.micro_batches_per_rank(), 4);
  EXPECT_DOUBLE_EQ(c.balance.attn, 1.0);
  EXPECT_DOUBLE_EQ(c.balance.linear, 4096);
  EXPECT_EQ(c.balance.algorithm, BalanceAlgorithm::kKarmarkarKarp);
  EXPECT_EQ(c.runtime.read_ahead_bytes, 1048576);
  EXPECT_EQ(c.runtime.prefetch_steps, 3);
  EXPECT_EQ(c.base_dir, "/jobs/run1");
  ASSERT_EQ(c.sources.size(), 3u);

  const SourceConfig& web = c.sources[0];
  EXPECT_EQ(web.name, "web");
  EXPECT_EQ(web.path, "/jobs/run1/data/web/*.parquet");  // relative: against base_dir
  EXPECT_EQ(web.tokens_column, "input_ids");
  EXPECT_DOUBLE_EQ(web.weight.At(0), 0.6);
  EXPECT_DOUBLE_EQ(web.weight.At(123456), 0.6);
  EXPECT_EQ(web.oversize, Oversize::kSplit);
  EXPECT_EQ(web.on_error, OnError::kFail);
  EXPECT_EQ(web.shuffle_window_rows, 4096);  // default

  const SourceConfig& code = c.sources[1];
  ASSERT_EQ(code.weight.points.size(), 2u);
  EXPECT_EQ(code.weight.points[0], (std::pair<int64_t, double>{0, 0.1}));
  EXPECT_EQ(code.weight.points[1], (std::pair<int64_t, double>{1000, 0.3}));
  EXPECT_DOUBLE_EQ(code.weight.At(500), 0.2);

  const SourceConfig& captions = c.sources[2];
  EXPECT_EQ(captions.path, "/abs/captions");  // absolute: as written
  EXPECT_EQ(captions.tokens_column, "tokens");
  EXPECT_EQ(captions.oversize, Oversize::kTruncate);
  EXPECT_EQ(captions.on_error, OnError::kSkip);
  EXPECT_EQ(captions.shuffle_window_rows, 128);
}

TEST(ConfigTest, DefaultsOfAMinimalConfig) {
  auto c = ParseConfig(Minimal(), "");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->seed, 0u);
  EXPECT_EQ(c->topology.dp, 1);
  EXPECT_EQ(c->batch.micro_batch_size, 1);
  EXPECT_EQ(c->balance.algorithm, BalanceAlgorithm::kKarmarkarKarp);
  EXPECT_DOUBLE_EQ(c->balance.attn, 1.0);
  EXPECT_DOUBLE_EQ(c->balance.linear, 0.0);
  EXPECT_EQ(c->runtime.read_ahead_bytes, int64_t{64} << 20);
  EXPECT_DOUBLE_EQ(c->sources[0].weight.At(0), 1.0);
  // No base dir: relative to the working directory, made absolute.
  EXPECT_EQ(c->sources[0].path,
            (std::filesystem::current_path() / "a.parquet").lexically_normal().string());
  EXPECT_EQ(c->micro_batches_per_rank(), 4);
}

TEST(ConfigTest, JsonIsAccepted) {
  auto c = ParseConfig(
      R"({"seed": 3, "batch": {"global_tokens": 2048, "seq_len": 512},
          "balance": {"algorithm": "greedy"},
          "sources": [{"name": "x", "path": "s3://bucket/x/", "tokens_column": "t",
                       "weight": {"schedule": [[0, 1], [10, 0.5]]}}]})",
      "/base");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->seed, 3u);
  EXPECT_EQ(c->balance.algorithm, BalanceAlgorithm::kGreedy);
  EXPECT_EQ(c->sources[0].path, "s3://bucket/x/");  // URIs are not resolved
  EXPECT_DOUBLE_EQ(c->sources[0].weight.At(5), 0.75);
}

TEST(ConfigTest, UnknownKeysNameTheirPath) {
  ExpectConfigError("foo: 1\n" + Minimal(), "foo", "unknown key");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024, foo: 2}"), "batch.foo",
                    "unknown key");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024}", ", bar: 1"),
                    "sources[0].bar");
  ExpectConfigError(
      "batch: {global_tokens: 4096, seq_len: 1024}\nsources:\n"
      "  - {name: a, path: a, tokens_column: t}\n  - {name: b, path: b, tokens_column: "
      "t, "
      "bar: 1}\n",
      "sources[1].bar", "unknown key");
  ExpectConfigError("topology: {dp: 1, ep: 2}\n" + Minimal(), "topology.ep");
  ExpectConfigError("balance: {cost: {attn: 1, quadratic: 2}}\n" + Minimal(),
                    "balance.cost.quadratic");
  ExpectConfigError("runtime: {reader_threads: 4}\n" + Minimal(), "runtime.reader_threads");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024}",
                            ", weight: {schedule: [[0, 1]], ramp: 2}"),
                    "sources[0].weight.ramp");
}

TEST(ConfigTest, BadWeightsNameTheirPath) {
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024}", ", weight: -0.5"),
                    "sources[0].weight", ">= 0");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024}", ", weight: heavy"),
                    "sources[0].weight", "a number");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024}", ", weight: .inf"),
                    "sources[0].weight");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024}",
                            ", weight: {schedule: [[0, 1], [10, -1]]}"),
                    "sources[0].weight.schedule[1][1]");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024}",
                            ", weight: {schedule: [[10, 1], [10, 2]]}"),
                    "sources[0].weight.schedule[1][0]", "strictly increasing");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024}",
                            ", weight: {schedule: [[0, 1, 2]]}"),
                    "sources[0].weight.schedule[0]");
  ExpectConfigError(
      Minimal("{global_tokens: 4096, seq_len: 1024}", ", weight: {schedule: []}"),
      "sources[0].weight.schedule");
  // All weights 0 at some step.
  ExpectConfigError(
      "batch: {global_tokens: 4096, seq_len: 1024}\nsources:\n"
      "  - {name: a, path: a, tokens_column: t, weight: 0}\n"
      "  - {name: b, path: b, tokens_column: t, weight: {schedule: [[0, 1], [5, 0]]}}\n",
      "sources", "all weights are 0 at step 5");
}

TEST(ConfigTest, PadToMultipleOfMustDivideEveryTokenCountThePlannerCutsAt) {
  auto ok = ParseConfig(Minimal("{global_tokens: 4096, seq_len: 1024, pad_to_multiple_of: 4}"),
                        "/base");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->batch.pad_to_multiple_of, 4);
  EXPECT_NE(ok->Fingerprint(), ParseConfig(Minimal(), "/base")->Fingerprint());
  EXPECT_EQ(ParseConfig(Minimal("{global_tokens: 4096, seq_len: 1024, pad_to_multiple_of: 1}"),
                        "/base")->Fingerprint(),
            ParseConfig(Minimal(), "/base")->Fingerprint());
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024, pad_to_multiple_of: 0}"),
                    "batch.pad_to_multiple_of", "> 0");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024, pad_to_multiple_of: 3}"),
                    "batch.seq_len", "multiple of batch.pad_to_multiple_of (3)");
  ExpectConfigError("balance: {max_piece: 6}\n" +
                        Minimal("{global_tokens: 4096, seq_len: 1024, pad_to_multiple_of: 4}"),
                    "balance.max_piece", "multiple of batch.pad_to_multiple_of (4)");
}

TEST(ConfigTest, BatchShapeMustDivide) {
  ExpectConfigError(Minimal("{global_tokens: 4000, seq_len: 1024}"),
                    "batch.global_tokens", "multiple of batch.seq_len");
  // 4 sequences do not split over dp=3.
  ExpectConfigError("topology: {dp: 3}\n" + Minimal(), "batch.global_tokens",
                    "topology.dp * batch.micro_batch_size");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024, micro_batch_size: 3}"),
                    "batch.global_tokens");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 0}"), "batch.seq_len", "> 0");
  ExpectConfigError(Minimal("{global_tokens: many, seq_len: 1024}"),
                    "batch.global_tokens");
  ExpectConfigError(Minimal("{seq_len: 1024}"), "batch.global_tokens", "required");
  ExpectConfigError("topology: {dp: 0}\n" + Minimal(), "topology.dp", "> 0");
}

TEST(ConfigTest, OtherBadValuesNameTheirPath) {
  ExpectConfigError("sources: []\nbatch: {global_tokens: 1024, seq_len: 1024}\n",
                    "sources");
  ExpectConfigError("batch: {global_tokens: 1024, seq_len: 1024}\n", "sources",
                    "required");
  ExpectConfigError("sources: [{name: a, path: a, tokens_column: t}]\n", "batch",
                    "required");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024}", ", oversize: wrap"),
                    "sources[0].oversize", "split | truncate | skip");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024}", ", on_error: ignore"),
                    "sources[0].on_error");
  ExpectConfigError(
      Minimal("{global_tokens: 4096, seq_len: 1024}", ", shuffle_window: 0"),
      "sources[0].shuffle_window");
  ExpectConfigError("balance: {algorithm: magic}\n" + Minimal(), "balance.algorithm");
  ExpectConfigError("balance: {cost: {attn: -1}}\n" + Minimal(), "balance.cost.attn");
  ExpectConfigError(
      "batch: {global_tokens: 4096, seq_len: 1024}\nsources:\n"
      "  - {name: a, path: a, tokens_column: t}\n  - {name: a, path: b, tokens_column: "
      "t}\n",
      "sources[1].name", "duplicate");
  ExpectConfigError(
      "batch: {global_tokens: 4096, seq_len: 1024}\nsources:\n  - {path: a, "
      "tokens_column: t}\n",
      "sources[0].name", "required");
  ExpectConfigError(
      "batch: {global_tokens: 4096, seq_len: 1024}\nsources:\n  - {name: a, path: a}\n",
      "sources[0].tokens_column", "required");
  ExpectConfigError("seed: -3\n" + Minimal(), "seed");
  ExpectConfigError("batch: [1, 2]\nsources: [{name: a, path: a, tokens_column: t}]\n",
                    "batch", "mapping");
  ExpectConfigError("- just\n- a list\n", "config", "mapping");
  ExpectConfigError("batch: {global_tokens: [unclosed\n", "config", "YAML");
}

TEST(ConfigTest, UnsupportedFeaturesAreNamedErrors) {
  // Phases are supported since issue 4 (planner); a bad phase names its key path.
  EXPECT_TRUE(ParseConfig("phases: [{until_step: 500, seq_len: 2048}]\n" + Minimal(), "/b").ok());
  ExpectConfigError("phases: [{until_step: 500, seq_len: 3000}]\n" + Minimal(),
                    "phases[0].seq_len");
  ExpectConfigError(
      Minimal("{global_tokens: 4096, seq_len: 1024}", ", image_column: img"),
      "sources[0].image_column");
  // Context parallelism (views): sequences must split into 2*cp equal chunks.
  ExpectConfigError("topology: {cp: 3}\n" + Minimal(), "batch.seq_len", "2 * topology.cp");
  EXPECT_TRUE(ParseConfig("topology: {cp: 4}\n" + Minimal(), "/base").ok());
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024, packing: false}"),
                    "batch.packing");
  ExpectConfigError("runtime: {kind: slurm}\n" + Minimal(), "runtime.kind");
}

TEST(ConfigTest, RayRuntimeKeys) {
  auto c = ParseConfig(
      "runtime: {kind: ray, address: '10.0.0.1:6379', namespace: team, job: run7,\n"
      "  source_actors: 3, steps_in_flight: 4, timeout_s: 30.5,\n"
      "  actor_resources: {loaders: 0.01, cpu_node: 1}}\n" + Minimal(),
      "/base");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->runtime.kind, RuntimeConfig::Kind::kRay);
  EXPECT_EQ(c->runtime.address, "10.0.0.1:6379");
  EXPECT_EQ(c->runtime.ray_namespace, "team");
  EXPECT_EQ(c->runtime.job, "run7");
  EXPECT_EQ(c->runtime.source_actors, 3);
  EXPECT_EQ(c->runtime.steps_in_flight, 4);
  EXPECT_DOUBLE_EQ(c->runtime.timeout_s, 30.5);
  EXPECT_EQ(c->runtime.delivery, RuntimeConfig::Delivery::kNode);  // the default
  ASSERT_EQ(c->runtime.actor_resources.size(), 2u);
  EXPECT_EQ(c->runtime.actor_resources[0].first, "loaders");
  EXPECT_DOUBLE_EQ(c->runtime.actor_resources[1].second, 1.0);
  // The runtime does not change the stream: same fingerprint as the local one.
  auto local = ParseConfig(Minimal(), "/base");
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(c->Fingerprint(), local->Fingerprint());
  // The text is kept, to be parsed again in another process.
  auto again = ParseConfig(c->source_text, c->base_dir);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->runtime.job, "run7");

  ExpectConfigError("runtime: {kind: ray, timeout_s: 0}\n" + Minimal(), "runtime.timeout_s");
  ExpectConfigError("runtime: {kind: ray, source_actors: -1}\n" + Minimal(),
                    "runtime.source_actors");
  EXPECT_TRUE(ParseConfig("runtime: {kind: ray, source_actors: 0}\n" + Minimal(), "/b").ok());
  ExpectConfigError("runtime: {kind: ray, address: ''}\n" + Minimal(), "runtime.address");
  ExpectConfigError("runtime: {kind: ray, actor_resources: [1]}\n" + Minimal(),
                    "runtime.actor_resources");
  ExpectConfigError("runtime: {kind: ray, actor_resources: {gpu: -1}}\n" + Minimal(),
                    "runtime.actor_resources.gpu");
  auto store = ParseConfig("runtime: {kind: ray, delivery: object_store}\n" + Minimal(), "/b");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(store->runtime.delivery, RuntimeConfig::Delivery::kObjectStore);
  ExpectConfigError("runtime: {kind: ray, delivery: tcp}\n" + Minimal(), "runtime.delivery");
  ExpectConfigError("runtime: {kind: ray, shadowing: true}\n" + Minimal(),
                    "runtime.shadowing", "unknown key");
  EXPECT_TRUE(ParseConfig("runtime: {kind: ray, shadow: true}\n" + Minimal(), "/b").ok());
  ExpectConfigError("runtime: {kind: ray, shadow: yes please}\n" + Minimal(),
                    "runtime.shadow");
  ExpectConfigError("runtime: {kind: ray, source_actors: 0, shadow: true}\n" + Minimal(),
                    "runtime.shadow");
}

TEST(WeightScheduleTest, PiecewiseLinearBetweenPointsConstantOutside) {
  WeightSchedule w{{{100, 0.0}, {200, 1.0}, {400, 0.5}}};
  EXPECT_DOUBLE_EQ(w.At(0), 0.0);  // before the first point: its value
  EXPECT_DOUBLE_EQ(w.At(100), 0.0);
  EXPECT_DOUBLE_EQ(w.At(150), 0.5);
  EXPECT_DOUBLE_EQ(w.At(175), 0.75);
  EXPECT_DOUBLE_EQ(w.At(200), 1.0);
  EXPECT_DOUBLE_EQ(w.At(300), 0.75);
  EXPECT_DOUBLE_EQ(w.At(400), 0.5);
  EXPECT_DOUBLE_EQ(w.At(1'000'000), 0.5);  // after the last: its value
  WeightSchedule constant;
  EXPECT_DOUBLE_EQ(constant.At(0), 1.0);
  EXPECT_DOUBLE_EQ(constant.At(99), 1.0);
  WeightSchedule one{{{0, 0.25}}};
  EXPECT_DOUBLE_EQ(one.At(7), 0.25);
}

TEST(ConfigTest, SetDataParallelRechecksTheShape) {
  auto c = ParseConfig(kSketch, "/x");
  ASSERT_TRUE(c.ok());
  Config config = *c;
  ASSERT_TRUE(SetDataParallel(&config, 4).ok());
  EXPECT_EQ(config.topology.dp, 4);
  EXPECT_EQ(config.micro_batches_per_rank(), 8);
  EXPECT_EQ(config.sequences_per_step(), 32);  // independent of dp
  ASSERT_TRUE(SetDataParallel(&config, 32).ok());
  EXPECT_EQ(config.micro_batches_per_rank(), 1);

  Status st = SetDataParallel(&config, 3);  // 32 sequences over 3 ranks
  EXPECT_TRUE(st.IsInvalid());
  EXPECT_THAT(st.message(), StartsWith("batch.global_tokens:"));
  st = SetDataParallel(&config, 64);
  EXPECT_THAT(st.message(), StartsWith("batch.global_tokens:"));
  st = SetDataParallel(&config, 0);
  EXPECT_THAT(st.message(), StartsWith("--dp:"));
  ASSERT_NE(GetErrorDetail(st), nullptr);
  EXPECT_EQ(GetErrorDetail(st)->kind(), ErrorKind::kConfig);
}

// User transforms and sharding (docs/sources.md).
TEST(ConfigTest, UserTransformAndLoadersParseAndAreChecked) {
  const std::string source =
      "batch: {global_tokens: 4096, seq_len: 1024}\nsources:\n  - {name: a, path: "
      "a.parquet, ";
  auto c = ParseConfig(
      source + "transform: {python: 'pkg.mod:fn', columns: [text, id]}, loaders: 3}\n",
      "/base");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->sources[0].user_transform.python, "pkg.mod:fn");
  EXPECT_EQ(c->sources[0].user_transform.columns,
            (std::vector<std::string>{"text", "id"}));
  EXPECT_EQ(c->sources[0].loaders, 3);
  EXPECT_FALSE(c->sources[0].user_transform.batched);
  ExpectConfigError(source + "transform: {columns: [t]}}\n", "sources[0].transform.python");
  ExpectConfigError(source + "transform: {python: 'm:f', columns: [t], batched: 2}}\n",
                    "sources[0].transform.batched");
  ExpectConfigError(source + "transform: {python: 'm:f'}}\n",
                    "sources[0].transform.columns");
  ExpectConfigError(source + "transform: {python: 'm:f', columns: []}}\n",
                    "sources[0].transform.columns");
  ExpectConfigError(source + "transform: {python: 'm:f', columns: [t], x: 1}}\n",
                    "sources[0].transform.x");
  ExpectConfigError(
      source + "tokens_column: ids, transform: {python: 'm:f', columns: [t]}}\n",
      "sources[0]", "exactly one of");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024}", ", loaders: 0"),
                    "sources[0].loaders");
  // The spec and columns are part of the stream's fingerprint; the loader count is not.
  auto other = ParseConfig(
      source + "transform: {python: 'pkg.mod:fn', columns: [text, id]}}\n", "/base");
  auto renamed = ParseConfig(
      source + "transform: {python: 'pkg.mod:fn2', columns: [text, id]}}\n", "/base");
  // Batched or not calls the same function differently but gives the same stream.
  auto batched = ParseConfig(
      source + "transform: {python: 'pkg.mod:fn', columns: [text, id], batched: true}}\n",
      "/base");
  ASSERT_TRUE(other.ok() && renamed.ok());
  ASSERT_TRUE(batched.ok()) << batched.status().ToString();
  EXPECT_TRUE(batched->sources[0].user_transform.batched);
  EXPECT_EQ(other->Fingerprint(), c->Fingerprint());
  EXPECT_EQ(batched->Fingerprint(), c->Fingerprint());
  EXPECT_NE(renamed->Fingerprint(), c->Fingerprint());
}

TEST(ConfigTest, FingerprintCoversTheStreamNotWeightsOrTopology) {
  auto c = ParseConfig(kSketch, "/x");
  ASSERT_TRUE(c.ok());
  const Config base = *c;
  const std::string fp = base.Fingerprint();
  EXPECT_EQ(fp.size(), 16u);
  EXPECT_EQ(fp, ParseConfig(kSketch, "/x")->Fingerprint());  // stable

  Config changed = base;
  changed.sources[0].weight = WeightSchedule{{{0, 0.9}}};
  changed.sources[1].weight = WeightSchedule{{{0, 0.0}, {50, 2.0}}};
  ASSERT_TRUE(SetDataParallel(&changed, 4).ok());
  changed.topology.tp = 8;
  changed.balance.algorithm = BalanceAlgorithm::kNone;
  changed.runtime.prefetch_steps = 9;
  EXPECT_EQ(changed.Fingerprint(), fp);

  auto differs = [&](auto mutate) {
    Config other = base;
    mutate(&other);
    return other.Fingerprint() != fp;
  };
  EXPECT_TRUE(differs([](Config* x) { x->seed = 1235; }));
  EXPECT_TRUE(differs([](Config* x) { x->batch.seq_len = 4096; }));
  EXPECT_TRUE(differs([](Config* x) { x->batch.global_tokens *= 2; }));
  EXPECT_TRUE(differs([](Config* x) { x->batch.micro_batch_size = 2; }));
  EXPECT_TRUE(differs([](Config* x) { x->sources[0].path = "/elsewhere"; }));
  EXPECT_TRUE(differs([](Config* x) { x->sources[2].name = "images"; }));
  EXPECT_TRUE(differs([](Config* x) { x->sources[0].oversize = Oversize::kSkip; }));
  EXPECT_TRUE(differs([](Config* x) { x->sources[1].shuffle_window_rows = 7; }));
  EXPECT_TRUE(differs([](Config* x) { x->sources.pop_back(); }));
}

TEST(ConfigTest, LoadConfigFileResolvesAgainstItsFolderAndNamesIt) {
  testing::ScopedTempDir dir("braid-config");
  const std::string path = dir.Sub("jobs/run.yaml");
  std::filesystem::create_directories(dir.Sub("jobs"));
  std::ofstream(path) << Minimal();
  auto c = LoadConfigFile(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->sources[0].path, dir.Sub("jobs/a.parquet"));
  EXPECT_EQ(c->base_dir, dir.Sub("jobs"));

  const std::string bad = dir.Sub("jobs/bad.yaml");
  std::ofstream(bad) << "bogus: 1\n" << Minimal();
  auto st = LoadConfigFile(bad).status();
  EXPECT_TRUE(st.IsInvalid());
  EXPECT_THAT(st.message(), StartsWith(bad + ": bogus:"));
  ASSERT_NE(GetErrorDetail(st), nullptr);
  EXPECT_EQ(GetErrorDetail(st)->where(), "bogus");
  EXPECT_EQ(GetErrorDetail(st)->kind(), ErrorKind::kConfig);

  st = LoadConfigFile(dir.Sub("missing.yaml")).status();
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("missing.yaml"));
}

TEST(ConfigTest, EnumNamesRoundTrip) {
  EXPECT_STREQ(ToString(Oversize::kSplit), "split");
  EXPECT_STREQ(ToString(Oversize::kTruncate), "truncate");
  EXPECT_STREQ(ToString(Oversize::kSkip), "skip");
  EXPECT_STREQ(ToString(OnError::kFail), "fail");
  EXPECT_STREQ(ToString(OnError::kSkip), "skip");
  EXPECT_STREQ(ToString(BalanceAlgorithm::kKarmarkarKarp), "karmarkar_karp");
  EXPECT_STREQ(ToString(BalanceAlgorithm::kGreedy), "greedy");
  EXPECT_STREQ(ToString(BalanceAlgorithm::kNone), "none");
  for (const char* name : {"karmarkar_karp", "greedy", "none"}) {
    auto c =
        ParseConfig("balance: {algorithm: " + std::string(name) + "}\n" + Minimal(), "");
    ASSERT_TRUE(c.ok());
    EXPECT_STREQ(ToString(c->balance.algorithm), name);
  }
}

// Transforms (docs/sources.md).

const char* kTextSource =
    "batch: {global_tokens: 4096, seq_len: 1024}\n"
    "tokenizer: {type: sentencepiece, model: tok.model, bos: true}\n"
    "sources:\n  - {name: a, path: a, text_column: text, workers: 3}\n";

TEST(ConfigTest, TextSourceAndTokenizerParse) {
  auto c = ParseConfig(kTextSource, "/cfg");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tokenizer.model, "/cfg/tok.model");
  EXPECT_TRUE(c->tokenizer.bos);
  EXPECT_TRUE(c->tokenizer.eos);
  EXPECT_EQ(c->sources[0].text_column, "text");
  EXPECT_EQ(c->sources[0].workers, 3);
  EXPECT_TRUE(c->sources[0].tokens_column.empty());
  auto chat = ParseConfig(
      "batch: {global_tokens: 4096, seq_len: 1024}\ntokenizer: {model: /t.model}\n"
      "sources:\n  - {name: a, path: a, chat: {messages_column: m}}\n"
      "  - {name: b, path: b, chat: {prompt_column: p, response_column: r}}\n",
      "/cfg");
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  EXPECT_EQ(chat->sources[0].chat.messages_column, "m");
  EXPECT_EQ(chat->sources[1].chat.prompt_column, "p");
  EXPECT_EQ(chat->sources[1].chat.response_column, "r");
  // Changing the worker count keeps the fingerprint; changing the tokenizer does not.
  auto more = ParseConfig(std::string(kTextSource).replace(
                              std::string(kTextSource).find("workers: 3"), 10, "workers: 1"),
                          "/cfg");
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(more->Fingerprint(), c->Fingerprint());
  auto no_bos = ParseConfig(std::string(kTextSource).replace(
                                std::string(kTextSource).find("bos: true"), 9, "bos: false"),
                            "/cfg");
  ASSERT_TRUE(no_bos.ok());
  EXPECT_NE(no_bos->Fingerprint(), c->Fingerprint());
}

TEST(ConfigTest, TransformErrorsNameTheKey) {
  const std::string b = "batch: {global_tokens: 4096, seq_len: 1024}\n";
  const std::string tok = "tokenizer: {model: t.model}\n";
  auto expect = [](const std::string& text, const std::string& key, const std::string& what) {
    auto c = ParseConfig(text, "/cfg");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_THAT(c.status().message(), ::testing::HasSubstr(key)) << c.status().ToString();
    EXPECT_THAT(c.status().message(), ::testing::HasSubstr(what)) << c.status().ToString();
  };
  expect(b + "sources: [{name: a, path: a, text_column: t}]\n", "sources[0]", "tokenizer");
  expect(b + tok + "sources: [{name: a, path: a, text_column: t, tokens_column: u}]\n",
         "sources[0]", "exactly one");
  expect(b + tok + "sources: [{name: a, path: a, text_column: t, workers: 0}]\n",
         "sources[0].workers", "> 0");
  expect(b + tok + "sources: [{name: a, path: a, chat: {prompt_column: p}}]\n",
         "sources[0].chat.response_column", "required");
  expect(b + tok + "sources: [{name: a, path: a, chat: {messages_column: m, prompt_column: p}}]\n",
         "sources[0].chat", "messages_column");
  expect(b + "tokenizer: {type: bpe, model: t}\nsources: [{name: a, path: a, text_column: t}]\n",
         "tokenizer.type", "sentencepiece");
  expect(b + "tokenizer: {bos: true}\nsources: [{name: a, path: a, text_column: t}]\n",
         "tokenizer.model", "required");
  // Hugging Face: `file`, its own options; SentencePiece keys are refused and vice versa.
  const std::string src = "sources: [{name: a, path: a, text_column: t}]\n";
  expect(b + "tokenizer: {type: huggingface, model: t.json}\n" + src, "tokenizer.model",
         "unknown");
  expect(b + "tokenizer: {type: huggingface}\n" + src, "tokenizer.file", "required");
  expect(b + "tokenizer: {type: huggingface, file: t.json, eos: true}\n" + src,
         "tokenizer.eos", "unknown");
  expect(b + "tokenizer: {type: huggingface, file: t.json, add_special_tokens: 3}\n" + src,
         "tokenizer.add_special_tokens", "boolean");
  expect(b + "tokenizer: {type: huggingface, file: t.json, eos_token: ''}\n" + src,
         "tokenizer.eos_token", "empty");
  expect(b + "tokenizer: {type: huggingface, file: t.json, chat_template: jinja}\n" + src,
         "tokenizer.chat_template", "auto | plain");
  expect(b + tok + "sources: [{name: a, path: a, text_column: t, tokenizer: {type: "
                   "huggingface}}]\n",
         "sources[0].tokenizer.file", "required");
  expect(b + "sources: [{name: a, path: a, tokens_column: t, tokenizer: {model: m}}]\n",
         "sources[0].tokenizer", "only text_column and chat");
}

TEST(ConfigTest, HuggingFaceTokenizerRootAndPerSource) {
  const std::string text =
      "batch: {global_tokens: 4096, seq_len: 1024}\n"
      "tokenizer: {type: huggingface, file: hf/tokenizer.json}\n"
      "sources:\n"
      "  - {name: a, path: a, text_column: t}\n"
      "  - {name: b, path: b, chat: {messages_column: m},\n"
      "     tokenizer: {type: huggingface, file: /other.json, add_special_tokens: false,\n"
      "                 bos_token: '<s>', eos_token: '</s>', chat_template: plain}}\n"
      "  - {name: c, path: c, text_column: t, tokenizer: {model: sp.model}}\n";
  auto c = ParseConfig(text, "/cfg");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->tokenizer.huggingface());
  EXPECT_EQ(c->tokenizer.model, "/cfg/hf/tokenizer.json");
  EXPECT_TRUE(c->tokenizer.add_special_tokens);
  EXPECT_EQ(c->tokenizer.key, "tokenizer");
  EXPECT_EQ(&c->TokenizerFor(0), &c->tokenizer);
  const TokenizerConfig& b = c->TokenizerFor(1);
  EXPECT_TRUE(b.huggingface());
  EXPECT_EQ(b.model, "/other.json");
  EXPECT_FALSE(b.add_special_tokens);
  EXPECT_EQ(b.bos_token, "<s>");
  EXPECT_EQ(b.eos_token, "</s>");
  EXPECT_FALSE(b.chat_template);
  EXPECT_TRUE(c->tokenizer.chat_template);  // auto, the default
  EXPECT_EQ(b.key, "sources[1].tokenizer");
  const TokenizerConfig& sp = c->TokenizerFor(2);
  EXPECT_FALSE(sp.huggingface());
  EXPECT_EQ(sp.model, "/cfg/sp.model");
  // Every tokenizer option is part of the fingerprint.
  for (const auto& [from, to] : {std::pair{"add_special_tokens: false", "add_special_tokens: true"},
                                 std::pair{"eos_token: '</s>'", "eos_token: '<e>'"},
                                 std::pair{"chat_template: plain", "chat_template: auto"},
                                 std::pair{"file: /other.json", "file: /x.json"},
                                 std::pair{"sp.model", "sp2.model"}}) {
    std::string changed = text;
    changed.replace(changed.find(from), std::string(from).size(), to);
    auto d = ParseConfig(changed, "/cfg");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_NE(d->Fingerprint(), c->Fingerprint()) << from;
  }
  // A source's own tokenizer suffices without a root one.
  auto own = ParseConfig(
      "batch: {global_tokens: 4096, seq_len: 1024}\n"
      "sources: [{name: a, path: a, text_column: t, tokenizer: {type: huggingface, "
      "file: t.json}}]\n",
      "/cfg");
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  EXPECT_EQ(own->TokenizerFor(0).model, "/cfg/t.json");
}

TEST(ConfigTest, ThreadsMemoryBudgetAndWindowBytes) {
  auto c = ParseConfig("runtime: {threads: 3, memory_bytes: 1000000}\n" +
                           Minimal("{global_tokens: 4096, seq_len: 1024}",
                                   ", shuffle_window_bytes: 65536"),
                       "");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->runtime.threads, 3);
  EXPECT_EQ(c->runtime.memory_bytes, 1000000);
  EXPECT_EQ(c->sources[0].shuffle_window_bytes, 65536);
  EXPECT_EQ(c->sources[1].shuffle_window_bytes, kDefaultShuffleWindowBytes);
  auto d = ParseConfig(Minimal(), "");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->runtime.threads, 0);       // the machine's cores
  EXPECT_EQ(d->runtime.memory_bytes, 0);  // derived from the job
  ExpectConfigError("runtime: {threads: 0}\n" + Minimal(), "runtime.threads");
  ExpectConfigError("runtime: {memory_bytes: -1}\n" + Minimal(), "runtime.memory_bytes");
  ExpectConfigError(Minimal("{global_tokens: 4096, seq_len: 1024}",
                            ", shuffle_window_bytes: -1"),
                    "sources[0].shuffle_window_bytes");
  // The byte bound is part of the order; 0 gives the rows-only order's fingerprint.
  Config rows_only = *d;
  for (auto& s : rows_only.sources) s.shuffle_window_bytes = 0;
  EXPECT_NE(rows_only.Fingerprint(), d->Fingerprint());
  Config other = *d;
  other.sources[0].shuffle_window_bytes = 1 << 20;
  EXPECT_NE(other.Fingerprint(), d->Fingerprint());
  Config threads = *d;
  threads.runtime.threads = 7;
  threads.runtime.memory_bytes = 5;
  EXPECT_EQ(threads.Fingerprint(), d->Fingerprint());  // speed and memory only
}


TEST(ConfigTest, LengthColumnIsCheckedAndLeavesTheFingerprint) {
  auto with = ParseConfig(Minimal("{global_tokens: 4096, seq_len: 1024}",
                                  ", length_column: n_tokens"),
                          "/base");
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  EXPECT_EQ(with->sources[0].length_column, "n_tokens");
  EXPECT_EQ(with->sources[1].length_column, "");
  // It cannot change the stream (a disagreeing length is an error), so a state saved
  // without it resumes with it.
  auto without = ParseConfig(Minimal(), "/base");
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(with->Fingerprint(), without->Fingerprint());
  const std::string batch = "{global_tokens: 4096, seq_len: 1024}";
  ExpectConfigError(Minimal(batch, ", length_column: ''"), "sources[0].length_column",
                    "empty");
  ExpectConfigError(Minimal(batch, ", length_column: [n]"), "sources[0].length_column",
                    "a string");
  ExpectConfigError(Minimal(batch, ", length_column: ids"), "sources[0].length_column",
                    "another column");
  // Only token sources: a text source's count is known only once it is tokenized.
  ExpectConfigError(
      "tokenizer: {model: m.model}\nbatch: {global_tokens: 4096, seq_len: 1024}\n"
      "sources:\n  - {name: a, path: a.parquet, text_column: t, length_column: n}\n",
      "sources[0].length_column", "tokens_column sources only");
  ExpectConfigError(
      "batch: {global_tokens: 4096, seq_len: 1024}\nsources:\n  - {name: a, path: "
      "a.parquet, transform: {python: 'm:f', columns: [t]}, length_column: n}\n",
      "sources[0].length_column", "tokens_column sources only");
}

TEST(ConfigTest, LengthCacheResolvesAgainstTheBaseAndLeavesTheFingerprint) {
  auto with = ParseConfig(Minimal() + "runtime: {length_cache: lens}\n", "/base");
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  for (const auto& s : with->sources) EXPECT_EQ(s.length_cache_dir, "/base/lens");
  auto without = ParseConfig(Minimal(), "/base");
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(without->sources[0].length_cache_dir, "");
  // A cache cannot change the stream: a state saved without it resumes with it.
  EXPECT_EQ(with->Fingerprint(), without->Fingerprint());
  ExpectConfigError(Minimal() + "runtime: {length_cache: ''}\n", "runtime.length_cache",
                    "empty");
  ExpectConfigError(Minimal() + "runtime: {length_cache: [a]}\n", "runtime.length_cache",
                    "a folder path");
}

}  // namespace
}  // namespace braid
