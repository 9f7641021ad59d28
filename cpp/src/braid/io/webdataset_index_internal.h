// Megatron-Energon's index of a WebDataset folder, as io/webdataset_files.cc uses it to
// count a shard's samples without reading its member headers and to start a block of
// samples at its first sample's byte offset.
//
// The layout (`energon prepare FOLDER` writes it): FOLDER/.nv-meta/.info.json (older
// versions: .info.yaml) maps `shard_counts`, each shard's path relative to FOLDER, to its
// sample count; beside each shard `SHARD.tar.idx` holds little-endian uint64 byte
// offsets, one per sample (its first member's header, where Python's tarfile puts a
// member's `offset`: an extended pax or GNU header's when there is one), then the offset
// where the last sample ends (the archive's end-of-archive blocks): count + 1 values.
// The folder's dataset.yaml, split.yaml and index.sqlite are not read. Every file is read
// through the source's Arrow filesystem (local, S3, GCS alike).
//
// Nothing here trusts the index: FindShardIndexes says which shards an info file lists,
// CheckShardIndex compares a shard's entry with its .tar.idx and with the shard's size
// and end (cheap: the .tar.idx and at most 1 KiB of the shard), and ReadSampleOffsets
// checks the offsets a block starts from; the reader checks, while reading, that each
// sample starts where the index says. What disagrees is reported as a string for the
// caller's warning; only a failed read of the storage is an error.
//
// Thread-safe: the functions keep no state.
#pragma once

#include <arrow/filesystem/filesystem.h>
#include <arrow/io/interfaces.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "braid/status.h"

namespace braid::internal {

/// A shard's entry in an Energon index.
struct ShardIndex {
  std::string info;      ///< the .info.json or .info.yaml that lists the shard
  std::string idx;       ///< the shard's .tar.idx (beside it)
  int64_t samples = 0;   ///< its count in `shard_counts`
};

/// What FindShardIndexes found for a source's shards.
struct ShardIndexes {
  /// Per path: its entry, or none (no prepared folder above it, a compressed shard, or
  /// an info file that does not list it or cannot be parsed: then see `problems`).
  std::vector<std::optional<ShardIndex>> shards;
  /// One line per prepared folder whose index leaves some of the source's shards out
  /// (naming the info file and the first shards) or cannot be parsed (saying why); those
  /// shards are counted from their headers.
  std::vector<std::string> problems;
};

/// The folder below which the index of a source's shards is searched: `source_path`
/// without its scheme (`s3://`) and query (`?endpoint_override=...`), cut before the
/// folder of its first glob character. The search for a shard's index walks from the
/// shard's folder up to this one and no further.
std::string IndexSearchRoot(const std::string& source_path);

/// Finds the Energon index of each of `paths` (`.tar` shards of `fs`; compressed ones
/// get none): the nearest folder from the shard's own up to `root` that holds
/// `.nv-meta/.info.json` (or `.info.yaml`), read once per folder (nlohmann::json,
/// yaml-cpp). IOError when an info file exists and cannot be read.
Result<ShardIndexes> FindShardIndexes(arrow::fs::FileSystem* fs,
                                      const std::vector<std::string>& paths,
                                      const std::string& root);

/// The checks at open of `shard`'s entry `index`: its .tar.idx holds samples + 1
/// offsets, each larger than the one before; the last one is at most the shard's size
/// and the bytes after it (up to 1 KiB) are zeros, the archive's end. Returns "" and sets
/// `*span_bytes` (the last offset less the first: the bytes of the shard's samples in the
/// tar), or says what disagreed. Reads the .tar.idx and at most 1 KiB of the shard.
/// IOError when the storage fails (a missing .tar.idx is a disagreement).
Result<std::string> CheckShardIndex(arrow::fs::FileSystem* fs, const std::string& shard,
                                    const ShardIndex& index, int64_t* span_bytes);

/// Offsets `first` .. `first + n` (n + 1 values) of the open .tar.idx `idx` (`path`),
/// whose shard has `samples` samples: "" and `*out`, or what disagreed (the file's size
/// is not (samples + 1) * 8 bytes, the offsets do not increase). One ranged read.
/// REQUIRES: first + n <= samples.
Result<std::string> ReadSampleOffsets(arrow::io::RandomAccessFile* idx,
                                      const std::string& path, int64_t samples,
                                      int64_t first, int64_t n,
                                      std::vector<int64_t>* out);

}  // namespace braid::internal
