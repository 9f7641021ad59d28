#include "braid/io/file_lock_internal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace braid::internal {
namespace {

// True while `fd` is the file that `path` names (it was not unlinked or replaced).
bool SameFile(int fd, const std::string& path) {
  struct stat a, b;
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

}  // namespace

LockFile& LockFile::operator=(LockFile&& o) noexcept {
  reset();
  fd_ = std::exchange(o.fd_, -1);
  return *this;
}

void LockFile::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int Flock(int fd, int op) {
  int rc;
  do {
    rc = ::flock(fd, op);
  } while (rc != 0 && errno == EINTR);
  return rc;
}

Result<LockFile> TakeLock(const std::string& path, int op) {
  LockFile f(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!f.held()) {
    return StorageError(path, std::string("cannot open the lock file: ") +
                                  std::strerror(errno));
  }
  if (Flock(f.fd(), op) != 0) {
    if (errno == EWOULDBLOCK) return LockFile();
    return StorageError(path, std::string("cannot lock it: ") + std::strerror(errno));
  }
  if (!SameFile(f.fd(), path)) return LockFile();
  return f;
}

LockFile PollLock(const std::string& path, const std::function<bool()>& stop) {
  auto wait = std::chrono::milliseconds(1);
  while (!stop()) {
    auto taken = TakeLock(path, LOCK_EX | LOCK_NB);
    if (!taken.ok()) return {};
    if (taken->held()) return std::move(*taken);
    std::this_thread::sleep_for(wait);
    wait = std::min(wait * 2, std::chrono::milliseconds(16));
  }
  return {};
}

}  // namespace braid::internal
