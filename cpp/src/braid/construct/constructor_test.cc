#include "braid/construct/constructor.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "braid/plan/planner.h"
#include "braid/source/source_loader.h"
#include "braid/testing/memory_stream.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::braid::testing::MemoryStream;
using ::testing::ElementsAreArray;

template <typename T>
std::vector<T> Values(const Batch& batch, const std::string& name, DType dtype) {
  const Tensor* t = batch.Find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ(t->dtype, dtype) << name;
  EXPECT_EQ(t->storage->size(), size_t(t->num_elements()) * DTypeSize(dtype)) << name;
  return std::vector<T>(t->data<T>(), t->data<T>() + t->num_elements());
}

TokenPayload Payload(std::vector<int32_t> tokens) {
  return MakeTokenPayload(std::move(tokens));
}

DocPiece Piece(int32_t source, TokenPayload payload, int64_t start, int64_t len,
               int64_t doc_tokens = -1) {
  DocPiece d;
  d.source = source;
  d.start = start;
  d.len = len;
  d.doc_tokens = doc_tokens >= 0 ? doc_tokens : int64_t(payload->tokens.size());
  d.payload = std::move(payload);
  return d;
}

TEST(ConstructorTest, HandBuiltPlanGivesExactTensors) {
  // seq_len 6, one micro-batch of two sequences:
  //   seq 0: A[0,4) (A ends)  | B[0,2) (B continues in seq 1)
  //   seq 1: B[2,5) (B ends)  | C[1,4) of a truncated C (doc_tokens 4)
  const auto a = Payload({10, 11, 12, 13});
  const auto b = Payload({20, 21, 22, 23, 24});
  const auto c = Payload({30, 31, 32, 33, 34, 35});
  Sequence s0, s1;
  s0.docs = {Piece(0, a, 0, 4), Piece(1, b, 0, 2)};
  s1.docs = {Piece(1, b, 2, 3), Piece(2, c, 1, 3, /*doc_tokens=*/4)};
  s0.tokens = s1.tokens = 6;
  StepPlan plan;
  plan.step = 17;
  plan.seq_len = 6;
  plan.buckets.resize(2);
  plan.buckets[1].bucket = 1;
  plan.buckets[1].micro_batches.resize(2);
  plan.buckets[1].micro_batches[1].sequences = {s0, s1};

  auto built = BuildMicroBatch(plan, /*dp=*/1, /*micro_batch=*/1);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  const Batch& batch = *built;
  EXPECT_EQ(batch.step, 17);
  EXPECT_EQ(batch.dp, 1);
  EXPECT_EQ(batch.micro_batch, 1);
  for (const char* name :
       {"input_ids", "labels", "loss_mask", "position_ids", "source_ids"}) {
    ASSERT_NE(batch.Find(name), nullptr) << name;
    EXPECT_EQ(batch.Find(name)->shape, (std::vector<int64_t>{2, 6})) << name;
  }
  EXPECT_EQ(batch.Find("nope"), nullptr);
  EXPECT_THAT(Values<int64_t>(batch, "input_ids", DType::kInt64),
              ElementsAreArray({10, 11, 12, 13, 20, 21, /**/ 22, 23, 24, 31, 32, 33}));
  EXPECT_THAT(
      Values<int64_t>(batch, "labels", DType::kInt64),
      ElementsAreArray({11, 12, 13, -100, 21, 22, /**/ 23, 24, -100, 32, 33, -100}));
  EXPECT_THAT(Values<float>(batch, "loss_mask", DType::kFloat32),
              ElementsAreArray({1, 1, 1, 0, 1, 1, /**/ 1, 1, 0, 1, 1, 0}));
  EXPECT_THAT(Values<int64_t>(batch, "position_ids", DType::kInt64),
              ElementsAreArray({0, 1, 2, 3, 0, 1, /**/ 0, 1, 2, 0, 1, 2}));
  EXPECT_THAT(Values<int32_t>(batch, "source_ids", DType::kInt32),
              ElementsAreArray({0, 0, 0, 0, 1, 1, /**/ 1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(batch.Find("cu_seqlens")->shape, (std::vector<int64_t>{5}));
  EXPECT_THAT(Values<int32_t>(batch, "cu_seqlens", DType::kInt32),
              ElementsAreArray({0, 4, 6, 9, 12}));
}

// A row that is not full (token slack) ends with padding that is a cu_seqlens segment of
// its own: the next row's first document never spans it, and the last boundary is the
// micro-batch's token count.
TEST(ConstructorTest, PaddedRowsEndWithTheirOwnSegment) {
  const auto a = Payload({10, 11, 12});
  const auto b = Payload({20, 21, 22, 23});
  const auto c = Payload({30, 31});
  Sequence s0, s1, s2;
  s0.docs = {Piece(0, a, 0, 3)};  // 3 of 5: padded
  s0.tokens = 3;
  s1.docs = {Piece(1, b, 0, 4), Piece(0, c, 0, 1, /*doc_tokens=*/1)};  // full
  s1.tokens = 5;
  s2.docs = {Piece(0, c, 0, 2)};  // 2 of 5: padded
  s2.tokens = 2;
  StepPlan plan;
  plan.seq_len = 5;
  plan.buckets.resize(1);
  plan.buckets[0].micro_batches.resize(1);
  plan.buckets[0].micro_batches[0].sequences = {s0, s1, s2};
  auto built = BuildMicroBatch(plan, 0, 0);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  EXPECT_THAT(Values<int32_t>(*built, "cu_seqlens", DType::kInt32),
              ElementsAreArray({0, 3, 5, 9, 10, 12, 15}));
  EXPECT_THAT(Values<int64_t>(*built, "labels", DType::kInt64),
              ElementsAreArray({11, 12, -100, -100, -100, /**/ 21, 22, 23, -100, -100,
                                /**/ 31, -100, -100, -100, -100}));
  EXPECT_THAT(Values<int64_t>(*built, "position_ids", DType::kInt64),
              ElementsAreArray({0, 1, 2, 0, 1, /**/ 0, 1, 2, 3, 0, /**/ 0, 1, 0, 1, 2}));
  EXPECT_THAT(Values<float>(*built, "loss_mask", DType::kFloat32),
              ElementsAreArray({1, 1, 0, 0, 0, /**/ 1, 1, 1, 0, 0, /**/ 1, 0, 0, 0, 0}));

  // A sequence whose pieces overflow seq_len is refused, not written past its row.
  plan.buckets[0].micro_batches[0].sequences[2].docs.push_back(Piece(1, b, 0, 4));
  const Status overflow = BuildMicroBatch(plan, 0, 0).status();
  EXPECT_THAT(overflow.message(),
              ::testing::HasSubstr("sequence 2: its pieces hold 6 tokens, more than seq_len 5"));
  // A data error with its location, so Python raises braid.DataError.
  ASSERT_NE(GetErrorDetail(overflow), nullptr);
  EXPECT_EQ(GetErrorDetail(overflow)->kind(), ErrorKind::kData);
  EXPECT_EQ(GetErrorDetail(overflow)->where(), "step 0: rank 0 micro-batch 0 sequence 2");
}

TEST(ConstructorTest, PlanWithoutPayloadsIsInvalid) {
  Sequence s;
  DocPiece d;
  d.len = 4;
  d.doc_tokens = 4;
  s.docs = {d};
  s.tokens = 4;
  StepPlan plan;
  plan.seq_len = 4;
  plan.buckets.resize(1);
  plan.buckets[0].micro_batches.resize(1);
  plan.buckets[0].micro_batches[0].sequences = {s};
  auto built = BuildMicroBatch(plan, 0, 0);
  ASSERT_FALSE(built.ok());
  EXPECT_TRUE(built.status().IsInvalid());
  EXPECT_THAT(built.status().message(), ::testing::HasSubstr("no payloads"));
  ASSERT_NE(GetErrorDetail(built.status()), nullptr);
  EXPECT_EQ(GetErrorDetail(built.status())->kind(), ErrorKind::kData);
}

TEST(ConstructorTest, TensorStorageOutlivesTheBatch) {
  const auto a = Payload({1, 2, 3, 4});
  Sequence s;
  s.docs = {Piece(0, a, 0, 4)};
  s.tokens = 4;
  StepPlan plan;
  plan.seq_len = 4;
  plan.buckets.resize(1);
  plan.buckets[0].micro_batches.resize(1);
  plan.buckets[0].micro_batches[0].sequences = {s};
  std::shared_ptr<Bytes> storage;
  {
    auto built = BuildMicroBatch(plan, 0, 0);
    ASSERT_TRUE(built.ok());
    storage = built->Find("input_ids")->storage;
  }
  ASSERT_EQ(storage->size(), 4 * sizeof(int64_t));
  EXPECT_EQ(reinterpret_cast<const int64_t*>(storage->data())[3], 4);
}

// Checks every tensor of `batch` against the plan's micro-batch and the documents.
void CheckAgainstPlan(
    const StepPlan& plan, int64_t dp, int64_t mb_index, const Batch& batch,
    const std::function<const std::vector<int32_t>&(const DocPiece&)>& doc,
    int* continued_pieces) {
  const MicroBatch& mb = plan.buckets[size_t(dp)].micro_batches[size_t(mb_index)];
  const int64_t rows = int64_t(mb.sequences.size()), L = plan.seq_len;
  const auto ids = Values<int64_t>(batch, "input_ids", DType::kInt64);
  const auto labels = Values<int64_t>(batch, "labels", DType::kInt64);
  const auto mask = Values<float>(batch, "loss_mask", DType::kFloat32);
  const auto pos = Values<int64_t>(batch, "position_ids", DType::kInt64);
  const auto src = Values<int32_t>(batch, "source_ids", DType::kInt32);
  const auto cu = Values<int32_t>(batch, "cu_seqlens", DType::kInt32);
  ASSERT_EQ(int64_t(ids.size()), rows * L);
  ASSERT_FALSE(cu.empty());
  EXPECT_EQ(cu.front(), 0);
  EXPECT_EQ(cu.back(), rows * L);
  size_t piece_index = 0;
  int64_t t = 0;
  for (const Sequence& seq : mb.sequences) {
    for (const DocPiece& d : seq.docs) {
      const auto& tokens = doc(d);
      ASSERT_EQ(cu[piece_index], t);
      for (int64_t k = 0; k < d.len; ++k, ++t) {
        const int64_t at = d.start + k;
        ASSERT_EQ(ids[size_t(t)], tokens[size_t(at)]) << "token " << t;
        ASSERT_EQ(pos[size_t(t)], k);
        ASSERT_EQ(src[size_t(t)], d.source);
        const bool has_next = at + 1 < d.doc_tokens;
        ASSERT_EQ(labels[size_t(t)], has_next ? tokens[size_t(at + 1)] : kIgnoreLabel);
        ASSERT_EQ(mask[size_t(t)], has_next ? 1.0f : 0.0f);
        if (k + 1 == d.len && has_next) ++*continued_pieces;
      }
      ++piece_index;
    }
    ASSERT_EQ(t % L, 0) << "sequences are full";
  }
  EXPECT_EQ(cu.size(), piece_index + 1);
  EXPECT_TRUE(std::is_sorted(cu.begin(), cu.end()));
}

TEST(ConstructorTest, MicroBatchesOfTwoSequencesFromAMemoryPlan) {
  testing::LengthSpec spec;
  spec.median_tokens = 200;
  spec.max_tokens = 1500;
  auto docs_a =
      std::make_shared<const MemoryStream::Docs>(testing::RandomDocs(300, spec, 1));
  auto docs_b =
      std::make_shared<const MemoryStream::Docs>(testing::RandomDocs(300, spec, 2));
  Config config;
  config.seed = 4;
  config.topology.dp = 2;
  config.batch.seq_len = 256;
  config.batch.micro_batch_size = 2;
  config.batch.global_tokens = 256 * 8;  // 2 micro-batches of 2 per rank
  for (const char* name : {"a", "b"}) {
    SourceConfig s;
    s.name = name;
    s.path = name;
    s.tokens_column = "t";
    s.weight = WeightSchedule{{{0, name[0] == 'a' ? 0.7 : 0.3}}};
    config.sources.push_back(s);
  }
  config.sources[1].oversize = Oversize::kTruncate;
  ASSERT_TRUE(ValidateConfig(config).ok());
  MemoryStream::Options oa, ob;
  oa.source = 0;
  ob.source = 1;
  MemoryStream a(docs_a, oa), b(docs_b, ob);
  auto planner = Planner::Make(config, {&a, &b}, Planner::InitialState(config));
  ASSERT_TRUE(planner.ok());
  int continued = 0, checked = 0;
  for (int step = 0; step < 6; ++step) {
    auto plan = (*planner)->PlanStep();
    ASSERT_TRUE(plan.ok());
    for (int64_t dp = 0; dp < 2; ++dp) {
      for (int64_t m = 0; m < 2; ++m) {
        auto batch = BuildMicroBatch(*plan, dp, m);
        ASSERT_TRUE(batch.ok()) << batch.status().ToString();
        EXPECT_EQ(batch->Find("input_ids")->shape, (std::vector<int64_t>{2, 256}));
        CheckAgainstPlan(
            *plan, dp, m, *batch,
            [&](const DocPiece& d) -> const std::vector<int32_t>& {
              return (d.source == 0 ? a : b).Doc(d.file, d.row);
            },
            &continued);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 24);
  EXPECT_GT(continued, 0) << "some pieces should end inside their document";
}

// batch.pad_to_multiple_of: the planner plans every document rounded up to a multiple of
// m, so every piece starts and ends on a multiple of m; the constructor fills each
// document's rounding with pad tokens (id 0, no target), keeps them in the piece's
// segment, and carries the real lengths in cu_seqlens_unpadded.
class PaddedPiecesTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(PaddedPiecesTest, EveryPieceIsWholeBlocksAndEveryTokenArrivesOnce) {
  const int64_t m = GetParam();
  testing::LengthSpec spec;
  spec.median_tokens = 40;
  spec.max_tokens = 300;
  auto docs = std::make_shared<const MemoryStream::Docs>(testing::RandomDocs(400, spec, 7));
  Config config;
  config.seed = 9;
  config.topology.dp = 2;
  config.batch.seq_len = 96;
  config.batch.global_tokens = 96 * 8;
  config.batch.pad_to_multiple_of = m;
  SourceConfig s;
  s.name = "a";
  s.path = "a";
  s.tokens_column = "t";
  config.sources.push_back(s);
  ASSERT_TRUE(ValidateConfig(config).ok());
  MemoryStream::Options o;
  MemoryStream a(docs, o);
  auto planner = Planner::Make(config, {&a}, Planner::InitialState(config));
  ASSERT_TRUE(planner.ok());
  // Per (file, row, epoch): the pieces seen, (start, len).
  std::map<std::tuple<int32_t, int64_t, int64_t>, std::vector<std::pair<int64_t, int64_t>>>
      pieces;
  std::map<std::tuple<int32_t, int64_t, int64_t>, int64_t> doc_len;
  int64_t padded_pieces = 0;
  for (int step = 0; step < 8; ++step) {
    auto plan = (*planner)->PlanStep();
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->seq_len, 96);
    for (int64_t dp = 0; dp < 2; ++dp) {
      for (int64_t mb = 0; mb < 4; ++mb) {
        auto batch = BuildMicroBatch(*plan, dp, mb, m);
        ASSERT_TRUE(batch.ok()) << batch.status().ToString();
        const auto ids = Values<int64_t>(*batch, "input_ids", DType::kInt64);
        const auto labels = Values<int64_t>(*batch, "labels", DType::kInt64);
        const auto mask = Values<float>(*batch, "loss_mask", DType::kFloat32);
        const auto cu = Values<int32_t>(*batch, "cu_seqlens", DType::kInt32);
        const auto max_seqlen = Values<int32_t>(*batch, "max_seqlen", DType::kInt32);
        const auto real = m > 1 ? Values<int32_t>(*batch, "cu_seqlens_unpadded",
                                                   DType::kInt32)
                                : cu;
        if (m == 1) EXPECT_EQ(batch->Find("cu_seqlens_unpadded"), nullptr);
        ASSERT_EQ(real.size(), cu.size());
        int32_t longest = 0;
        for (size_t k = 0; k + 1 < cu.size(); ++k) {
          EXPECT_EQ(cu[k] % m, 0) << "a piece boundary off the blocks";
          longest = std::max(longest, cu[k + 1] - cu[k]);
        }
        EXPECT_EQ(max_seqlen, std::vector<int32_t>{longest});
        const Sequence& seq = plan->buckets[size_t(dp)].micro_batches[size_t(mb)]
                                  .sequences[0];
        size_t t = 0, segment = 0;
        for (const DocPiece& d : seq.docs) {
          EXPECT_EQ(d.start % m, 0);
          EXPECT_EQ(d.len % m, 0);
          const std::vector<int32_t>& doc = a.Doc(d.file, d.row);
          const int64_t n = int64_t(doc.size());
          EXPECT_EQ(d.doc_tokens, (n + m - 1) / m * m);
          pieces[{d.file, d.row, d.epoch}].emplace_back(d.start, d.len);
          doc_len[{d.file, d.row, d.epoch}] = d.doc_tokens;
          const int64_t real_len = std::min(d.len, n - d.start);
          ASSERT_GT(real_len, 0);
          EXPECT_EQ(real[segment + 1] - real[segment], real_len);
          EXPECT_EQ(cu[segment + 1] - cu[segment], d.len);
          padded_pieces += real_len < d.len ? 1 : 0;
          for (int64_t k = 0; k < d.len; ++k, ++t) {
            if (d.start + k < n) {
              EXPECT_EQ(ids[t], doc[size_t(d.start + k)]);
              if (d.start + k + 1 < n) {
                EXPECT_EQ(labels[t], doc[size_t(d.start + k + 1)]);
                EXPECT_EQ(mask[t], 1.0f);
              } else {
                EXPECT_EQ(labels[t], kIgnoreLabel);
              }
            } else {  // padding
              EXPECT_EQ(ids[t], 0);
              EXPECT_EQ(labels[t], kIgnoreLabel);
              EXPECT_EQ(mask[t], 0.0f);
            }
          }
          ++segment;
        }
        EXPECT_EQ(int64_t(t), 96) << "the rows are full";
      }
    }
  }
  if (m > 1) EXPECT_GT(padded_pieces, 20);
  // Every document's pieces tile it from its start, each token once.
  for (auto& [doc, parts] : pieces) {
    std::sort(parts.begin(), parts.end());
    int64_t at = 0;
    for (const auto& [start, len] : parts) {
      EXPECT_EQ(start, at);
      at = start + len;
    }
    EXPECT_LE(at, doc_len[doc]);
  }
}

INSTANTIATE_TEST_SUITE_P(Multiples, PaddedPiecesTest, ::testing::Values(1, 2, 4, 6));

// A payload shorter than its planned document by m or more is a data error.
TEST(ConstructorTest, PaddedPieceOfAShorterPayloadIsADataError) {
  Sequence seq;
  seq.docs = {Piece(0, Payload({1, 2, 3}), 0, 8, /*doc_tokens=*/8)};
  seq.tokens = 8;
  StepPlan plan;
  plan.seq_len = 8;
  plan.buckets.resize(1);
  plan.buckets[0].micro_batches.resize(1);
  plan.buckets[0].micro_batches[0].sequences = {seq};
  EXPECT_THAT(BuildMicroBatch(plan, 0, 0, /*pad_to_multiple_of=*/4).status().message(),
              ::testing::HasSubstr("the payload holds 3 tokens, the plan a 8-token"));
  auto ok = BuildMicroBatch(plan, 0, 0, /*pad_to_multiple_of=*/8);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_THAT(Values<int32_t>(*ok, "cu_seqlens_unpadded", DType::kInt32),
              ElementsAreArray({0, 3}));
  EXPECT_THAT(BuildMicroBatch(plan, 0, 0).status().message(),
              ::testing::HasSubstr("the payload holds 3 tokens"));
}

TEST(ConstructorTest, MicroBatchesFromRealParquet) {
  testing::ScopedTempDir dir("braid-constructor");
  testing::LengthSpec spec;
  spec.median_tokens = 150;
  spec.max_tokens = 900;
  std::vector<std::vector<std::vector<int32_t>>> files;
  for (int f = 0; f < 2; ++f) {
    files.push_back(testing::RandomDocs(80, spec, uint64_t(10 + f)));
    testing::TokenFileOptions opts;
    opts.row_group_rows = 25;
    opts.int64_values = f == 1;
    ASSERT_TRUE(testing::WriteTokenFile(dir.Sub("d/f" + std::to_string(f) + ".parquet"),
                                        files.back(), opts)
                    .ok());
  }
  Config config;
  config.seed = 8;
  config.topology.dp = 1;
  config.batch.seq_len = 128;
  config.batch.micro_batch_size = 2;
  config.batch.global_tokens = 128 * 4;
  SourceConfig s;
  s.name = "d";
  s.path = dir.Sub("d");
  s.tokens_column = "input_ids";
  s.shuffle_window_rows = 30;
  config.sources.push_back(s);
  ASSERT_TRUE(ValidateConfig(config).ok());
  auto loader = SourceLoader::Make(config, 0, {}, {});
  ASSERT_TRUE(loader.ok());
  auto planner = Planner::Make(config, {loader->get()}, Planner::InitialState(config));
  ASSERT_TRUE(planner.ok());
  int continued = 0;
  for (int step = 0; step < 10; ++step) {
    auto plan = (*planner)->PlanStep();
    ASSERT_TRUE(plan.ok());
    for (int64_t m = 0; m < 2; ++m) {
      auto batch = BuildMicroBatch(*plan, 0, m);
      ASSERT_TRUE(batch.ok());
      CheckAgainstPlan(
          *plan, 0, m, *batch,
          [&](const DocPiece& d) -> const std::vector<int32_t>& {
            return files[size_t(d.file)][size_t(d.row)];
          },
          &continued);
    }
  }
  EXPECT_GT(continued, 0);
}

}  // namespace
}  // namespace braid
