// Bounded retries with backoff for storage reads.
//
// A remote file that stops answering, or a read that fails half-way, may succeed when
// tried again; a file whose bytes are bad never does. RetryStorage calls an attempt again
// only when it failed with an I/O error (arrow::StatusCode::IOError: StorageError), after
// a short fixed backoff, a small fixed number of times: 50, 200 and 800 ms, so at most 4
// tries and about a second per failing read. Anything else (a data error, success) is
// returned at once, and so is an I/O error that says the store refused access (denied
// or forbidden: credentials that are missing or wrong do not change in a second).
//
// Thread-safe: a pure function of its arguments (it sleeps on the calling thread).
#pragma once

#include <chrono>
#include <span>
#include <string_view>
#include <thread>
#include <utility>

#include <arrow/result.h>
#include <arrow/status.h>

namespace braid::internal {

/// Backoff before each retry of a failed storage read, ms (4 tries in all).
inline constexpr int kStorageRetryDelaysMs[] = {50, 200, 800};

inline const arrow::Status& StatusOf(const arrow::Status& st) { return st; }
template <typename T>
const arrow::Status& StatusOf(const arrow::Result<T>& r) {
  return r.status();
}

/// True for an I/O error that says the store refused access: S3's ACCESS_DENIED or 403
/// and its credential errors, GCS's PERMISSION_DENIED, a local file's EACCES.
inline bool AccessRefused(const arrow::Status& st) {
  if (!st.IsIOError()) return false;
  const std::string_view m = st.message();
  for (std::string_view word :
       {"ACCESS_DENIED", "AccessDenied", "[code 403]", "InvalidAccessKeyId",
        "SignatureDoesNotMatch", "PERMISSION_DENIED", "Permission denied"}) {
    if (m.find(word) != std::string_view::npos) return true;
  }
  return false;
}

/// Calls `attempt()` (returning a Status or a Result) until it succeeds or fails with
/// anything but an IOError (or with one that AccessRefused), retrying an IOError once
/// per entry of `delays_ms` after sleeping that long. Returns the last attempt's
/// outcome; `*tries` (may be null) is set to the number of calls made.
template <typename F>
auto RetryStorage(F&& attempt, std::span<const int> delays_ms = kStorageRetryDelaysMs,
                  int* tries = nullptr) -> decltype(attempt()) {
  auto out = attempt();
  int n = 1;
  for (int delay_ms : delays_ms) {
    if (!StatusOf(out).IsIOError() || AccessRefused(StatusOf(out))) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    out = attempt();
    ++n;
  }
  if (tries != nullptr) *tries = n;
  return out;
}

}  // namespace braid::internal
