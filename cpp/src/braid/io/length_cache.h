// Token counts of tokenized sources kept on disk between planning passes
// (`runtime.length_cache`).
//
// Counting the rows of a text, chat or image-caption source costs what reading it for
// training costs: the encode (for images, reading every image's bytes for its header). A
// plan-only pass (`braid plan`, the Ray runtime's planner) keeps, per window entry (a row
// group, or a block of one) and per row, what the transform made of the row's metadata:
// its token count, image tokens, skip reason and the bytes it decoded to. The next pass
// over the same entry reads that file instead of the entry's columns, so a re-plan costs
// about what a length column costs (docs/sources.md, "Counting a tokenized source").
//
// Keys. An entry is named by a hash of its whole key: the source's metadata identity
// (the columns read, the tokenizer's type, options and file bytes, the image sizing),
// the file's path, the row group's digest (SourceFiles::File::row_group_digest: its
// chunks' offsets, sizes and statistics from the footer), the row group and the block.
// The file holds the whole key and a read compares it, so a changed tokenizer, a
// rewritten row group or a hash collision is a miss, never wrong counts. Only entries
// whose rows all transformed cleanly (no error, no null) are written, so a cached skip
// has no message to repeat. Sources whose counts are cheap already (token columns:
// Parquet levels or a length column) and user transforms (a Python function's code is
// in no key) have no cache.
//
// Files: `<dir>/<16 hex digits>.lens`, written under a temporary name and renamed into
// place, so processes planning the same source at once never see part of an entry.
// A read or write that fails is a miss: the cache never fails a job. Braid never trims
// the folder; deleting it (or any entry) at any time is safe.
//
// Counting once per node. Processes that read the same source at once (a node's embedded
// ranks) take an entry's lock (Lock: an exclusive flock on `<entry file>.lock`) before
// they count it; the one that gets it counts and writes the entry, the others then find
// it kept. A process holds one entry's lock at a time, only while it reads and transforms
// that entry (never while it waits on anything else), so processes cannot deadlock.
//
// Thread-safe: const methods; distinct entries are distinct files.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "braid/config/config.h"
#include "braid/io/file_lock_internal.h"
#include "braid/source/sample.h"
#include "braid/status.h"

namespace braid {

/// What a planning pass keeps of one row.
struct CachedRow {
  int64_t tokens = 0;
  int64_t image_tokens = 0;
  int64_t estimate_bytes = 0;  ///< what the row's columns decoded to (read-ahead charge)
  SkipReason skip = SkipReason::kNone;

  friend bool operator==(const CachedRow&, const CachedRow&) = default;
};

/// Where an entry's rows come from.
struct LengthCacheEntry {
  std::string path;     ///< the file, as the source lists it
  uint64_t digest = 0;  ///< SourceFiles::File::row_group_digest of the row group
  int32_t row_group = 0;
  int64_t block_rows = 0;  ///< 0: the whole row group
  int64_t block = 0;
};

class LengthCache {
 public:
  /// The cache of config.sources[source_index], or null when it has none (no
  /// runtime.length_cache, a token source, a user transform). Fails (a config error
  /// naming the tokenizer's key) when a tokenizer file cannot be read.
  static Result<std::unique_ptr<LengthCache>> Make(const Config& config,
                                                   int32_t source_index);
  /// Whether runtime.length_cache would keep the counts of `source`: a text, chat or
  /// image-caption source without a user transform.
  static bool Keeps(const SourceConfig& source);

  /// The rows of `entry`, or nullopt when no valid file holds them.
  std::optional<std::vector<CachedRow>> Read(const LengthCacheEntry& entry) const;
  /// Stores the rows of `entry`; a failure is ignored (the next pass encodes again).
  void Write(const LengthCacheEntry& entry, const std::vector<CachedRow>& rows) const;
  /// Waits until this process holds `entry`'s lock (see the header) and returns it held;
  /// unheld once `stop` is set, or when the lock file cannot be made (the caller counts
  /// the entry without it). Polls every few milliseconds.
  internal::LockFile Lock(const LengthCacheEntry& entry,
                          const std::atomic<bool>& stop) const;

  const std::string& dir() const { return dir_; }

 private:
  LengthCache(std::string dir, std::string identity)
      : dir_(std::move(dir)), identity_(std::move(identity)) {}
  std::string Key(const LengthCacheEntry& entry) const;
  std::string FileFor(const std::string& key) const;

  const std::string dir_;
  const std::string identity_;  // the source's metadata identity (see the header)
};

}  // namespace braid
