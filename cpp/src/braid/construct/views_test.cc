#include "braid/construct/views.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <tuple>

namespace braid {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<std::string> Names(const Batch& b) {
  std::vector<std::string> out;
  for (const auto& t : b.tensors) out.push_back(t.name);
  return out;
}

// A micro-batch shaped like the constructor's: `rows` packed sequences of `seq_len`
// tokens, documents of seeded random lengths (cut at the row end). Every per-token value
// says where it is: input_ids = row*1000 + t, labels = -(input_ids + 1), etc.
Batch MakeBatch(int64_t rows, int64_t seq_len, uint32_t seed, int64_t dp = 0) {
  Batch b;
  b.step = 3;
  b.dp = dp;
  b.micro_batch = 1;
  Tensor ids = Tensor::Zeros("input_ids", DType::kInt64, {rows, seq_len});
  Tensor labels = Tensor::Zeros("labels", DType::kInt64, {rows, seq_len});
  Tensor mask = Tensor::Zeros("loss_mask", DType::kFloat32, {rows, seq_len});
  Tensor pos = Tensor::Zeros("position_ids", DType::kInt64, {rows, seq_len});
  Tensor src = Tensor::Zeros("source_ids", DType::kInt32, {rows, seq_len});
  std::mt19937 rng(seed);
  std::vector<int32_t> cu{0};
  for (int64_t r = 0; r < rows; ++r) {
    int64_t t = 0;
    int32_t source = 0;
    while (t < seq_len) {
      const int64_t len = std::min<int64_t>(1 + rng() % 13, seq_len - t);
      for (int64_t k = 0; k < len; ++k) {
        const int64_t i = r * seq_len + t + k;
        ids.data<int64_t>()[i] = r * 1000 + t + k;
        labels.data<int64_t>()[i] = -(r * 1000 + t + k + 1);
        mask.data<float>()[i] = (k + 1 < len) ? 1.0f : 0.0f;
        pos.data<int64_t>()[i] = k;
        src.data<int32_t>()[i] = source;
      }
      t += len;
      source = (source + 1) % 3;
      cu.push_back(int32_t(r * seq_len + t));
    }
  }
  Tensor cu_t = Tensor::Zeros("cu_seqlens", DType::kInt32, {int64_t(cu.size())});
  std::copy(cu.begin(), cu.end(), cu_t.data<int32_t>());
  for (Tensor* t : {&ids, &labels, &mask, &pos}) b.tensors.push_back(std::move(*t));
  int32_t longest = 0;
  for (size_t k = 0; k + 1 < cu.size(); ++k) longest = std::max(longest, cu[k + 1] - cu[k]);
  Tensor max_t = Tensor::Zeros("max_seqlen", DType::kInt32, {1});
  max_t.data<int32_t>()[0] = longest;
  b.tensors.push_back(std::move(cu_t));
  b.tensors.push_back(std::move(max_t));
  b.tensors.push_back(std::move(src));
  return b;
}

class ViewsTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(ViewsTest, PipelineStagesGetTheDocumentedKeysAndTensorRanksShareStorage) {
  const auto [cp, pp] = GetParam();
  const Topology topo{/*dp=*/2, /*tp=*/2, pp, cp};
  const Batch batch = MakeBatch(/*rows=*/2, /*seq_len=*/48, /*seed=*/1, /*dp=*/1);
  for (int64_t stage = 0; stage < pp; ++stage) {
    std::vector<std::string> want;
    if (stage == 0) want.push_back("input_ids");
    if (stage == pp - 1) {
      want.push_back("labels");
      want.push_back("loss_mask");
    }
    want.push_back("position_ids");
    want.push_back("cu_seqlens");
    want.push_back("max_seqlen");
    if (stage == 0) want.push_back("source_ids");
    EXPECT_EQ(ViewTensorNames(stage, pp), want);
    for (int64_t c = 0; c < cp; ++c) {
      auto tp0 = ViewFor(batch, topo, RankCoords{/*dp=*/1, /*tp=*/0, stage, c});
      auto tp1 = ViewFor(batch, topo, RankCoords{/*dp=*/1, /*tp=*/1, stage, c});
      ASSERT_TRUE(tp0.ok()) << tp0.status().ToString();
      ASSERT_TRUE(tp1.ok()) << tp1.status().ToString();
      EXPECT_EQ(Names(*tp0), want) << "stage " << stage;
      EXPECT_EQ(tp0->step, 3);
      EXPECT_EQ(tp0->dp, 1);
      EXPECT_EQ(tp0->micro_batch, 1);
      for (size_t i = 0; i < tp0->tensors.size(); ++i) {
        const Tensor& a = tp0->tensors[i];
        EXPECT_EQ(*a.storage, *tp1->tensors[i].storage) << a.name;
        if (cp == 1) {
          // No copy: the views hold the constructor's buffers.
          EXPECT_EQ(a.storage.get(), batch.Find(a.name)->storage.get()) << a.name;
          EXPECT_EQ(tp1->tensors[i].storage.get(), a.storage.get()) << a.name;
        } else if (a.name != "cu_seqlens" && a.name != "max_seqlen") {
          EXPECT_THAT(a.shape, ElementsAreArray({int64_t{2}, 48 / cp})) << a.name;
        }
      }
    }
  }
}

template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.num_elements());
}

TEST_P(ViewsTest, ContextPartsReassembleToTheSequences) {
  const auto [cp, pp] = GetParam();
  const Topology topo{/*dp=*/1, /*tp=*/1, pp, cp};
  constexpr int64_t kRows = 3, kSeq = 48;
  const int64_t chunk = kSeq / (2 * cp), local = kSeq / cp;
  for (uint32_t seed : {1u, 2u, 3u}) {
    const Batch batch = MakeBatch(kRows, kSeq, seed);
    const auto* global_cu = batch.Find("cu_seqlens")->data<int32_t>();
    const int64_t num_cu = batch.Find("cu_seqlens")->num_elements();
    const std::set<int32_t> doc_edges(global_cu, global_cu + num_cu);
    for (int64_t stage = 0; stage < pp; ++stage) {
      std::vector<Batch> parts;
      for (int64_t c = 0; c < cp; ++c) {
        auto v = ViewFor(batch, topo, RankCoords{0, 0, stage, c});
        ASSERT_TRUE(v.ok()) << v.status().ToString();
        parts.push_back(std::move(*v));
      }
      for (const std::string& name : ViewTensorNames(stage, pp)) {
        if (name == "cu_seqlens" || name == "max_seqlen") continue;
        const Tensor& whole = *batch.Find(name);
        const size_t elem = DTypeSize(whole.dtype);
        Bytes rebuilt(whole.storage->size());
        for (int64_t row = 0; row < kRows; ++row) {
          for (int64_t k = 0; k < 2 * cp; ++k) {
            const int64_t rank = k < cp ? k : 2 * cp - 1 - k;
            const int64_t offset = k < cp ? 0 : chunk;
            const Tensor& part = *parts[size_t(rank)].Find(name);
            ASSERT_EQ(part.num_elements(), kRows * local) << name;
            std::copy_n(part.storage->data() + size_t(row * local + offset) * elem,
                        size_t(chunk) * elem,
                        rebuilt.data() + size_t(row * kSeq + k * chunk) * elem);
          }
        }
        EXPECT_EQ(rebuilt, *whole.storage) << name << " cp " << cp << " stage " << stage;
      }
      // Every CP rank's cu_seqlens covers its tokens; every boundary is a document edge
      // or a chunk edge; inside a segment positions run on by one (one document).
      for (int64_t c = 0; c < cp; ++c) {
        const auto cu = Values<int32_t>(*parts[size_t(c)].Find("cu_seqlens"));
        int32_t longest = 0;
        for (size_t k = 0; k + 1 < cu.size(); ++k) longest = std::max(longest, cu[k + 1] - cu[k]);
        EXPECT_EQ(Values<int32_t>(*parts[size_t(c)].Find("max_seqlen")),
                  std::vector<int32_t>{longest});
        const auto pos = Values<int64_t>(*parts[size_t(c)].Find("position_ids"));
        ASSERT_GE(cu.size(), 2u);
        EXPECT_EQ(cu.front(), 0);
        EXPECT_EQ(cu.back(), kRows * local);
        int64_t expected_doc_edges = 0;
        for (int64_t row = 0; row < kRows; ++row) {
          for (int64_t k : {c, 2 * cp - 1 - c}) {
            const int64_t g0 = row * kSeq + k * chunk;
            for (int32_t e : doc_edges) expected_doc_edges += (e > g0 && e < g0 + chunk);
          }
        }
        int64_t doc_edges_seen = 0;
        for (size_t i = 1; i < cu.size(); ++i) {
          ASSERT_LT(cu[i - 1], cu[i]);
          const int64_t l = cu[i];
          const int64_t row = l / local, in_row = l % local;
          if (in_row == 0 || in_row == chunk) continue;  // a chunk edge
          const int64_t k = in_row < chunk ? c : 2 * cp - 1 - c;
          const int64_t global = row * kSeq + k * chunk + in_row % chunk;
          EXPECT_TRUE(doc_edges.count(int32_t(global)))
              << "local boundary " << l << " (global " << global << ") of cp rank " << c;
          ++doc_edges_seen;
        }
        EXPECT_EQ(doc_edges_seen, expected_doc_edges) << "cp rank " << c;
        for (size_t i = 0; i + 1 < cu.size(); ++i) {
          for (int64_t t = cu[i] + 1; t < cu[i + 1]; ++t) {
            ASSERT_EQ(pos[size_t(t)], pos[size_t(t - 1)] + 1)
                << "cp rank " << c << " t " << t;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CpPp, ViewsTest,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values(1, 2, 3)),
                         [](const auto& info) {
                           return "cp" + std::to_string(std::get<0>(info.param)) + "_pp" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(ViewsErrorTest, UnevenSplitBadCoordsAndOtherDpRankAreNamed) {
  const Batch batch = MakeBatch(/*rows=*/1, /*seq_len=*/20, /*seed=*/4);
  auto uneven = ViewFor(batch, Topology{1, 1, 1, /*cp=*/3}, RankCoords{});
  ASSERT_FALSE(uneven.ok());
  EXPECT_THAT(uneven.status().message(), HasSubstr("batch.seq_len"));
  EXPECT_FALSE(CheckContextSplit(/*seq_len=*/20, /*cp=*/3).ok());
  EXPECT_TRUE(CheckContextSplit(/*seq_len=*/20, /*cp=*/5).ok());
  EXPECT_TRUE(CheckContextSplit(/*seq_len=*/7, /*cp=*/1).ok());

  auto outside = ViewFor(batch, Topology{1, 2, 1, 1}, RankCoords{0, /*tp=*/2, 0, 0});
  ASSERT_FALSE(outside.ok());
  EXPECT_THAT(outside.status().message(), HasSubstr("rank"));
  auto other_dp = ViewFor(batch, Topology{2, 1, 1, 1}, RankCoords{/*dp=*/1, 0, 0, 0});
  ASSERT_FALSE(other_dp.ok());
  EXPECT_THAT(other_dp.status().message(), HasSubstr("DP rank 1"));
}

// distribute: cp gives every CP rank whole sequences of its own bucket; distribute: world
// without broadcast at pp gives every stage every tensor of its own bucket.
TEST(ViewsBucketTest, DistributedDimensionsGetWholeMicroBatchesOfTheirBucket) {
  Topology t{/*dp=*/2, /*tp=*/2, /*pp=*/3, /*cp=*/2};
  t.distribute = Topology::Axis::kCp;
  const RankCoords coords{/*dp=*/1, /*tp=*/1, /*pp=*/0, /*cp=*/1};
  const int64_t bucket = BucketOf(t, coords);
  EXPECT_EQ(bucket, 3);
  const Batch batch = MakeBatch(/*rows=*/2, /*seq_len=*/18, /*seed=*/5, /*dp=*/bucket);
  auto whole = ViewFor(batch, t, coords);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  // First stage: every input tensor, whole and shared (18 is not a multiple of 2 * cp
  // either: nothing is split).
  EXPECT_EQ(Names(*whole), ViewTensorNames(0, 3));
  for (const Tensor& v : whole->tensors) {
    EXPECT_EQ(v.storage, batch.Find(v.name)->storage) << v.name;
  }
  RankCoords middle = coords;
  middle.pp = 1;
  auto mid = ViewFor(batch, t, middle);
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(Names(*mid),
            (std::vector<std::string>{"position_ids", "cu_seqlens", "max_seqlen"}));
  // Another CP rank of the same DP rank has another bucket.
  RankCoords other = coords;
  other.cp = 0;
  auto wrong = ViewFor(batch, t, other);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("bucket 2 asked for a micro-batch of bucket 3"));

  t.distribute = Topology::Axis::kWorld;
  t.broadcast_tp = true;
  t.broadcast_pp = false;
  const Batch own = MakeBatch(/*rows=*/2, /*seq_len=*/18, /*seed=*/6,
                              /*dp=*/BucketOf(t, middle));
  auto stage = ViewFor(own, t, middle);
  ASSERT_TRUE(stage.ok()) << stage.status().ToString();
  EXPECT_EQ(Names(*stage), Names(own));
}

}  // namespace
}  // namespace braid
