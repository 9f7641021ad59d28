#include "braid/exec/read_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
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

TEST(ReadPoolTest, SubmitNextRunsFromAnyThreadAndAnyPool) {
  // From a pool thread of the same pool (a task queuing its next step), from a thread of
  // another pool (which must wake this pool's threads) and from no pool thread.
  ReadPool pool(2);
  ReadPool other(1);
  std::atomic<int> steps{0};
  std::promise<void> chain_done;
  std::function<void()> step = [&] {
    if (steps.fetch_add(1) + 1 == 100) {
      chain_done.set_value();
      return;
    }
    pool.SubmitNext(step);
  };
  pool.Submit(step);
  ASSERT_EQ(chain_done.get_future().wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
  EXPECT_EQ(steps.load(), 100);
  std::promise<void> from_other;
  other.Submit([&] { pool.SubmitNext([&] { from_other.set_value(); }); });
  EXPECT_EQ(from_other.get_future().wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
  std::promise<void> from_outside;
  pool.SubmitNext([&] { from_outside.set_value(); }, /*urgent=*/true);
  EXPECT_EQ(from_outside.get_future().wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
}

TEST(ReadPoolTest, SubmitNextBehindALongTaskWakesAnotherThread) {
  // The submitting thread takes the long task queued before: a sleeping thread must be
  // woken for the task behind it.
  ReadPool pool(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // both threads asleep
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> behind;
  pool.Submit([&, released] {
    // Queued first, waking nobody: this thread takes it once this task returns.
    pool.SubmitNext([released] { released.wait(); }, /*urgent=*/true);
    pool.SubmitNext([&] { behind.set_value(); });
  });
  const auto behind_ran = behind.get_future().wait_for(std::chrono::seconds(10));
  release.set_value();
  EXPECT_EQ(behind_ran, std::future_status::ready);
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

TEST(ReadPoolTest, OnPoolThreadTellsThePoolsThreadsFromOthers) {
  EXPECT_FALSE(ReadPool::OnPoolThread());
  bool other = true;
  std::thread([&] { other = ReadPool::OnPoolThread(); }).join();
  EXPECT_FALSE(other);
  ReadPool pool(2);
  std::atomic<int> on{0}, off{0};
  for (int i = 0; i < 20; ++i) {
    pool.Submit([&] { (ReadPool::OnPoolThread() ? on : off).fetch_add(1); });
  }
  // ParallelFor runs indices on the caller too: there it is false.
  std::mutex mu;
  std::vector<std::pair<std::thread::id, bool>> seen;
  pool.ParallelFor(200, 3, [&](int64_t) {
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace_back(std::this_thread::get_id(), ReadPool::OnPoolThread());
  });
  for (const auto& [id, flag] : seen) EXPECT_EQ(flag, id != std::this_thread::get_id());
  std::promise<void> done;
  pool.Submit([&] { done.set_value(); });
  ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
  EXPECT_EQ(on.load(), 20);
  EXPECT_EQ(off.load(), 0);
}

// Counts the pool threads whose thread-local state was destroyed (the thread ended).
std::atomic<int> ended{0};
struct EndMarker {
  bool touched = false;
  ~EndMarker() {
    if (touched) ended.fetch_add(1);
  }
};
thread_local EndMarker end_marker;

TEST(ReadPoolTest, JoinHookRunsTheJoinOnceAndThreadsHaveEndedWhenItReturns) {
  std::atomic<int> hooked{0};
  std::atomic<int> ended_in_hook{-1};
  ended.store(0);
  struct Unhook {
    ~Unhook() { ReadPool::SetJoinHook(nullptr); }
  } unhook;  // also when an assertion returns early
  ReadPool::SetJoinHook([&](const std::function<void()>& join) {
    hooked.fetch_add(1);
    join();
    ended_in_hook.store(ended.load());
  });
  {
    ReadPool pool(3);
    std::atomic<int> started{0};
    std::promise<void> go;
    std::shared_future<void> open = go.get_future().share();
    for (int t = 0; t < 3; ++t) {  // one task on each thread: each marks its thread
      pool.Submit([&, open] {
        end_marker.touched = true;
        started.fetch_add(1);
        open.wait();
      });
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (started.load() < 3 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    go.set_value();
    ASSERT_EQ(started.load(), 3);
  }
  ReadPool::SetJoinHook(nullptr);
  EXPECT_EQ(hooked.load(), 1);
  EXPECT_EQ(ended_in_hook.load(), 3);  // every thread's thread-locals were gone
  {
    ReadPool pool(1);  // without a hook: a plain join
  }
  EXPECT_EQ(hooked.load(), 1);
}

}  // namespace
}  // namespace braid
