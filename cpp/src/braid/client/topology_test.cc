#include "braid/client/topology.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

namespace braid {
namespace {

using ::testing::HasSubstr;

Topology Sizes(int64_t dp, int64_t tp, int64_t pp, int64_t cp) {
  Topology t;
  t.dp = dp;
  t.tp = tp;
  t.pp = pp;
  t.cp = cp;
  return t;
}

Result<Config> ParseTopology(const std::string& topology) {
  return ParseConfig("topology: " + topology +
                         "\n"
                         "batch: {global_tokens: 4096, seq_len: 64}\n"
                         "sources:\n  - {name: a, path: a.parquet, tokens_column: ids}\n",
                     "/tmp");
}

TEST(TopologyTest, DefaultOrderIsMegatrons) {
  const Topology t = Sizes(/*dp=*/3, /*tp=*/2, /*pp=*/2, /*cp=*/2);
  for (int64_t rank = 0; rank < t.world_size(); ++rank) {
    auto c = CoordsOf(t, rank);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(rank, c->tp + t.tp * (c->cp + t.cp * (c->dp + t.dp * c->pp)));
    EXPECT_EQ(RankOf(t, *c), rank);
  }
  EXPECT_THAT(CoordsOf(t, t.world_size()).status().message(), HasSubstr("rank"));
}

TEST(TopologyTest, ConfiguredOrderIsABijectionWithTheFirstDimensionFastest) {
  Topology t = Sizes(/*dp=*/2, /*tp=*/3, /*pp=*/2, /*cp=*/2);
  t.order = {Dim::kDp, Dim::kTp, Dim::kCp, Dim::kPp};
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t>> seen;
  for (int64_t rank = 0; rank < t.world_size(); ++rank) {
    auto c = CoordsOf(t, rank);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(rank, c->dp + t.dp * (c->tp + t.tp * (c->cp + t.cp * c->pp)));
    EXPECT_EQ(RankOf(t, *c), rank);
    seen.insert({c->dp, c->tp, c->pp, c->cp});
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), t.world_size());

  auto parsed = ParseTopology("{dp: 2, tp: 3, pp: 2, cp: 2, order: [dp, tp, cp, pp]}");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->topology.order, t.order);
  EXPECT_THAT(ParseTopology("{order: [dp, tp, tp, pp]}").status().message(),
              HasSubstr("topology.order[2]: 'tp' appears twice"));
  EXPECT_THAT(ParseTopology("{order: [dp, tp]}").status().message(),
              HasSubstr("topology.order: must be a list of the four"));
  EXPECT_THAT(ParseTopology("{order: [dp, tp, ep, pp]}").status().message(),
              HasSubstr("topology.order[2]: must be one of"));
}

TEST(TopologyTest, BucketsFollowDistributeGroupAndBroadcastAt) {
  Topology t = Sizes(/*dp=*/2, /*tp=*/2, /*pp=*/2, /*cp=*/2);
  // dp (default): one bucket per DP rank, whatever the other coordinates.
  EXPECT_EQ(t.buckets(), 2);
  for (int64_t rank = 0; rank < t.world_size(); ++rank) {
    const RankCoords c = *CoordsOf(t, rank);
    EXPECT_EQ(BucketOf(t, c), c.dp);
  }
  // cp: one per (dp, cp), cp varying faster (Megatron's order).
  t.distribute = Topology::Axis::kCp;
  EXPECT_EQ(t.buckets(), 4);
  EXPECT_FALSE(t.slices_context());
  EXPECT_EQ(BucketOf(t, RankCoords{/*dp=*/1, /*tp=*/1, /*pp=*/1, /*cp=*/0}), 2);
  EXPECT_EQ(BucketOf(t, RankCoords{/*dp=*/1, /*tp=*/0, /*pp=*/0, /*cp=*/1}), 3);
  // world with nothing broadcast: every rank its own bucket = its rank.
  t.distribute = Topology::Axis::kWorld;
  t.broadcast_tp = t.broadcast_pp = false;
  EXPECT_EQ(t.buckets(), t.world_size());
  for (int64_t rank = 0; rank < t.world_size(); ++rank) {
    EXPECT_EQ(BucketOf(t, *CoordsOf(t, rank)), rank);
  }
  // group 4: four consecutive ranks share one.
  t.group = 4;
  EXPECT_EQ(t.buckets(), 4);
  for (int64_t rank = 0; rank < t.world_size(); ++rank) {
    EXPECT_EQ(BucketOf(t, *CoordsOf(t, rank)), rank / 4);
  }
  // world, broadcast at tp: TP ranks share; WithBucket maps a bucket to its first rank's
  // distributed coordinates and keeps the others.
  t.group = 1;
  t.broadcast_tp = true;
  EXPECT_EQ(t.buckets(), 8);
  for (int64_t b = 0; b < t.buckets(); ++b) {
    const RankCoords c = WithBucket(t, RankCoords{0, /*tp=*/1, 0, 0}, b);
    EXPECT_EQ(c.tp, 1);
    EXPECT_EQ(BucketOf(t, c), b);
  }
}

TEST(TopologyTest, DistributeKeysParseAndCheck) {
  auto world = ParseTopology("{dp: 2, tp: 2, distribute: world}");
  ASSERT_TRUE(world.ok()) << world.status().ToString();
  EXPECT_EQ(world->topology.buckets(), 4);
  EXPECT_EQ(world->micro_batches_per_rank(), 64 / 4);
  auto tp_shared = ParseTopology("{dp: 2, tp: 2, distribute: world, broadcast_at: [tp]}");
  ASSERT_TRUE(tp_shared.ok()) << tp_shared.status().ToString();
  EXPECT_EQ(tp_shared->topology.buckets(), 2);
  auto grouped = ParseTopology("{dp: 2, cp: 2, distribute: {axis: cp, group: 2}}");
  ASSERT_TRUE(grouped.ok()) << grouped.status().ToString();
  EXPECT_EQ(grouped->topology.buckets(), 2);
  // With distribute cp, sequences are not sliced: seq_len need not divide by 2 * cp.
  auto whole = ParseConfig(
      "topology: {dp: 1, cp: 3, distribute: cp}\n"
      "batch: {global_tokens: 600, seq_len: 100}\n"
      "sources:\n  - {name: a, path: a.parquet, tokens_column: ids}\n",
      "/tmp");
  EXPECT_TRUE(whole.ok()) << whole.status().ToString();

  EXPECT_THAT(ParseTopology("{dp: 2, distribute: rows}").status().message(),
              HasSubstr("topology.distribute: must be one of dp | cp | world"));
  EXPECT_THAT(ParseTopology("{dp: 2, distribute: {group: 2}}").status().message(),
              HasSubstr("topology.distribute.axis: is required"));
  EXPECT_THAT(ParseTopology("{dp: 2, distribute: {axis: dp, group: 3}}").status().message(),
              HasSubstr("topology.distribute.group: must divide"));
  EXPECT_THAT(ParseTopology("{dp: 2, broadcast_at: [dp]}").status().message(),
              HasSubstr("topology.broadcast_at[0]: 'dp' ranks receive different"));
  // 64 sequences over 6 buckets do not divide: the message names the buckets.
  EXPECT_THAT(ParseTopology("{dp: 2, tp: 3, distribute: world}").status().message(),
              HasSubstr("the buckets of topology.distribute (6)"));
}

}  // namespace
}  // namespace braid
