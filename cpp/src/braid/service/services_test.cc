// The roles as services, composed as the Ray runtime composes them (planner service ->
// wire message -> decoded bucket -> payloads fetched by key -> BuildMicroBatch), give the
// embedded runtime's micro-batches bit for bit; and the messages fail cleanly when bad.
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "braid/construct/constructor.h"
#include "braid/exec/read_pool.h"
#include "braid/plan/planner.h"
#include "braid/service/hosting.h"
#include "braid/runtime/engine.h"
#include "braid/service/source_service.h"
#include "braid/service/planner_service.h"
#include "braid/service/wire.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/sentencepiece_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::HasSubstr;

// The planner service as `braid plan` runs it: metadata only, on the asking thread.
Result<std::unique_ptr<PlannerService>> MakePlanner(const Config& config,
                                                    const PlannerState& start) {
  PlannerService::Options options;
  options.state.keep_steps = 0;
  options.replay = false;
  return PlannerService::Make(config, start, PlannerService::MetadataOnly(config),
                              std::move(options));
}

// A source's payloads by key, its row-group cache bounded by `cache_bytes`.
Result<std::unique_ptr<SourceService>> MakeServing(const Config& config, int32_t source,
                                                   int64_t cache_bytes) {
  SourceService::Options options;
  options.serve = true;
  options.cache_bytes = cache_bytes;
  return SourceService::Make(config, source, std::move(options));
}

class ServicesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::ScopedTempDir("braid-services");
    // The demo: three sources, long-tail lengths (some longer than seq_len, so pieces
    // are cut across sequences and steps), several files and row groups each.
    auto demo = testing::MakeDemoDataset(dir_->path().string(), /*seed=*/5,
                                         /*seq_len=*/512, /*dp=*/4,
                                         /*micro_batches=*/2, /*scale=*/0.05);
    ASSERT_TRUE(demo.ok()) << demo.status().ToString();
    auto config = LoadConfigFile(demo->config_path);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = new Config(*config);
  }
  static void TearDownTestSuite() {
    delete config_;
    delete dir_;
  }

  // Every micro-batch of `steps` steps through the services, in (step, bucket,
  // micro-batch) order, the payload cache bounded by `cache_bytes`.
  // What the replies held (ThroughServices).
  struct ReplyCounts {
    int64_t images = 0;          // in a piece
    int64_t checked_images = 0;  // of a piece's row, outside the piece (on_error: skip)
    int64_t image_bytes = 0;
    std::vector<std::string> blanked;  // AttachPieces' messages
    int64_t embedded_pixel_bytes = 0;  // of the embedded runtime's pixel_values
  };

  // `steps` steps through the services equal the embedded runtime's; what the replies
  // held.
  static ReplyCounts ExpectServicesAsEmbedded(const Config& config, int64_t steps) {
    const auto embedded = Embedded(config, steps);
    EXPECT_FALSE(embedded.empty());
    ReplyCounts counts;
    ExpectSame(ThroughServices(config, steps, int64_t{1} << 20,
                               Planner::InitialState(config), &counts),
               embedded);
    for (const Batch& b : embedded) {
      if (const Tensor* t = b.Find("pixel_values")) {
        counts.embedded_pixel_bytes += int64_t(t->storage->size());
      }
    }
    return counts;
  }

  static std::vector<Batch> ThroughServices(const Config& config, int64_t steps,
                                            int64_t cache_bytes, const PlannerState& start,
                                            ReplyCounts* counts = nullptr) {
    std::vector<Batch> out;
    auto planner = MakePlanner(config, start);
    EXPECT_TRUE(planner.ok()) << planner.status().ToString();
    if (!planner.ok()) return out;
    std::vector<std::unique_ptr<SourceService>> payloads;
    for (size_t i = 0; i < config.sources.size(); ++i) {
      auto p = MakeServing(config, int32_t(i), cache_bytes);
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      if (!p.ok()) return out;
      payloads.push_back(std::move(*p));
    }
    const int32_t n = static_cast<int32_t>(config.sources.size());
    for (int64_t s = 0; s < steps; ++s) {
      auto planned = (*planner)->Next();
      EXPECT_TRUE(planned.ok()) << planned.status().ToString();
      if (!planned.ok()) return out;
      const std::vector<int64_t> message = EncodeStepPlan(*(*planned)->plan);
      for (int64_t b = 0; b < config.topology.buckets(); ++b) {
        // As a constructor receives it: the slice of its node's buckets.
        auto slice = SliceStepPlan(message.data(), message.size(), {b});
        EXPECT_TRUE(slice.ok()) << slice.status().ToString();
        if (!slice.ok()) return out;
        auto part = DecodeBucket(slice->data(), slice->size(), b);
        EXPECT_TRUE(part.ok()) << part.status().ToString();
        if (!part.ok()) return out;
        const auto requests = PieceRequests(*part, b, n);
        for (int32_t i = 0; i < n; ++i) {
          const auto& r = requests[size_t(i)];
          if (r.empty()) continue;
          auto reply = payloads[size_t(i)]->Fetch(
              r.data(), static_cast<int64_t>(r.size()) / kRequestFields);
          EXPECT_TRUE(reply.ok()) << reply.status().ToString();
          if (!reply.ok()) return out;
          for (size_t f = 0; counts != nullptr && f < reply->images.size();
               f += kImageFields) {
            ++(reply->images[f + 1] < 0 ? counts->checked_images : counts->images);
          }
          if (counts != nullptr) counts->image_bytes += int64_t(reply->image_bytes.size());
          const Status st =
              AttachPieces(&*part, b, i, config.sources[size_t(i)],
                           std::make_shared<PieceReply>(std::move(*reply)),
                           counts != nullptr ? &counts->blanked : nullptr);
          EXPECT_TRUE(st.ok()) << st.ToString();
        }
        for (size_t mb = 0; mb < part->buckets[size_t(b)].micro_batches.size(); ++mb) {
          auto batch = BuildMicroBatch(*part, b, int64_t(mb));
          EXPECT_TRUE(batch.ok()) << batch.status().ToString();
          if (!batch.ok()) return out;
          out.push_back(std::move(*batch));
        }
      }
    }
    return out;
  }

  static std::vector<Batch> Embedded(const Config& config, int64_t steps,
                                     const std::string& state = "") {
    Engine::Options options;
    options.state_json = state;
    auto engine = Engine::Make(config, std::move(options));
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    std::vector<Batch> out;
    if (!engine.ok()) return out;
    const int64_t per_step =
        config.MicroBatchesPerRankAt(0) * config.topology.buckets();
    for (int64_t i = 0; i < steps * per_step; ++i) {
      auto b = (*engine)->Next();
      EXPECT_TRUE(b.ok()) << b.status().ToString();
      if (!b.ok()) break;
      out.push_back(**b);
    }
    return out;
  }

  static void ExpectSame(const std::vector<Batch>& a, const std::vector<Batch>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_EQ(a[k].step, b[k].step);
      EXPECT_EQ(a[k].dp, b[k].dp);
      EXPECT_EQ(a[k].micro_batch, b[k].micro_batch);
      ASSERT_EQ(a[k].tensors.size(), b[k].tensors.size());
      for (size_t t = 0; t < a[k].tensors.size(); ++t) {
        EXPECT_EQ(a[k].tensors[t].name, b[k].tensors[t].name);
        EXPECT_EQ(a[k].tensors[t].shape, b[k].tensors[t].shape);
        EXPECT_EQ(*a[k].tensors[t].storage, *b[k].tensors[t].storage)
            << a[k].tensors[t].name << " of step " << a[k].step << " bucket "
            << a[k].dp << " micro-batch " << a[k].micro_batch;
      }
    }
  }

  static testing::ScopedTempDir* dir_;
  static Config* config_;
};

testing::ScopedTempDir* ServicesTest::dir_ = nullptr;
Config* ServicesTest::config_ = nullptr;

TEST_F(ServicesTest, ServicesGiveTheEmbeddedRuntimesBatchesBitForBit) {
  const int64_t steps = 6;
  const auto embedded = Embedded(*config_, steps);
  ASSERT_FALSE(embedded.empty());
  // A cache of one byte keeps only the newest row group: every other request reads again.
  for (int64_t cache : {int64_t{1}, int64_t{64} << 20}) {
    SCOPED_TRACE("cache bytes " + std::to_string(cache));
    ExpectSame(ThroughServices(*config_, steps, cache, Planner::InitialState(*config_)),
               embedded);
  }
}

TEST_F(ServicesTest, ServicesResumeFromAStepBoundaryAsTheEngineDoes) {
  auto planner = MakePlanner(*config_, Planner::InitialState(*config_));
  ASSERT_TRUE(planner.ok());
  PlannerState state;
  for (int i = 0; i < 3; ++i) {
    auto planned = (*planner)->Next();
    ASSERT_TRUE(planned.ok());
    state = (*planned)->state_after;
  }
  ExpectSame(ThroughServices(*config_, 3, int64_t{8} << 20, state),
             Embedded(*config_, 3, PlannerStateToJson(state, *config_)));
}

TEST_F(ServicesTest, EncodedPlansRoundTripEveryBucket) {
  auto planner = MakePlanner(*config_, Planner::InitialState(*config_));
  ASSERT_TRUE(planner.ok());
  auto planned = (*planner)->Next();
  ASSERT_TRUE(planned.ok());
  const StepPlan* plan = (*planned)->plan.get();
  const auto message = EncodeStepPlan(*plan);
  auto header = EncodedStepAndBuckets(message.data(), message.size());
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(header->first, plan->step);
  EXPECT_EQ(header->second, int64_t(plan->buckets.size()));
  for (size_t b = 0; b < plan->buckets.size(); ++b) {
    auto part = DecodeBucket(message.data(), message.size(), int64_t(b));
    ASSERT_TRUE(part.ok()) << part.status().ToString();
    const BucketPlan& want = plan->buckets[b];
    const BucketPlan& got = part->buckets[b];
    ASSERT_EQ(got.micro_batches.size(), want.micro_batches.size());
    for (size_t m = 0; m < want.micro_batches.size(); ++m) {
      ASSERT_EQ(got.micro_batches[m].sequences.size(),
                want.micro_batches[m].sequences.size());
      for (size_t q = 0; q < want.micro_batches[m].sequences.size(); ++q) {
        const auto& wd = want.micro_batches[m].sequences[q].docs;
        const auto& gd = got.micro_batches[m].sequences[q].docs;
        ASSERT_EQ(gd.size(), wd.size());
        for (size_t k = 0; k < wd.size(); ++k) {
          EXPECT_EQ(gd[k].source, wd[k].source);
          EXPECT_EQ(gd[k].file, wd[k].file);
          EXPECT_EQ(gd[k].row, wd[k].row);
          EXPECT_EQ(gd[k].epoch, wd[k].epoch);
          EXPECT_EQ(gd[k].start, wd[k].start);
          EXPECT_EQ(gd[k].len, wd[k].len);
          EXPECT_EQ(gd[k].doc_tokens, wd[k].doc_tokens);
        }
      }
    }
  }
}

TEST_F(ServicesTest, APlanSliceHoldsItsBucketsExactlyAndRefusesTheOthers) {
  Config config = *config_;
  ASSERT_TRUE(SetDataParallel(&config, 4).ok());
  auto planner = MakePlanner(config, Planner::InitialState(config));
  ASSERT_TRUE(planner.ok()) << planner.status().ToString();
  auto planned = (*planner)->Next();
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  const auto message = EncodeStepPlan(*(*planned)->plan);
  auto slice = SliceStepPlan(message.data(), message.size(), {3, 1, 3});
  ASSERT_TRUE(slice.ok()) << slice.status().ToString();
  EXPECT_LT(slice->size(), message.size());
  // A slice of the slice, as a constructor might keep one bucket of it.
  auto one = SliceStepPlan(slice->data(), slice->size(), {3});
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  for (int64_t b = 0; b < 4; ++b) {
    auto whole = DecodeBucket(message.data(), message.size(), b);
    ASSERT_TRUE(whole.ok());
    auto sliced = DecodeBucket(slice->data(), slice->size(), b);
    if (b == 1 || b == 3) {
      ASSERT_TRUE(sliced.ok()) << sliced.status().ToString();
      EXPECT_EQ(EncodeStepPlan(*sliced), EncodeStepPlan(*whole)) << "bucket " << b;
    } else {
      ASSERT_FALSE(sliced.ok());
      EXPECT_THAT(sliced.status().message(), HasSubstr("not in this slice"));
    }
  }
  auto three = DecodeBucket(one->data(), one->size(), 3);
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  EXPECT_EQ(EncodeStepPlan(*three),
            EncodeStepPlan(*DecodeBucket(message.data(), message.size(), 3)));
  EXPECT_FALSE(DecodeBucket(one->data(), one->size(), 1).ok());
}

TEST_F(ServicesTest, MalformedMessagesAndRepliesFailWithADataError) {
  auto planner = MakePlanner(*config_, Planner::InitialState(*config_));
  ASSERT_TRUE(planner.ok());
  auto planned = (*planner)->Next();
  ASSERT_TRUE(planned.ok());
  const StepPlan* plan = (*planned)->plan.get();
  auto message = EncodeStepPlan(*plan);
  // Cut short, every length from 0 up: an error, never a crash or a partial plan.
  for (size_t cut = 0; cut < message.size(); cut += 7) {
    auto part = DecodeBucket(message.data(), cut, int64_t(plan->buckets.size()) - 1);
    EXPECT_FALSE(part.ok()) << "cut at " << cut;
  }
  auto no_bucket = DecodeBucket(message.data(), message.size(), 1000);
  ASSERT_FALSE(no_bucket.ok());
  EXPECT_THAT(no_bucket.status().message(), HasSubstr("no bucket 1000"));
  EXPECT_FALSE(SliceStepPlan(message.data(), message.size(), {1000}).ok());
  for (size_t cut = 0; cut < message.size(); cut += 7) {
    EXPECT_FALSE(SliceStepPlan(message.data(), cut, {0}).ok()) << "cut at " << cut;
  }

  auto part = DecodeBucket(message.data(), message.size(), 0);
  ASSERT_TRUE(part.ok());
  // A reply with one token too few for the first piece is refused, naming the source.
  const auto requests = PieceRequests(*part, 0, int32_t(config_->sources.size()));
  for (int32_t i = 0; i < int32_t(requests.size()); ++i) {
    if (requests[size_t(i)].empty()) continue;
    auto service = MakeServing(*config_, i, int64_t{8} << 20);
    ASSERT_TRUE(service.ok());
    auto reply = (*service)->Fetch(requests[size_t(i)].data(),
                                   int64_t(requests[size_t(i)].size()) / kRequestFields);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    // Images the reply does not tie to a requested piece, or whose placeholders, bytes
    // or path lie outside what the reply holds, are refused too.
    for (const std::vector<int64_t>& images :
         {std::vector<int64_t>{999, 0, 1, 1, 0, 0, 0, 1},
          std::vector<int64_t>{0, 0, 1, 1, 12, 0, 0, 1},
          std::vector<int64_t>{0, 1 << 20, 1, 1, 0, 0, 0, 1},
          std::vector<int64_t>{0, 0, 1, 1, 0, 5, 0, 1},
          std::vector<int64_t>{0, 0, 1, 1, 0, 0, 1, 1}, std::vector<int64_t>{0, 0, 1}}) {
      auto bad = std::make_shared<PieceReply>(*reply);
      bad->images = images;
      bad->paths = {'a', 0};
      const Status st = AttachPieces(&*part, 0, i, config_->sources[size_t(i)], bad);
      EXPECT_FALSE(st.ok()) << images[0] << " " << images[1];
    }
    reply->tokens.pop_back();
    for (size_t k = 1; k < reply->offsets.size(); ++k) {
      reply->offsets[k] = std::max<int64_t>(0, reply->offsets[k] - 1);
    }
    const Status st = AttachPieces(&*part, 0, i, config_->sources[size_t(i)],
                                   std::make_shared<PieceReply>(*reply));
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(st.message(), HasSubstr("sources[" + std::to_string(i) + "]"));
    break;
  }
}

TEST_F(ServicesTest, AFetchOutsideTheRowNamesTheFileAndRow) {
  auto service = MakeServing(*config_, 0, int64_t{8} << 20);
  ASSERT_TRUE(service.ok());
  // Row 0 of file 0 with a document longer than any row: the file "changed".
  const int64_t past[kRequestFields] = {0, 0, 0, 10, int64_t{1} << 40};
  auto r = (*service)->Fetch(past, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("did the file change"));
  EXPECT_THAT(r.status().message(), HasSubstr("row 0"));
  const int64_t no_file[kRequestFields] = {99, 0, 0, 1, 1};
  r = (*service)->Fetch(no_file, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("no file 99"));
  const int64_t no_row[kRequestFields] = {0, int64_t{1} << 40, 0, 1, 1};
  r = (*service)->Fetch(no_row, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("no row"));
}

// A text job in `dir`: a tiny tokenizer and one Parquet file of 20 rows of random
// sentences of at least `min_words` words (seed `seed`), in row groups of
// `row_group_rows`, tokenized by the source.
Config TextServingJob(const testing::ScopedTempDir& dir, uint64_t seed, int min_words,
                      int64_t row_group_rows) {
  EXPECT_TRUE(testing::TrainTinySentencePiece(testing::RandomSentences(300, 5),
                                              dir.Sub("tok"), 100)
                  .ok());
  std::vector<std::optional<std::string>> texts;
  for (const auto& t : testing::RandomSentences(20, seed, min_words)) texts.push_back(t);
  EXPECT_TRUE(
      testing::WriteTextFile(dir.Sub("text.parquet"), "text", texts, row_group_rows).ok());
  Config text;
  text.seed = 1;
  text.batch.seq_len = 64;
  text.batch.global_tokens = 128;
  text.tokenizer.model = dir.Sub("tok.model");
  SourceConfig source;
  source.name = "text";
  source.path = dir.Sub("text.parquet");
  source.text_column = "text";
  text.sources.push_back(source);
  EXPECT_TRUE(ValidateConfig(text).ok());
  return text;
}

// Fetch's figures, and the payloads it keeps: a text row whose piece does not end its
// document is tokenized once for all its pieces (kept in the cache until the last
// piece), a unit is read once, the tokens and the reply's bytes are counted. A token
// column's rows are not kept (their payloads are views of the unit's ids).
TEST_F(ServicesTest, FetchTokenizesATextRowOnceForAllItsPiecesAndCountsWhatItSends) {
  testing::ScopedTempDir dir("braid-serve-text");
  const Config text = TextServingJob(dir, 6, /*min_words=*/4, /*row_group_rows=*/64);
  // Rows 0 and 1 as 2-token documents in two pieces: [0, 1) (more follows), then [1, 2).
  auto fetch_twice = [](SourceService* service) {
    std::vector<ServeProfile> after;
    for (int64_t start = 0; start < 2; ++start) {
      const int64_t q[2 * kRequestFields] = {0, 0, start, 1, 2, 0, 1, start, 1, 2};
      auto r = service->Fetch(q, 2);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      after.push_back(service->serve_profile());
    }
    return after;
  };
  auto service = MakeServing(text, 0, int64_t{8} << 20);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  const std::vector<ServeProfile> p = fetch_twice(service->get());
  ASSERT_EQ(p.size(), 2u);
  for (int64_t call = 1; call <= 2; ++call) {
    const ServeProfile& q = p[size_t(call - 1)];
    EXPECT_EQ(q.calls, call);
    EXPECT_EQ(q.pieces, 2 * call);
    EXPECT_EQ(q.rows_transformed, 2);  // the second pieces' rows were kept
    EXPECT_EQ(q.tokens_sent, call == 1 ? 4 : 6);  // a piece and its label, then 1 each
    EXPECT_EQ(q.bytes_sent, q.tokens_sent * int64_t(sizeof(int32_t)) +
                                call * int64_t(3 * sizeof(int64_t)));
    EXPECT_EQ(q.units_read, 1);  // the second call finds the unit cached
    EXPECT_GT(q.bytes_read, 0);
    EXPECT_GT(q.cpu_ns, 0);
    EXPECT_GE(q.peak_cached_bytes, q.cached_bytes);
  }
  EXPECT_GT(p[0].cached_bytes, p[0].bytes_read);  // the unit and the two kept rows
  EXPECT_EQ(p[1].cached_bytes, p[1].bytes_read);  // the last pieces let them go
  EXPECT_GT(p[1].peak_cached_bytes, p[1].cached_bytes);

  // A token source: every piece's row read from the unit again, nothing kept. (Rows of
  // file 0 holding at least 2 tokens: a probe service finds them.)
  std::vector<int64_t> rows;
  auto probe = MakeServing(*config_, 0, int64_t{8} << 20);
  ASSERT_TRUE(probe.ok());
  for (int64_t row = 0; row < 50 && rows.size() < 2; ++row) {
    const int64_t q[kRequestFields] = {0, row, 0, 1, 2};
    if ((*probe)->Fetch(q, 1).ok()) rows.push_back(row);
  }
  ASSERT_EQ(rows.size(), 2u);
  auto tokens = MakeServing(*config_, 0, int64_t{8} << 20);
  ASSERT_TRUE(tokens.ok());
  const int64_t q[2 * kRequestFields] = {0, rows[0], 0, 1, 2, 0, rows[1], 0, 1, 2};
  ASSERT_TRUE((*tokens)->Fetch(q, 2).ok());
  const ServeProfile t = (*tokens)->serve_profile();
  EXPECT_EQ(t.rows_transformed, 2);
  EXPECT_EQ(t.cached_bytes, t.bytes_read);
}

// A Fetch's rows that need tokenizing are tokenized side by side on the service's pool:
// the same reply as one at a time, each row tokenized once, and a bad request still the
// error of the first bad piece in request order.
TEST_F(ServicesTest, AFetchsRowsAreTokenizedSideBySideWithTheSameReply) {
  testing::ScopedTempDir dir("braid-serve-parallel");
  const Config text = TextServingJob(dir, 9, /*min_words=*/4, /*row_group_rows=*/8);
  auto serial = MakeServing(text, 0, int64_t{8} << 20);
  SourceService::Options options;
  options.serve = true;
  options.cache_bytes = int64_t{8} << 20;
  options.pool = std::make_shared<ReadPool>(4);
  auto pooled = SourceService::Make(text, 0, std::move(options));
  ASSERT_TRUE(serial.ok() && pooled.ok());
  // Every row's first piece of a 2-token document (kept for the second), then every
  // row's second piece, in one Fetch; the rows span the file's three row groups.
  std::vector<int64_t> q;
  for (int64_t start = 0; start < 2; ++start) {
    for (int64_t row = 0; row < 20; ++row) q.insert(q.end(), {0, row, start, 1, 2});
  }
  const int64_t n = int64_t(q.size()) / kRequestFields;
  auto a = (*serial)->Fetch(q.data(), n);
  auto b = (*pooled)->Fetch(q.data(), n);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->offsets, b->offsets);
  EXPECT_EQ(a->loss_mask, b->loss_mask);
  EXPECT_EQ((*serial)->serve_profile().rows_transformed, 20);
  EXPECT_EQ((*pooled)->serve_profile().rows_transformed, 20);
  EXPECT_EQ((*pooled)->serve_profile().units_read, 3);
  // A piece past its row's tokens in the middle: the same error from both.
  std::vector<int64_t> bad(q.begin(), q.begin() + 6 * kRequestFields);
  bad[3 * kRequestFields + 4] = 100000;  // doc_tokens of request 3
  auto c = (*serial)->Fetch(bad.data(), 6);
  auto d = (*pooled)->Fetch(bad.data(), 6);
  ASSERT_FALSE(c.ok());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(c.status().message(), d.status().message());
  EXPECT_THAT(d.status().message(), HasSubstr("row 3"));
}

// The first node's host of a Ray job: its planner's streams read the payloads, so the
// pieces other nodes fetch are answered from the plans it holds, byte for byte what a
// read of the file gives, with no read and no transform; a row no held plan has is read.
TEST_F(ServicesTest, FetchesAreAnsweredFromTheCoHostedPlannersPayloadsBitForBit) {
  testing::ScopedTempDir dir("braid-serve-plans");
  const Config text = TextServingJob(dir, 8, /*min_words=*/20, /*row_group_rows=*/8);
  PlannerService::OpenSources with_payloads = [&text](const PlannerState& at) {
    return SourceSet::Open(text, at, SourceService::Stream::kPayloads, /*serve=*/false);
  };
  // Planned on the asking thread: the held plans are the steps asked for, no more.
  PlannerService::Options options = CoHostedPlannerOptions(text);
  options.background = false;
  auto planner = PlannerService::Make(text, Planner::InitialState(text), with_payloads,
                                      std::move(options));
  ASSERT_TRUE(planner.ok()) << planner.status().ToString();
  auto plain = MakeServing(text, 0, int64_t{8} << 20);
  auto from_plans = MakeServing(text, 0, int64_t{8} << 20);
  ASSERT_TRUE(plain.ok() && from_plans.ok());
  PlannerService* p = planner->get();
  (*from_plans)->ServeFromPlans([p](int32_t source, int32_t file, int64_t row) {
    return p->KeptPayload(source, file, row);
  });
  std::set<std::pair<int32_t, int64_t>> planned_rows;
  int64_t pieces = 0;
  for (int64_t step = 0; step < 3; ++step) {
    auto planned = p->Plan(step, 30);
    ASSERT_TRUE(planned.ok()) << planned.status().ToString();
    ASSERT_NE((*planned)->plan, nullptr);
    std::vector<int64_t> q;
    for (const BucketPlan& bucket : (*planned)->plan->buckets) {
      for (const MicroBatch& mb : bucket.micro_batches) {
        for (const Sequence& seq : mb.sequences) {
          for (const DocPiece& d : seq.docs) {
            q.insert(q.end(), {d.file, d.row, d.start, d.len, d.doc_tokens});
            planned_rows.emplace(d.file, d.row);
          }
        }
      }
    }
    const int64_t n = int64_t(q.size()) / kRequestFields;
    pieces += n;
    auto a = (*plain)->Fetch(q.data(), n);
    auto b = (*from_plans)->Fetch(q.data(), n);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
    EXPECT_EQ(a->tokens, b->tokens) << "step " << step;
    EXPECT_EQ(a->offsets, b->offsets);
    EXPECT_EQ(a->loss_mask, b->loss_mask);
  }
  ASSERT_GT(pieces, 0);
  const ServeProfile read = (*plain)->serve_profile();
  const ServeProfile kept = (*from_plans)->serve_profile();
  EXPECT_GT(read.rows_transformed, 0);
  EXPECT_GT(read.units_read, 0);
  EXPECT_EQ(read.pieces_from_plans, 0);
  EXPECT_EQ(kept.rows_transformed, 0);
  EXPECT_EQ(kept.units_read, 0);
  EXPECT_EQ(kept.pieces_from_plans, pieces);
  EXPECT_EQ(kept.tokens_sent, read.tokens_sent);
  // A row in no held plan is read and tokenized as without them.
  int64_t unplanned = 0;
  while (planned_rows.count({0, unplanned}) != 0) ++unplanned;
  ASSERT_LT(unplanned, 20);
  EXPECT_FALSE(p->KeptPayload(0, 0, unplanned));
  const int64_t q[kRequestFields] = {0, unplanned, 0, 1, 1};
  auto a = (*plain)->Fetch(q, 1);
  auto b = (*from_plans)->Fetch(q, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ((*from_plans)->serve_profile().rows_transformed, 1);
  EXPECT_EQ((*from_plans)->serve_profile().units_read, 1);
}

// A kept row is an entry of the cache of its own: when its unit leaves the cache, the
// row's later pieces still come from the kept payload, with no read and no transform.
TEST_F(ServicesTest, AKeptRowOutlivesItsUnitInTheCache) {
  testing::ScopedTempDir dir("braid-serve-kept");
  // Two units: rows 0-9 and 10-19.
  const Config text = TextServingJob(dir, 7, /*min_words=*/30, /*row_group_rows=*/10);
  // The units' bytes, from a probe.
  int64_t unit_bytes[2] = {0, 0};
  auto probe = MakeServing(text, 0, int64_t{8} << 20);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  for (int u = 0; u < 2; ++u) {
    const int64_t q[kRequestFields] = {0, 10 * u, 0, 2, 2};
    ASSERT_TRUE((*probe)->Fetch(q, 1).ok());
    unit_bytes[u] = (*probe)->serve_profile().bytes_read - (u ? unit_bytes[0] : 0);
  }
  // Room for one unit and a kept row, not for both units.
  const int64_t bound = std::max(unit_bytes[0], unit_bytes[1]) + 600;
  ASSERT_LT(bound, unit_bytes[0] + unit_bytes[1]);
  auto service = MakeServing(text, 0, bound);
  ASSERT_TRUE(service.ok());
  const int64_t first[kRequestFields] = {0, 0, 0, 1, 2};   // row 0's first piece
  const int64_t other[kRequestFields] = {0, 10, 0, 2, 2};  // all of row 10
  const int64_t last[kRequestFields] = {0, 0, 1, 1, 2};    // row 0's last piece
  ASSERT_TRUE((*service)->Fetch(first, 1).ok());
  ASSERT_TRUE((*service)->Fetch(other, 1).ok());  // its unit pushes row 0's out
  auto r = (*service)->Fetch(last, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ServeProfile p = (*service)->serve_profile();
  EXPECT_EQ(p.units_read, 2);        // row 0's unit is not read again
  EXPECT_EQ(p.rows_transformed, 2);  // nor row 0 tokenized again
  EXPECT_LE(p.peak_cached_bytes, bound);
  // The same tokens as a service that never let anything go.
  auto roomy = MakeServing(text, 0, int64_t{8} << 20);
  ASSERT_TRUE(roomy.ok());
  ASSERT_TRUE((*roomy)->Fetch(first, 1).ok());
  auto expected = (*roomy)->Fetch(last, 1);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(r->tokens, expected->tokens);
}

// An image-caption job in `dir` (a tiny tokenizer, 24 rows, every third with two PNG
// images, row `cut_row` undecodable), at dp = 2 with pieces cut across sequences.
Config CaptionJob(const testing::ScopedTempDir& dir, int cut_row, OnError on_error) {
  EXPECT_TRUE(testing::TrainTinySentencePiece(testing::RandomSentences(300, 5),
                                              dir.Sub("tok"), 100)
                  .ok());
  EXPECT_TRUE(
      testing::WriteCaptionFile(dir.Sub("captions.parquet"), cut_row, /*two_images=*/true)
          .ok());
  Config c;
  c.seed = 4;
  c.batch.seq_len = 64;
  c.batch.global_tokens = 256;
  c.topology.dp = 2;
  c.tokenizer.model = dir.Sub("tok.model");
  c.sources.push_back(testing::CaptionSource(dir.Sub("captions.parquet"), on_error,
                                             /*workers=*/2, /*window_rows=*/8));
  EXPECT_TRUE(ValidateConfig(c).ok());
  return c;
}

TEST_F(ServicesTest, ImagesCrossEncodedAndDecodeToTheEmbeddedBatchesBitForBit) {
  testing::ScopedTempDir dir("braid-services-images");
  const Config config = CaptionJob(dir, /*cut_row=*/-1, OnError::kFail);
  // Several epochs of the 24 rows.
  const ReplyCounts counts = ExpectServicesAsEmbedded(config, /*steps=*/8);
  EXPECT_GT(counts.images, 0);
  EXPECT_EQ(counts.checked_images, 0);  // on_error: fail sends a piece's own images only
  // Encoded, not patches: the PNG bytes are fewer than the float32 pixels they decode to.
  EXPECT_GT(counts.embedded_pixel_bytes, 0);
  EXPECT_LT(counts.image_bytes, counts.embedded_pixel_bytes);
}

TEST_F(ServicesTest, UnderSkipEveryPieceOfARowThatDoesNotDecodeIsBlankAsEmbedded) {
  testing::ScopedTempDir dir("braid-services-images-skip");
  const Config config = CaptionJob(dir, /*cut_row=*/-1, OnError::kSkip);
  const int64_t steps = 8;
  // The row to break: one whose caption goes on in a piece of its own (start > 0: the
  // planner cuts a document after its images), so that piece must learn of the break.
  // Its header stays good, so the plans stay the same.
  auto planner = MakePlanner(config, Planner::InitialState(config));
  ASSERT_TRUE(planner.ok()) << planner.status().ToString();
  int64_t tail_row = -1;
  for (int64_t step = 0; step < steps && tail_row < 0; ++step) {
    auto planned = (*planner)->Next();
    ASSERT_TRUE(planned.ok()) << planned.status().ToString();
    for (const BucketPlan& rank : (*planned)->plan->buckets) {
      for (const MicroBatch& mb : rank.micro_batches) {
        for (const Sequence& seq : mb.sequences) {
          for (const DocPiece& d : seq.docs) {
            if (d.start > 0 && tail_row < 0) tail_row = d.row;
          }
        }
      }
    }
  }
  ASSERT_GE(tail_row, 0) << "no document was cut";
  ASSERT_TRUE(testing::WriteCaptionFile(dir.Sub("captions.parquet"), int(tail_row),
                                        /*two_images=*/true)
                  .ok());
  const ReplyCounts counts = ExpectServicesAsEmbedded(config, steps);
  // Pieces without all of their row's images got the others to check (the caption tails
  // of rows whose images are in an earlier piece).
  EXPECT_GT(counts.checked_images, 0);
  // Every blanked piece is reported, naming the file and the row.
  ASSERT_FALSE(counts.blanked.empty());
  for (const std::string& why : counts.blanked) {
    EXPECT_THAT(why, HasSubstr("captions.parquet"));
    EXPECT_THAT(why, HasSubstr("row " + std::to_string(tail_row)));
    EXPECT_THAT(why, HasSubstr("cannot decode image"));
  }
}

TEST_F(ServicesTest, AnImageThatDoesNotDecodeFailsTheBuildNamingFileAndRow) {
  testing::ScopedTempDir dir("braid-services-images-fail");
  const Config config = CaptionJob(dir, /*cut_row=*/9, OnError::kFail);
  auto planner = MakePlanner(config, Planner::InitialState(config));
  ASSERT_TRUE(planner.ok()) << planner.status().ToString();
  auto service = MakeServing(config, 0, int64_t{1} << 20);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  Status failed;
  for (int64_t step = 0; step < 8 && failed.ok(); ++step) {
    auto planned = (*planner)->Next();
    ASSERT_TRUE(planned.ok()) << planned.status().ToString();
    const auto message = EncodeStepPlan(*(*planned)->plan);
    for (int64_t b = 0; b < 2 && failed.ok(); ++b) {
      auto part = DecodeBucket(message.data(), message.size(), b);
      ASSERT_TRUE(part.ok());
      const auto requests = PieceRequests(*part, b, 1);
      if (requests[0].empty()) continue;
      // The service sends the bytes as they are; the constructor finds them bad.
      auto reply = (*service)->Fetch(requests[0].data(),
                                     int64_t(requests[0].size()) / kRequestFields);
      ASSERT_TRUE(reply.ok()) << reply.status().ToString();
      failed = AttachPieces(&*part, b, 0, config.sources[0],
                            std::make_shared<PieceReply>(std::move(*reply)));
    }
  }
  ASSERT_FALSE(failed.ok()) << "row 9 was never planned";
  EXPECT_THAT(failed.message(), HasSubstr("captions.parquet"));
  EXPECT_THAT(failed.message(), HasSubstr("row 9"));
  EXPECT_THAT(failed.message(), HasSubstr("cannot decode image: PNG"));
  EXPECT_THAT(failed.message(), HasSubstr("set on_error: skip"));
  ASSERT_NE(GetErrorDetail(failed), nullptr);
  EXPECT_EQ(GetErrorDetail(failed)->kind(), ErrorKind::kData);
}

}  // namespace
}  // namespace braid
