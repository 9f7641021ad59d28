// A local cache of remote source files (runtime.cache), shared by the threads of one
// process and by every process that names the same folder.
//
// Layout of the folder:
//   <16 hex digits>-<file name>     one complete copy; the digits hash the remote path,
//                                   size and modification time, so a changed remote file
//                                   gets a new entry
//   .locks/<entry>                  the entry's lock file (flock(2))
//   .partial/<entry>.<pid>-<n>      a download in flight, renamed into place when complete
//   .locks/.trim, .locks/.over-budget  the lock that serializes trims; present while the
//                                   copies exceed max_bytes by what is pinned
//
// Guarantees:
//   - A copy is read through the descriptor opened when it was pinned, so a reader never
//     loses a file it holds, whatever other threads or processes do to the folder.
//   - A pinned copy (a shared lock on its lock file, held while a returned file lives) is
//     never evicted. Eviction takes the exclusive lock without waiting and skips what it
//     cannot lock.
//   - One download per entry at a time across processes: the downloader holds the entry's
//     exclusive lock; the others wait on it, then find the copy in place. A copy appears
//     by rename(2) only when complete.
//   - Before a copy is made, unpinned copies are evicted, least recently used first, until
//     the new one fits in max_bytes. The folder exceeds max_bytes only by copies pinned at
//     that moment (each reader pins one file per source); then the next pin to go, in any
//     process, or the next cache made on the folder, trims it back. Downloads in flight
//     are not counted.
// The folder must be on a local filesystem (flock is not reliable over NFS).
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <arrow/filesystem/filesystem.h>
#include <arrow/io/interfaces.h>

#include "braid/status.h"

namespace braid {

class FileCache : public std::enable_shared_from_this<FileCache> {
 public:
  /// A cache on `dir` (made on first use). Trims the folder if it was left over budget.
  static std::shared_ptr<FileCache> Make(std::string dir, int64_t max_bytes);

  /// The local copy of the remote file `info`, open and pinned while the returned file (or
  /// any copy of its shared_ptr) lives. When the copy is absent: downloads it from
  /// `remote` if `download` (waiting while another process downloads it), else returns
  /// nullptr. Also nullptr when the file alone exceeds max_bytes (read it remotely).
  Result<std::shared_ptr<arrow::io::RandomAccessFile>> Open(arrow::fs::FileSystem* remote,
                                                             const arrow::fs::FileInfo& info,
                                                             bool download);

  /// The entry's name in the folder ("<hash>-<file name>").
  static std::string EntryName(const arrow::fs::FileInfo& info);
  /// Where the copy of `info` is (or would be): the folder's entry. A reader that maps it
  /// by path holds the copy Open pinned meanwhile.
  std::string CopyPath(const arrow::fs::FileInfo& info) const;

  /// Evicts unpinned copies, least recently used first, until the copies take at most
  /// max_bytes - `reserve` bytes; `keep` (an entry name) is never evicted. Returns
  /// whether that was reached. Removes downloads left by processes that died. Never
  /// waits for a pin (only for another process's trim).
  bool Trim(int64_t reserve, const std::string& keep);

  const std::string& dir() const { return dir_; }
  int64_t max_bytes() const { return max_bytes_; }

 private:
  FileCache(std::string dir, int64_t max_bytes)
      : dir_(std::move(dir)), max_bytes_(max_bytes) {}
  friend class CachePin;

  // Copies `info` to the entry `name` at `data` (the caller holds its exclusive lock):
  // makes room, writes under .partial/, renames into place.
  Status Download(arrow::fs::FileSystem* remote, const arrow::fs::FileInfo& info,
                  const std::string& name, const std::string& data);
  // Trim with the trim lock held.
  bool TrimLocked(int64_t reserve, const std::string& keep);
  // Called when a pin goes: trims the folder if a trim left it over budget.
  void Released();

  const std::string dir_;
  const int64_t max_bytes_;
};

}  // namespace braid
