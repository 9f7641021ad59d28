#include "braid/exec/read_pool.h"

#include <algorithm>

#include "braid/util/cpu_time_internal.h"

namespace braid {
namespace {

thread_local bool on_pool_thread = false;
thread_local const ReadPool* this_threads_pool = nullptr;  // the pool running this thread

std::mutex& JoinHookMutex() {
  static auto* mu = new std::mutex();  // never destroyed: pools may end at exit
  return *mu;
}

ReadPool::JoinHook& TheJoinHook() {
  static auto* hook = new ReadPool::JoinHook();  // GUARDED_BY(JoinHookMutex())
  return *hook;
}

}  // namespace

bool ReadPool::OnPoolThread() { return on_pool_thread; }

void ReadPool::SetJoinHook(JoinHook hook) {
  std::lock_guard<std::mutex> lock(JoinHookMutex());
  TheJoinHook() = std::move(hook);
}

int64_t ReadPool::DefaultThreads() {
  return std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
}

ReadPool::ReadPool(int64_t threads) {
  for (int64_t i = 0; i < std::max<int64_t>(1, threads); ++i) {
    threads_.emplace_back([this] {
      on_pool_thread = true;
      this_threads_pool = this;
      Loop();
    });
  }
}

ReadPool::~ReadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  JoinHook hook;
  {
    std::lock_guard<std::mutex> lock(JoinHookMutex());
    hook = TheJoinHook();
  }
  const std::function<void()> join = [this] {
    for (auto& t : threads_) t.join();
  };
  if (hook) {
    hook(join);
  } else {
    join();
  }
}

void ReadPool::Submit(std::function<void()> task, bool urgent) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    (urgent ? urgent_ : tasks_).push_back(std::move(task));
  }
  cv_.notify_one();
}

void ReadPool::SubmitNext(std::function<void()> task, bool urgent) {
  if (this_threads_pool != this) return Submit(std::move(task), urgent);
  bool first = false;  // nothing queued before it: this thread's next task
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = urgent_.empty() && tasks_.empty();
    (urgent ? urgent_ : tasks_).push_back(std::move(task));
  }
  // Behind other tasks, this thread may take one of those first (a long decode): another
  // thread must be free to take it.
  if (!first) cv_.notify_one();
}

void ReadPool::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !urgent_.empty() || !tasks_.empty(); });
    auto& queue = !urgent_.empty() ? urgent_ : tasks_;
    if (queue.empty()) return;  // stopping, and every task has run
    std::function<void()> task = std::move(queue.front());
    queue.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

namespace {

// One ParallelFor loop, shared with its helper tasks (a helper may start after the loop
// has returned: it then finds `closed` and leaves without touching fn).
struct ForLoop {
  std::mutex mu;
  std::condition_variable cv;
  const std::function<void(int64_t)>* fn = nullptr;  // GUARDED_BY(mu) valid until closed
  int64_t n = 0;
  int64_t next = 0;     // GUARDED_BY(mu)
  int64_t running = 0;  // GUARDED_BY(mu) helpers inside fn
  bool closed = false;  // GUARDED_BY(mu)
  int64_t helper_cpu_ns = 0;  // GUARDED_BY(mu) thread CPU of the helpers' Drain calls

  // Runs indices until none is left. REQUIRES: lock holds mu.
  void Drain(std::unique_lock<std::mutex>& lock) {
    constexpr int64_t kChunk = 2;
    while (next < n) {
      const int64_t begin = next;
      const int64_t end = std::min(n, begin + kChunk);
      next = end;
      lock.unlock();
      for (int64_t i = begin; i < end; ++i) (*fn)(i);
      lock.lock();
    }
  }
};

}  // namespace

int64_t ReadPool::ParallelFor(int64_t n, int64_t max_threads,
                              const std::function<void(int64_t)>& fn) {
  const int64_t helpers = std::min({max_threads - 1, n - 1, threads()});
  if (helpers <= 0) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return 0;
  }
  auto loop = std::make_shared<ForLoop>();
  loop->fn = &fn;
  loop->n = n;
  for (int64_t h = 0; h < helpers; ++h) {
    Submit(
        [loop] {
          std::unique_lock<std::mutex> lock(loop->mu);
          if (loop->closed || loop->next >= loop->n) return;
          ++loop->running;
          const int64_t start_ns = internal::ThreadCpuNs();
          loop->Drain(lock);
          loop->helper_cpu_ns += internal::ThreadCpuNs() - start_ns;
          if (--loop->running == 0) loop->cv.notify_all();
        },
        /*urgent=*/true);
  }
  std::unique_lock<std::mutex> lock(loop->mu);
  loop->Drain(lock);
  loop->closed = true;
  loop->cv.wait(lock, [&] { return loop->running == 0; });
  return loop->helper_cpu_ns;
}

}  // namespace braid
