// The job's reader/transform threads, shared by every source loader.
//
// A ReadPool is a fixed set of threads that runs submitted tasks: the source loaders'
// read steps (read a window, transform a batch of rows, queue the samples), their
// deferred payload decodes, and the helpers of their parallel transform loops. A source
// so costs its cursor and buffer, not a thread: 1,000 sources on 8 threads run on 8
// threads. Loaders never block a pool thread on a full queue; they stop resubmitting
// their read step instead (source/source_loader.h), so any number of sources share any
// number of threads without deadlock.
//
// Two queues: urgent tasks (a consumer waits for them: a source's first read, a read
// step whose queue ran dry, loop helpers) run before the others, each queue in
// submission order.
//
// Runtimes that attach per-thread state to the pool's threads (the Python extension keeps
// one Python thread state on each pool thread that calls Python, transform/user_transform.h)
// use OnPoolThread to tell the pool's threads, whose end they can observe, from others,
// and SetJoinHook to run the destructor's joins in their own way (the extension releases
// the GIL around them, since an ending thread takes it to free its thread state).
//
// Thread-safe. The destructor runs every task already submitted, then joins.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace braid {

class ReadPool {
 public:
  /// The default size: the machine's hardware threads (at least 1).
  static int64_t DefaultThreads();

  /// REQUIRES: threads >= 1.
  explicit ReadPool(int64_t threads);
  ~ReadPool();
  ReadPool(const ReadPool&) = delete;
  ReadPool& operator=(const ReadPool&) = delete;

  /// Queues `task` (which must not throw and must not block on another task).
  void Submit(std::function<void()> task, bool urgent = false);

  /// Submit for a task that queues its own next step as its last act: called from one of
  /// this pool's threads with nothing else queued, `task` waits for this thread to come
  /// free (once the running task returns, unless another takes it first) instead of
  /// waking a sleeping one, which would only take the turn from this thread. Otherwise
  /// (tasks queued before it, or another thread calling), Submit.
  void SubmitNext(std::function<void()> task, bool urgent = false);

  /// Calls fn(i) for every i in [0, n) on the calling thread and on up to
  /// max_threads - 1 pool threads that are free to help; returns when all calls are done.
  /// May be called from a pool task (the caller never waits for a helper that has not
  /// started: it runs what no helper took). fn must not throw. Results that land in
  /// per-index slots are independent of how many threads helped.
  /// Returns the CPU time, in nanoseconds, that the helper threads spent in the loop
  /// (the calling thread's own is the caller's to measure): one clock read per helper
  /// at its start and end, none per index.
  int64_t ParallelFor(int64_t n, int64_t max_threads,
                      const std::function<void(int64_t)>& fn);

  int64_t threads() const { return static_cast<int64_t>(threads_.size()); }

  /// True on a thread of some ReadPool (for its whole life, its last thread-local
  /// destructors included), false on every other thread.
  static bool OnPoolThread();

  /// How destructors join their threads from now on: hook(join) must call join() once
  /// (which blocks until every thread of the pool has ended) and return after it. nullptr
  /// restores a plain join() call. Thread-safe; the hook runs on the destroying thread.
  using JoinHook = std::function<void(const std::function<void()>& join)>;
  static void SetJoinHook(JoinHook hook);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> urgent_;  // GUARDED_BY(mu_)
  std::deque<std::function<void()>> tasks_;   // GUARDED_BY(mu_)
  bool stop_ = false;                         // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

}  // namespace braid
