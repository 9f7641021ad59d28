// The public C++ API (braid/braid.h): JobConfig, Loader and DataPlane as a C++ user
// calls them, checked against the internal Engine and Config they front.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "braid/config/job_config_internal.h"
#include "braid/runtime/engine.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

void ExpectSameBatch(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.dp, b.dp);
  EXPECT_EQ(a.micro_batch, b.micro_batch);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape);
    EXPECT_EQ(*a.tensors[i].storage, *b.tensors[i].storage)
        << a.tensors[i].name << " of step " << a.step << " mb " << a.micro_batch;
  }
}

template <typename Stream>
std::vector<std::shared_ptr<const Batch>> Take(Stream* stream, int64_t n) {
  std::vector<std::shared_ptr<const Batch>> out;
  for (int64_t i = 0; i < n; ++i) {
    auto b = stream->Next();
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) break;
    out.push_back(*b);
  }
  return out;
}

std::unique_ptr<Loader> MakeLoader(const JobConfig& config, Loader::Options options) {
  auto loader = Loader::Make(config, std::move(options));
  EXPECT_TRUE(loader.ok()) << loader.status().ToString();
  return loader.ok() ? std::move(*loader) : nullptr;
}

// The demo dataset (three sources), seq_len 256, dp 2 x tp 2, 2 micro-batches per rank.
class PublicApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::ScopedTempDir("braid-public-api");
    auto demo =
        testing::MakeDemoDataset(dir_->path().string(), /*seed=*/5, /*seq_len=*/256,
                                 /*dp=*/2, /*micro_batches=*/2, /*scale=*/0.05);
    ASSERT_TRUE(demo.ok()) << demo.status().ToString();
    std::ifstream in(demo->config_path);
    std::stringstream text;
    text << in.rdbuf();
    yaml_ = new std::string(text.str());
    const std::string one_tp = "topology: {dp: 2, tp: 1, pp: 1, cp: 1}";
    ASSERT_NE(yaml_->find(one_tp), std::string::npos);
    yaml_->replace(yaml_->find(one_tp), one_tp.size(),
                   "topology: {dp: 2, tp: 2, pp: 1, cp: 1}");
  }
  static void TearDownTestSuite() {
    delete yaml_;
    delete dir_;
  }
  static JobConfig Job() {
    auto job = JobConfig::FromString(*yaml_, dir_->path().string());
    EXPECT_TRUE(job.ok()) << job.status().ToString();
    return *job;
  }

  static testing::ScopedTempDir* dir_;
  static std::string* yaml_;
};
testing::ScopedTempDir* PublicApiTest::dir_ = nullptr;
std::string* PublicApiTest::yaml_ = nullptr;

TEST_F(PublicApiTest, JobConfigAccessorsMatchTheConfig) {
  const JobConfig job = Job();
  const Config& c = JobConfigInternal::Get(job);
  EXPECT_EQ(job.seq_len(), 256);
  EXPECT_EQ(job.global_tokens(), 2 * 2 * 256);
  EXPECT_EQ(job.micro_batch_size(), 1);
  EXPECT_EQ(job.topology().dp, 2);
  EXPECT_EQ(job.topology().tp, 2);
  EXPECT_EQ(job.topology().world_size(), 4);
  EXPECT_EQ(job.num_buckets(), 2);
  EXPECT_EQ(job.micro_batches_per_rank(), 2);
  EXPECT_EQ(job.MicroBatchesPerRankAt(7), 2);
  EXPECT_EQ(job.SeqLenAt(7), 256);
  EXPECT_EQ(job.num_sources(), 3);
  EXPECT_EQ(job.source_names(), (std::vector<std::string>{"web", "code", "math"}));
  EXPECT_EQ(job.seed(), 5u);
  EXPECT_EQ(job.Fingerprint(), c.Fingerprint());
  const JobConfig copy = job;  // shares the parsed config
  EXPECT_EQ(&JobConfigInternal::Get(copy), &c);

  auto dp4 = job.WithDataParallel(4);
  ASSERT_TRUE(dp4.ok()) << dp4.status().ToString();
  EXPECT_EQ(dp4->topology().dp, 4);
  EXPECT_EQ(dp4->micro_batches_per_rank(), 1);
  EXPECT_EQ(job.topology().dp, 2);  // the original is unchanged
  EXPECT_EQ(dp4->Fingerprint(), job.Fingerprint());
  auto dp3 = job.WithDataParallel(3);
  EXPECT_TRUE(dp3.status().IsInvalid());
  EXPECT_THAT(dp3.status().message(), StartsWith("batch.global_tokens:"));
}

TEST_F(PublicApiTest, JobConfigErrorsNameTheFileAndTheKeyPath) {
  const std::string path = dir_->Sub("bad.yaml");
  std::string bad = *yaml_;
  bad.replace(bad.find("seq_len: 256"), 12, "seq_len: -1");
  std::ofstream(path) << bad;
  auto from_file = JobConfig::FromFile(path);
  ASSERT_FALSE(from_file.ok());
  EXPECT_TRUE(from_file.status().IsInvalid());
  EXPECT_THAT(from_file.status().message(), StartsWith(path + ": batch.seq_len:"));
  ASSERT_NE(GetErrorDetail(from_file.status()), nullptr);
  EXPECT_TRUE(IsErrorKind(from_file.status(), ErrorKind::kConfig));

  auto from_text = JobConfig::FromString(bad, dir_->path().string());
  EXPECT_THAT(from_text.status().message(), StartsWith("batch.seq_len:"));

  auto missing = JobConfig::FromFile(dir_->Sub("nope.yaml"));
  EXPECT_TRUE(missing.status().IsInvalid());
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.yaml"));
}

TEST_F(PublicApiTest, RankOptionsAreCheckedAgainstTheTopology) {
  const JobConfig job = Job();
  Loader::Options wrong_world;
  wrong_world.world_size = 8;
  auto st = Loader::Make(job, wrong_world).status();
  EXPECT_TRUE(st.IsInvalid());
  EXPECT_THAT(st.message(), StartsWith("world_size: 8 does not match"));

  Loader::Options outside;
  outside.rank = 4;
  st = Loader::Make(job, outside).status();
  EXPECT_THAT(st.message(), StartsWith("rank: 4 is outside the topology"));

  Loader::Options bad_coords;
  bad_coords.coordinates = RankCoordinates{/*dp=*/0, /*tp=*/2, /*pp=*/0, /*cp=*/0};
  st = Loader::Make(job, bad_coords).status();
  EXPECT_THAT(st.message(), StartsWith("rank: coordinate tp 2 is outside"));

  Loader::Options bad_state;
  bad_state.state_json = "{\"not\": \"a state\"}";
  st = Loader::Make(job, bad_state).status();
  EXPECT_TRUE(st.IsInvalid());
  EXPECT_TRUE(IsErrorKind(st, ErrorKind::kConfig));

  std::string ray = *yaml_;
  ray.replace(ray.find("runtime: {kind: local}"), 22, "runtime: {kind: ray}");
  auto ray_job = JobConfig::FromString(ray, dir_->path().string());
  ASSERT_TRUE(ray_job.ok()) << ray_job.status().ToString();
  st = Loader::Make(*ray_job, {}).status();
  EXPECT_THAT(st.message(), StartsWith("runtime.kind:"));
}

// Rank 2 is (dp 1, tp 0) in Megatron's order: bucket 1, as an Engine of that bucket and
// view builds it; its TP peer rank 3 receives the same micro-batches; coordinates name
// the same rank.
TEST_F(PublicApiTest, RanksReceiveTheirBucketsViewAsTheEngineBuildsIt) {
  const JobConfig job = Job();
  Loader::Options options;
  options.rank = 2;
  options.world_size = 4;
  auto loader = MakeLoader(job, options);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->rank(), 2);
  EXPECT_EQ(loader->bucket(), 1);
  EXPECT_EQ(loader->coordinates().dp, 1);
  EXPECT_EQ(loader->coordinates().tp, 0);
  EXPECT_EQ(loader->MicroBatchesAt(0), 2);
  const auto got = Take(loader.get(), 6);
  ASSERT_EQ(got.size(), 6u);

  Engine::Options engine_options;
  engine_options.buckets = {1};
  engine_options.view = RankCoords{/*dp=*/1, /*tp=*/0, /*pp=*/0, /*cp=*/0};
  auto engine = Engine::Make(JobConfigInternal::Get(job), engine_options);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const auto want = Take(engine->get(), 6);
  ASSERT_EQ(want.size(), 6u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i]->dp, 1);
    EXPECT_EQ(got[i]->step, int64_t(i) / 2);
    EXPECT_EQ(got[i]->micro_batch, int64_t(i) % 2);
    ExpectSameBatch(*got[i], *want[i]);
  }

  Loader::Options peer;
  peer.coordinates = RankCoordinates{/*dp=*/1, /*tp=*/1, /*pp=*/0, /*cp=*/0};
  auto tp_peer = MakeLoader(job, peer);
  ASSERT_NE(tp_peer, nullptr);
  EXPECT_EQ(tp_peer->rank(), 3);
  EXPECT_EQ(tp_peer->bucket(), 1);
  const auto copies = Take(tp_peer.get(), 6);
  ASSERT_EQ(copies.size(), 6u);
  for (size_t i = 0; i < copies.size(); ++i) ExpectSameBatch(*copies[i], *got[i]);
}

TEST_F(PublicApiTest, AStateContinuesTheStreamExactly) {
  const JobConfig job = Job();
  auto loader = MakeLoader(job, {});
  ASSERT_NE(loader, nullptr);
  const std::string start = loader->StateJson();
  const auto head = Take(loader.get(), 3);  // ends inside step 1
  const std::string state = loader->StateJson();
  EXPECT_NE(state, start);
  const auto tail = Take(loader.get(), 5);
  ASSERT_EQ(tail.size(), 5u);

  Loader::Options resume;
  resume.state_json = state;
  auto resumed = MakeLoader(job, resume);
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(resumed->StateJson(), state);
  const auto again = Take(resumed.get(), 5);
  ASSERT_EQ(again.size(), 5u);
  for (size_t i = 0; i < tail.size(); ++i) ExpectSameBatch(*tail[i], *again[i]);
}

TEST_F(PublicApiTest, StopCancelsNextAndKeepsTheState) {
  auto loader = MakeLoader(Job(), {});
  ASSERT_NE(loader, nullptr);
  const auto head = Take(loader.get(), 2);
  ASSERT_EQ(head.size(), 2u);
  const std::string state = loader->StateJson();
  loader->Stop();
  loader->Stop();  // idempotent
  auto next = loader->Next();
  EXPECT_TRUE(next.status().IsCancelled()) << next.status().ToString();
  EXPECT_EQ(loader->StateJson(), state);
  // A batch outlives its loader.
  loader.reset();
  EXPECT_GT(head[1]->tensors.at(0).num_elements(), 0);
}

TEST_F(PublicApiTest, DataPlaneCompilesToAJobConfig) {
  const JobConfig job = Job();
  auto planned = DataPlane(job).Mix("web", 0.2).Mix("math", 0.0).Balance("greedy").Plan();
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_EQ(planned->Fingerprint(), job.Fingerprint());  // weights are not in it
  const Config& c = JobConfigInternal::Get(*planned);
  EXPECT_EQ(c.sources[0].weight.At(0), 0.2);
  EXPECT_EQ(c.sources[2].weight.At(0), 0.0);
  EXPECT_EQ(c.balance.algorithm, BalanceAlgorithm::kGreedy);

  DataPlane plane(job);
  plane.Mix("nope", 1.0);
  DataPlane copy = plane;  // a deep copy keeps the error
  copy.Balance("none");
  EXPECT_THAT(copy.Plan().status().message(), StartsWith("mix.nope: unknown source"));
  EXPECT_THAT(plane.status().message(), StartsWith("mix.nope:"));
}

}  // namespace
}  // namespace braid
