// Diagnostic lines on stderr, and a rate limit for events that may repeat many times.
//
// Braid logs little: things a user should see but that do not stop the job (a skipped
// row). LogLine writes one whole line ("braid: ...") under a process-wide mutex, so lines
// from several loader threads never interleave. LogEveryN decides which occurrences of a
// repeating event are logged: the first `first`, then every `every`-th, each with the
// running count, so a bad source cannot flood the log.
//
// Thread-safe: both may be used from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string_view>

namespace braid::internal {

/// Writes "braid: <line>\n" to stderr as one unit and flushes it.
inline void LogLine(std::string_view line) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "braid: %.*s\n", static_cast<int>(line.size()), line.data());
  std::fflush(stderr);
}

/// Counts occurrences of an event and says which ones to log.
class LogEveryN {
 public:
  /// REQUIRES: first >= 0, every >= 1.
  LogEveryN(int64_t first, int64_t every) : first_(first), every_(every) {}

  /// Counts one occurrence; returns its 1-based number if it should be logged (one of
  /// the first `first`, or a multiple of `every` after them), else 0.
  int64_t Tick() {
    const int64_t n = count_.fetch_add(1, std::memory_order_relaxed) + 1;
    return (n <= first_ || n % every_ == 0) ? n : 0;
  }

  /// Occurrences counted so far.
  int64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  const int64_t first_;
  const int64_t every_;
  std::atomic<int64_t> count_{0};
};

}  // namespace braid::internal
