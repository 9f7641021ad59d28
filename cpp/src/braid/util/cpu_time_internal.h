// The CPU time of the calling thread, for the per-source profile (source/profile.h).
//
// One clock_gettime(CLOCK_THREAD_CPUTIME_ID) call (a vDSO read on Linux, tens of
// nanoseconds): callers read it once per batch or per task, never per row. Thread-safe.
#pragma once

#include <time.h>

#include <cstdint>

namespace braid::internal {

/// CPU time this thread has used so far, in nanoseconds (0 where the clock is missing).
inline int64_t ThreadCpuNs() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace braid::internal
