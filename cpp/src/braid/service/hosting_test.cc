#include "braid/service/hosting.h"

#include <string>

#include <gtest/gtest.h>

namespace braid {
namespace {

Config Make(const std::string& runtime, const std::string& weights) {
  // Four token sources; `weights` holds their four weight values or schedules.
  std::string text = "seed: 1\nbatch: {global_tokens: 4096, seq_len: 1024}\nruntime: " +
                     runtime + "\nsources:\n";
  size_t at = 0;
  for (int i = 0; i < 4; ++i) {
    const size_t end = weights.find(';', at);
    text += "  - {name: s" + std::to_string(i) + ", path: /d/s" + std::to_string(i) +
            ", tokens_column: t, weight: " + weights.substr(at, end - at) + "}\n";
    at = end == std::string::npos ? end : end + 1;
  }
  auto c = ParseConfig(text, "");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

TEST(HostingTest, TheDefaultServesEverySourceFromTheFirstNodesHost) {
  const Placement p = PlaceSources(Make("{kind: ray}", "1;2;3;4"));
  EXPECT_EQ(p.sources, Placement::Sources::kNode);
  EXPECT_EQ(p.hosts, 1);
  EXPECT_EQ(p.host_of_source, (std::vector<int32_t>{0, 0, 0, 0}));
}

TEST(HostingTest, SourceActorsServeAboutEqualSharesOfAStep) {
  // Equal weights: round the hosts in config order.
  Placement p = PlaceSources(Make("{kind: ray, source_actors: 2}", "1;1;1;1"));
  EXPECT_EQ(p.sources, Placement::Sources::kActors);
  EXPECT_EQ(p.host_of_source, (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_EQ(p.sources_of_host, (std::vector<std::vector<int32_t>>{{0, 2}, {1, 3}}));
  // 1:2:3:4 -> 0.4 + 0.1 and 0.3 + 0.2 (i % 2 would give 0.4 and 0.6).
  p = PlaceSources(Make("{kind: ray, source_actors: 2}", "1;2;3;4"));
  EXPECT_EQ(p.host_of_source, (std::vector<int32_t>{0, 1, 1, 0}));
  EXPECT_EQ(p.sources_of_host, (std::vector<std::vector<int32_t>>{{0, 3}, {1, 2}}));
  // A source that rises later counts at its largest share: s3 holds 0.7 of a step from
  // step 100 on, so it gets a host of its own and the other three share the other.
  p = PlaceSources(Make("{kind: ray, source_actors: 2}",
                        "1;1;1;{steps: [[0, 0], [100, 7]]}"));
  EXPECT_EQ(p.host_of_source, (std::vector<int32_t>{1, 1, 1, 0}));
  // More processes than sources: one source each.
  p = PlaceSources(Make("{kind: ray, source_actors: 8}", "1;2;3;4"));
  EXPECT_EQ(p.hosts, 4);
  EXPECT_EQ(p.host_of_source, (std::vector<int32_t>{3, 2, 1, 0}));
}

TEST(HostingTest, LargestSharesFollowSchedulesAndPhases) {
  Config c = Make("{kind: ray}", "1;1;{schedule: [[0, 0], [50, 2]]};0");
  const std::vector<double> share = LargestShares(c);
  ASSERT_EQ(share.size(), 4u);
  EXPECT_NEAR(share[0], 0.5, 1e-9);   // at step 0: 1 of 2
  EXPECT_NEAR(share[2], 0.5, 1e-9);   // at step 50: 2 of 4
  EXPECT_NEAR(share[3], 0.0, 1e-9);   // never drawn
}

}  // namespace
}  // namespace braid
