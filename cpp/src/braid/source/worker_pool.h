// A small fixed pool of threads that runs one parallel loop at a time.
//
// A source loader's reader thread calls ParallelFor to transform the rows of a batch on
// `threads` threads (itself and threads - 1 pool threads); results land in per-index slots,
// so the output order never depends on the thread count. No queue: one loop at a time.
//
// Thread-compatible: ParallelFor is called from one thread at a time. The destructor joins
// the pool threads (a running loop finishes first).
//
// TaskRunner is the asynchronous counterpart for work that outlives the batch that made
// it (a loader's image decodes, published before they finish): `threads` threads run
// submitted tasks in submission order. Thread-safe; the destructor runs every task
// already submitted, then joins, so no submitted task is ever dropped.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace braid {

class WorkerPool {
 public:
  /// REQUIRES: threads >= 1. threads == 1 starts no thread.
  explicit WorkerPool(int64_t threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// Calls fn(i) for every i in [0, n), spread over the threads; returns when all are
  /// done. fn must not throw.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

  int64_t threads() const { return static_cast<int64_t>(threads_.size()) + 1; }

 private:
  void Loop();
  // Runs indices of the current loop until none is left.
  void Drain(const std::function<void(int64_t)>& fn, int64_t n);

  std::mutex mu_;
  std::condition_variable cv_;       // new loop or shutdown
  std::condition_variable done_cv_;  // a thread finished its share
  const std::function<void(int64_t)>* fn_ = nullptr;  // GUARDED_BY(mu_)
  int64_t n_ = 0;                                      // GUARDED_BY(mu_)
  int64_t next_ = 0;                                   // GUARDED_BY(mu_)
  int64_t generation_ = 0;                             // GUARDED_BY(mu_)
  int64_t busy_ = 0;   // GUARDED_BY(mu_) pool threads inside the current loop
  bool stop_ = false;  // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

class TaskRunner {
 public:
  /// REQUIRES: threads >= 1.
  explicit TaskRunner(int64_t threads);
  ~TaskRunner();
  TaskRunner(const TaskRunner&) = delete;
  TaskRunner& operator=(const TaskRunner&) = delete;

  /// Queues `task` (which must not throw) to run on one of the threads.
  void Submit(std::function<void()> task);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // GUARDED_BY(mu_)
  bool stop_ = false;                        // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

}  // namespace braid
