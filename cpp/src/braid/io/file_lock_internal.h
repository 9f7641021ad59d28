// Locks between processes on a local folder (flock(2) on a lock file): the file cache's
// entries (io/file_cache.h), the whole-file counts kept in runtime.length_cache
// (format_reader_internal.h, FormatOpen::AddWholeFiles), the length cache's entries
// (io/length_cache.h) and the builds a node's peers share (transport/node_builds.h).
// flock is not reliable over NFS: the folders must be local.
//
// Thread-compatible: a LockFile is owned by one thread at a time; TakeLock is safe to
// call from any thread (each call opens its own descriptor, so two threads of one
// process exclude each other as two processes do).
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "braid/status.h"

namespace braid::internal {

/// An open lock file; closing it (destruction, reset) releases its lock.
class LockFile {
 public:
  LockFile() = default;
  explicit LockFile(int fd) : fd_(fd) {}
  LockFile(LockFile&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  LockFile& operator=(LockFile&& o) noexcept;
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;
  ~LockFile() { reset(); }
  void reset();
  int release() { return std::exchange(fd_, -1); }
  int fd() const { return fd_; }
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

/// flock(2) retried on EINTR; its return value (errno set on failure).
int Flock(int fd, int op);

/// Opens (creating) the lock file `path` and locks it with `op` (LOCK_SH or LOCK_EX,
/// optionally | LOCK_NB). Not held when a non-blocking lock is taken elsewhere, or when
/// the file was removed or replaced while this waited (the caller retries with the new
/// file or goes on without). A file that cannot be opened or locked is a storage error
/// naming it.
Result<LockFile> TakeLock(const std::string& path, int op);

/// An exclusive lock of `path`, waited for by polling (every 1 ms, doubling to 16 ms)
/// so that the wait can end: held once taken; unheld once `stop` returns true, or when
/// the lock file cannot be made (the caller goes on without it). For locks held only
/// while a bounded piece of work is done (a length-cache entry counted, a build made).
LockFile PollLock(const std::string& path, const std::function<bool()>& stop);

}  // namespace braid::internal
