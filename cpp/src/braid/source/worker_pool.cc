#include "braid/source/worker_pool.h"

#include <algorithm>

namespace braid {

WorkerPool::WorkerPool(int64_t threads) {
  for (int64_t i = 1; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::Drain(const std::function<void(int64_t)>& fn, int64_t n) {
  // Indices are taken in small chunks under the lock; the work runs outside it.
  constexpr int64_t kChunk = 2;
  std::unique_lock<std::mutex> lock(mu_);
  while (next_ < n) {
    const int64_t begin = next_;
    const int64_t end = std::min(n, begin + kChunk);
    next_ = end;
    lock.unlock();
    for (int64_t i = begin; i < end; ++i) fn(i);
    lock.lock();
  }
}

void WorkerPool::Loop() {
  int64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (fn_ == nullptr || next_ >= n_) continue;  // woke after that loop was done
    const auto* fn = fn_;
    const int64_t n = n_;
    ++busy_;
    lock.unlock();
    Drain(*fn, n);
    lock.lock();
    if (--busy_ == 0) done_cv_.notify_all();
  }
}

void WorkerPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (threads_.empty() || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    ++generation_;
  }
  cv_.notify_all();
  Drain(fn, n);
  std::unique_lock<std::mutex> lock(mu_);
  // Every index is taken; wait for the pool threads still running theirs. A thread that
  // wakes late sees next_ == n_ and leaves at once.
  done_cv_.wait(lock, [&] { return busy_ == 0; });
  fn_ = nullptr;
}

TaskRunner::TaskRunner(int64_t threads) {
  for (int64_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

TaskRunner::~TaskRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void TaskRunner::Submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void TaskRunner::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, and every task has run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

}  // namespace braid
