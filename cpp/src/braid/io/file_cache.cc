#include "braid/io/file_cache.h"

#include <arrow/buffer.h>
#include <arrow/io/file.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <utility>
#include <vector>

#include "braid/io/file_change_internal.h"
#include "braid/io/file_lock_internal.h"
#include "braid/util/hash_internal.h"

namespace braid {
namespace stdfs = std::filesystem;
using internal::Flock;
using internal::LockFile;
using internal::TakeLock;

namespace {

constexpr const char* kLocks = ".locks";
constexpr const char* kPartial = ".partial";
// In .locks/: the lock that serializes trims, and the marker of a folder over budget.
constexpr const char* kTrimLock = ".trim";
constexpr const char* kOverBudget = ".over-budget";
// Attempts to pin an entry that other processes keep evicting or replacing (about 20 s
// of pauses in all) before the file is read remotely instead.
constexpr int kMaxAttempts = 1000;

std::string Errno() { return std::strerror(errno); }

// The complete copy at `path` of a file of `size` bytes, open; nullptr when absent or of
// another size (a copy left by an older version of the file under the same name).
Result<std::shared_ptr<arrow::io::ReadableFile>> OpenCopy(const std::string& path,
                                                          int64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return nullptr;
    return StorageError(path, "cannot open the cached copy: " + Errno());
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size != size) {
    ::close(fd);
    return nullptr;
  }
  auto file = arrow::io::ReadableFile::Open(fd);  // owns fd from here on
  if (!file.ok()) return StorageError(path, file.status().message());
  return *file;
}

// The entries of a folder; empty when it cannot be read. Never throws (a trim runs in
// destructors), whatever other processes remove meanwhile.
std::vector<stdfs::directory_entry> List(const stdfs::path& dir) {
  std::vector<stdfs::directory_entry> out;
  std::error_code ec;
  for (stdfs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    out.push_back(*it);
  }
  return out;
}

}  // namespace

// A pinned copy: the entry's lock file held shared, and the copy open for reading. The
// returned RandomAccessFile shares ownership of this object, so the pin lasts as long as
// the reader that uses it.
class CachePin {
 public:
  CachePin(std::shared_ptr<FileCache> cache, int lock_fd,
           std::shared_ptr<arrow::io::ReadableFile> file)
      : file(std::move(file)), cache_(std::move(cache)), lock_fd_(lock_fd) {}
  CachePin(const CachePin&) = delete;
  CachePin& operator=(const CachePin&) = delete;
  ~CachePin() {
    file.reset();
    ::close(lock_fd_);
    cache_->Released();
  }

  std::shared_ptr<arrow::io::ReadableFile> file;

 private:
  std::shared_ptr<FileCache> cache_;
  int lock_fd_;
};

std::shared_ptr<FileCache> FileCache::Make(std::string dir, int64_t max_bytes) {
  std::shared_ptr<FileCache> cache(new FileCache(std::move(dir), max_bytes));
  cache->Released();  // pins of processes that exited without letting go
  return cache;
}

std::string FileCache::EntryName(const arrow::fs::FileInfo& info) {
  const std::string key = info.path() + "|" + std::to_string(info.size()) + "|" +
                          std::to_string(info.mtime().time_since_epoch().count());
  const uint64_t h = internal::Fnv1a(key);
  char prefix[20];
  std::snprintf(prefix, sizeof(prefix), "%016llx-", static_cast<unsigned long long>(h));
  return prefix + stdfs::path(info.path()).filename().string();
}

std::string FileCache::CopyPath(const arrow::fs::FileInfo& info) const {
  return (stdfs::path(dir_) / EntryName(info)).string();
}

Result<std::shared_ptr<arrow::io::RandomAccessFile>> FileCache::Open(
    arrow::fs::FileSystem* remote, const arrow::fs::FileInfo& info, bool download) {
  const int64_t size = info.size();
  if (size > max_bytes_) return nullptr;
  std::error_code ec;
  stdfs::create_directories(stdfs::path(dir_) / kLocks, ec);
  if (!ec) stdfs::create_directories(stdfs::path(dir_) / kPartial, ec);
  if (ec) return StorageError(dir_, "cannot create the cache folder: " + ec.message());
  const std::string name = EntryName(info);
  const std::string data = CopyPath(info);
  const std::string lock_path = (stdfs::path(dir_) / kLocks / name).string();
  auto pinned = [&](LockFile lock, std::shared_ptr<arrow::io::ReadableFile> file) {
    ::utimensat(AT_FDCWD, data.c_str(), nullptr, 0);  // recently used (best effort)
    auto pin = std::make_shared<CachePin>(shared_from_this(), lock.release(), file);
    return std::shared_ptr<arrow::io::RandomAccessFile>(pin, pin->file.get());
  };
  if (!download && !stdfs::exists(data, ec)) return nullptr;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    // A shared lock waits while another process downloads or evicts this entry.
    ARROW_ASSIGN_OR_RAISE(LockFile lock, TakeLock(lock_path, LOCK_SH));
    if (!lock.held()) continue;
    ARROW_ASSIGN_OR_RAISE(auto file, OpenCopy(data, size));
    if (file) return pinned(std::move(lock), std::move(file));
    if (!download) return nullptr;
    lock.reset();
    // Without waiting: readers of a copy hold its lock shared for as long as they read
    // it. Held elsewhere: another process downloads it (the next round's shared lock
    // waits for that) or checks for it (retried after a pause).
    ARROW_ASSIGN_OR_RAISE(lock, TakeLock(lock_path, LOCK_EX | LOCK_NB));
    if (!lock.held()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(attempt + 1, 20)));
      continue;
    }
    ARROW_ASSIGN_OR_RAISE(file, OpenCopy(data, size));  // another process may have won
    if (!file) {
      ARROW_RETURN_NOT_OK(Download(remote, info, name, data));
      ARROW_ASSIGN_OR_RAISE(file, OpenCopy(data, size));
      if (!file) return StorageError(data, "the cached copy is missing after download");
    }
    // Shared again, so that other readers can pin it. (flock converts without atomicity:
    // should an eviction slip in between, the open descriptor still reads the copy.)
    if (Flock(lock.fd(), LOCK_SH) != 0) {
      return StorageError(lock_path, "cannot lock the cache entry: " + Errno());
    }
    return pinned(std::move(lock), std::move(file));
  }
  return nullptr;  // the entry never settled (removed by hand while pinned?): read remotely
}

Status FileCache::Download(arrow::fs::FileSystem* remote, const arrow::fs::FileInfo& info,
                           const std::string& name, const std::string& data) {
  Trim(info.size(), name);
  static std::atomic<uint64_t> counter{0};
  const std::string partial = (stdfs::path(dir_) / kPartial / name).string() + "." +
                              std::to_string(::getpid()) + "-" +
                              std::to_string(counter.fetch_add(1));
  std::error_code ec;
  Status st = [&]() -> Status {
    auto in = remote->OpenInputStream(info);
    if (!in.ok()) return StorageError(info.path(), in.status().message());
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) return StorageError(partial, "cannot write to the cache folder");
    int64_t copied = 0;
    while (true) {
      auto chunk = (*in)->Read(int64_t{4} << 20);
      if (!chunk.ok()) return StorageError(info.path(), chunk.status().message());
      if ((*chunk)->size() == 0) break;
      out.write(reinterpret_cast<const char*>((*chunk)->data()), (*chunk)->size());
      copied += (*chunk)->size();
    }
    out.close();
    if (!out) return StorageError(partial, "cannot write to the cache folder");
    if (copied != info.size()) {
      return StorageError(info.path(), "read " + std::to_string(copied) + " of " +
                                           std::to_string(info.size()) +
                                           " bytes (the file changed while it was copied)");
    }
    // The copy must be of the file the source stamped (io/source_files.h, "Files that
    // change"): its key says so.
    auto now = remote->GetFileInfo(info.path());
    if (!now.ok()) return StorageError(info.path(), now.status().message());
    if (!internal::SameFile(info, *now)) return internal::ChangedFileError(info, *now);
    stdfs::rename(partial, data, ec);
    if (ec) return StorageError(data, "cannot move into the cache: " + ec.message());
    return Status::OK();
  }();
  if (!st.ok()) {
    stdfs::remove(partial, ec);
    return st;
  }
  // Again, now that the copy counts: trims made by others while it downloaded did not
  // see it, and the over-budget marker must.
  Trim(0, name);
  return st;
}

bool FileCache::Trim(int64_t reserve, const std::string& keep) {
  auto lock = TakeLock((stdfs::path(dir_) / kLocks / kTrimLock).string(), LOCK_EX);
  return TrimLocked(reserve, keep);
}

bool FileCache::TrimLocked(int64_t reserve, const std::string& keep) {
  const stdfs::path marker = stdfs::path(dir_) / kLocks / kOverBudget;
  struct Entry {
    stdfs::file_time_type time;
    std::string name;
    int64_t size;
  };
  std::vector<Entry> entries;
  int64_t used = 0;
  for (const auto& e : List(dir_)) {
    std::error_code e_ec;
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.' || !e.is_regular_file(e_ec)) continue;
    const auto size = static_cast<int64_t>(e.file_size(e_ec));
    const auto time = e.last_write_time(e_ec);
    if (e_ec) continue;  // evicted meanwhile
    used += size;
    entries.push_back(Entry{time, name, size});
  }
  // Downloads whose entry nobody locks were left by a process that died.
  const stdfs::path partials = stdfs::path(dir_) / kPartial;
  for (const auto& e : List(partials)) {
    const std::string name = e.path().filename().string();
    const size_t dot = name.rfind('.');
    if (dot == std::string::npos) continue;
    auto lock = TakeLock((stdfs::path(dir_) / kLocks / name.substr(0, dot)).string(),
                         LOCK_EX | LOCK_NB);
    if (lock.ok() && lock->held()) {
      std::error_code rm_ec;
      stdfs::remove(e.path(), rm_ec);
    }
  }
  // Lock files of entries that are gone, unless someone holds them (a download).
  for (const auto& e : List(stdfs::path(dir_) / kLocks)) {
    const std::string name = e.path().filename().string();
    std::error_code e_ec;
    if (name.empty() || name[0] == '.' || stdfs::exists(stdfs::path(dir_) / name, e_ec)) {
      continue;
    }
    auto lock = TakeLock(e.path().string(), LOCK_EX | LOCK_NB);
    if (lock.ok() && lock->held()) stdfs::remove(e.path(), e_ec);
  }
  std::error_code marker_ec;
  if (used + reserve <= max_bytes_) {
    stdfs::remove(marker, marker_ec);
    return true;
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.time < b.time; });
  for (const auto& e : entries) {
    if (used + reserve <= max_bytes_) break;
    if (e.name == keep) continue;
    const std::string lock_path = (stdfs::path(dir_) / kLocks / e.name).string();
    auto lock = TakeLock(lock_path, LOCK_EX | LOCK_NB);
    if (!lock.ok() || !lock->held()) continue;  // pinned, or being downloaded
    std::error_code rm_ec;
    stdfs::remove(stdfs::path(dir_) / e.name, rm_ec);
    // The lock file goes too, while held: a process waiting on it sees it replaced.
    stdfs::remove(lock_path, rm_ec);
    used -= e.size;
  }
  // Over budget by what is pinned: whoever lets a pin go next trims again.
  if (used + reserve > max_bytes_) {
    std::ofstream{marker};
    return false;
  }
  stdfs::remove(marker, marker_ec);
  return true;
}

void FileCache::Released() {
  // Under the trim lock: a trim that found this pin held has finished, and its marker
  // (if any) is visible.
  auto lock = TakeLock((stdfs::path(dir_) / kLocks / kTrimLock).string(), LOCK_EX);
  std::error_code ec;
  if (stdfs::exists(stdfs::path(dir_) / kLocks / kOverBudget, ec)) TrimLocked(0, "");
}

}  // namespace braid
