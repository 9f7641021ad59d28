#include "braid/service/profile_timeline.h"

#include <gtest/gtest.h>

namespace braid {
namespace {

// Two sources: by step s, source 0 has used s ms of CPU and source 1 has waited 2 s ms.
std::vector<SourceProfile> At(int64_t s) {
  std::vector<SourceProfile> p(2);
  p[0].read_cpu_ns = s * 1'000'000;
  p[0].samples = s;
  p[1].consumer_wait_ns = 2 * s * 1'000'000;
  p[1].tokens = 10 * s;
  return p;
}

// A record's time: 10 ms per unit of `s`.
int64_t Ms(int64_t s) { return s * 10'000'000; }

TEST(ProfileTimelineTest, SpansCoverTheStepsAndSumToTheRun) {
  ProfileTimeline t(/*max_spans=*/4);
  for (int64_t s = 0; s <= 20; ++s) t.Record(s, At(s), Ms(s), {1, 1});
  // 20 steps in at most 4 spans: width 1 -> 2 -> 4 -> 8.
  ASSERT_LE(t.spans().size(), 4u);
  EXPECT_EQ(t.width(), 8);
  EXPECT_EQ(t.spans().front().first_step, 0);
  EXPECT_EQ(t.spans().back().end_step, 20);
  int64_t cpu = 0, wait = 0, tokens = 0;
  for (size_t i = 0; i < t.spans().size(); ++i) {
    const ProfileSpan& span = t.spans()[i];
    if (i > 0) EXPECT_EQ(span.first_step, t.spans()[i - 1].end_step);
    if (i + 1 < t.spans().size()) EXPECT_EQ(span.end_step - span.first_step, t.width());
    // Each span holds exactly its steps' cost.
    const int64_t steps = span.end_step - span.first_step;
    EXPECT_EQ(span.sources[0].read_cpu_ns, steps * 1'000'000);
    EXPECT_EQ(span.sources[0].samples, steps);
    EXPECT_EQ(span.sources[1].consumer_wait_ns, 2 * steps * 1'000'000);
    cpu += span.sources[0].read_cpu_ns;
    wait += span.sources[1].consumer_wait_ns;
    tokens += span.sources[1].tokens;
  }
  EXPECT_EQ(cpu, 20 * 1'000'000);
  EXPECT_EQ(wait, 40 * 1'000'000);
  EXPECT_EQ(tokens, 200);
}

TEST(ProfileTimelineTest, AStepPlannedAgainAddsToTheOpenSpan) {
  ProfileTimeline t;
  t.Record(5, At(0), Ms(0), {1, 1});  // a run resumed at step 5
  t.Record(6, At(1), Ms(1), {1, 1});
  t.Record(7, At(2), Ms(2), {1, 1});
  t.Record(6, At(3), Ms(3), {1, 1});  // step 6 planned again (a replay)
  t.Record(7, At(4), Ms(4), {1, 1});
  t.Record(8, At(5), Ms(5), {1, 1});
  ASSERT_EQ(t.spans().size(), 3u);
  EXPECT_EQ(t.spans()[0].first_step, 5);
  EXPECT_EQ(t.spans()[1].first_step, 6);
  EXPECT_EQ(t.spans()[1].end_step, 7);
  // Steps [6, 7) cost 1 ms, then the replay's two records (2 ms) joined it.
  EXPECT_EQ(t.spans()[1].sources[0].read_cpu_ns, 3'000'000);
  EXPECT_EQ(t.spans()[2].first_step, 7);
  EXPECT_EQ(t.spans()[2].sources[0].read_cpu_ns, 1'000'000);
  int64_t cpu = 0;
  for (const auto& s : t.spans()) cpu += s.sources[0].read_cpu_ns;
  EXPECT_EQ(cpu, 5'000'000);  // nothing lost, nothing counted twice
}

TEST(ProfileTimelineTest, NothingBeforeTheSecondRecord) {
  ProfileTimeline t;
  EXPECT_TRUE(t.spans().empty());
  t.Record(0, At(3), Ms(3), {1, 1});
  EXPECT_TRUE(t.spans().empty());
  t.Record(1, At(5), Ms(5), {1, 1});
  ASSERT_EQ(t.spans().size(), 1u);
  EXPECT_EQ(t.spans()[0].sources[0].read_cpu_ns, 2'000'000);  // the first record is the base
  // A start recorded twice (as a service starts, then plans its first step): the cost in
  // between is the first span's.
  ProfileTimeline twice;
  twice.Record(4, At(0), Ms(0), {1, 1});
  twice.Record(4, At(2), Ms(2), {1, 1});
  EXPECT_TRUE(twice.spans().empty());
  twice.Record(5, At(3), Ms(3), {1, 1});
  ASSERT_EQ(twice.spans().size(), 1u);
  EXPECT_EQ(twice.spans()[0].first_step, 4);
  EXPECT_EQ(twice.spans()[0].end_step, 5);
  EXPECT_EQ(twice.spans()[0].sources[0].read_cpu_ns, 3'000'000);
}

TEST(ProfileTimelineTest, ThreadTimeFollowsEachSourcesThreadsBetweenRecords) {
  ProfileTimeline t(/*max_spans=*/2);
  // Source 0 has 2 threads until step 4, then 1; source 1 is idle (0) until step 4, then
  // has 3. A step takes 10 ms, but step 2 takes 30 ms.
  const std::vector<int64_t> times = {0, 10, 20, 50, 60, 70, 80};
  for (int64_t s = 0; s <= 6; ++s) {
    const std::vector<int64_t> threads =
        s < 4 ? std::vector<int64_t>{2, 0} : std::vector<int64_t>{1, 3};
    t.Record(s, At(s), times[size_t(s)] * 1'000'000, threads);
  }
  // 6 steps in at most 2 spans: [0, 4) and [4, 6).
  ASSERT_EQ(t.spans().size(), 2u);
  const ProfileSpan& a = t.spans()[0];
  const ProfileSpan& b = t.spans()[1];
  ASSERT_EQ(a.end_step, 4);
  EXPECT_EQ(a.wall_ns, 60'000'000);
  EXPECT_EQ(a.thread_ns, (std::vector<int64_t>{120'000'000, 0}));
  EXPECT_EQ(b.wall_ns, 20'000'000);
  EXPECT_EQ(b.thread_ns, (std::vector<int64_t>{20'000'000, 60'000'000}));
  // Busy: source 0 used 1 ms of CPU a step, 4 ms of 120 ms of thread time in span a.
  EXPECT_EQ(a.sources[0].read_cpu_ns, 4'000'000);
}

TEST(ProfileTimelineTest, AReplaysTimeGoesToTheOpenSpan) {
  ProfileTimeline t;
  t.Record(0, At(0), Ms(0), {1, 2});
  t.Record(1, At(1), Ms(1), {1, 2});
  t.Record(1, At(2), Ms(3), {1, 2});  // step 1 planned again, 20 ms later
  t.Record(2, At(3), Ms(4), {1, 2});
  ASSERT_EQ(t.spans().size(), 2u);
  // The span open at the replay ([0, 1)): its own 10 ms and the replay's 20.
  EXPECT_EQ(t.spans()[0].wall_ns, Ms(3));
  EXPECT_EQ(t.spans()[0].thread_ns, (std::vector<int64_t>{Ms(3), 2 * Ms(3)}));
  EXPECT_EQ(t.spans()[1].wall_ns, Ms(1));
  EXPECT_EQ(t.spans()[1].thread_ns, (std::vector<int64_t>{Ms(1), 2 * Ms(1)}));
}

}  // namespace
}  // namespace braid
