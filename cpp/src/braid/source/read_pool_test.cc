#include "braid/source/read_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <vector>

namespace braid {
namespace {

TEST(ReadPoolTest, EveryTaskRunsAndTheDestructorDrainsTheQueue) {
  std::atomic<int64_t> ran{0};
  {
    ReadPool pool(3);
    for (int i = 0; i < 500; ++i) {
      pool.Submit([&] { ran.fetch_add(1); }, /*urgent=*/i % 7 == 0);
    }
  }
  EXPECT_EQ(ran.load(), 500);
}

TEST(ReadPoolTest, UrgentTasksRunBeforeQueuedOnes) {
  ReadPool pool(1);
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::vector<int> order;  // written by the one pool thread only
  pool.Submit([open] { open.wait(); });  // holds the thread while the others queue
  pool.Submit([&] { order.push_back(1); });
  pool.Submit([&] { order.push_back(2); });
  pool.Submit([&] { order.push_back(0); }, /*urgent=*/true);
  std::promise<void> done;
  pool.Submit([&] { done.set_value(); });
  gate.set_value();
  ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
}

TEST(ReadPoolTest, ParallelForCoversEveryIndexOnceForAnyHelperCount) {
  ReadPool pool(4);
  for (int64_t max_threads : {1, 2, 4, 9}) {
    for (int64_t n : {0, 1, 2, 3, 17, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.ParallelFor(n, max_threads, [&](int64_t i) { hits[size_t(i)].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << i;
    }
  }
}

TEST(ReadPoolTest, ParallelForFromEveryPoolThreadAtOnceDoesNotDeadlock) {
  // Every pool thread runs a loop that asks for helpers none of them can give: each
  // caller must finish its loop alone.
  ReadPool pool(2);
  std::atomic<int64_t> sum{0};
  std::promise<void> done;
  std::atomic<int> left{8};
  for (int t = 0; t < 8; ++t) {
    pool.Submit([&] {
      pool.ParallelFor(100, 4, [&](int64_t i) { sum.fetch_add(i); });
      if (left.fetch_sub(1) == 1) done.set_value();
    });
  }
  ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(60)),
            std::future_status::ready);
  EXPECT_EQ(sum.load(), 8 * 4950);
}

}  // namespace
}  // namespace braid
