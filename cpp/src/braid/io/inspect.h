// `braid inspect`: what a path holds, before it becomes a source.
//
// Resolves a path as a source would (file, directory, glob, URI), reads the footers, and,
// for a list<int> token column, every row group's list lengths (the offsets only; token
// values are not copied). Other formats (docs/sources.md, "Formats") go through
// SourceFiles: a Megatron dataset's index alone; JSON Lines files' records and, with
// `column`, the lengths of that field's lists; a save_to_disk folder's batches. Thread-compatible: each call owns its readers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "braid/status.h"

namespace braid {

struct InspectedFile {
  std::string path;
  int64_t rows = 0;
  int64_t row_groups = 0;
  int64_t bytes = 0;
};

struct Inspection {
  std::string schema;  ///< Arrow schema of the first file, one field per line
  std::vector<InspectedFile> files;
  int64_t rows = 0;
  std::string column;  ///< the token column measured; empty if there is none
  /// Token counts: buckets[k] counts documents with length in [2^k, 2^(k+1)); empty
  /// documents are counted in `empty`, nulls in `nulls`.
  std::vector<int64_t> buckets;
  int64_t empty = 0, nulls = 0;
  int64_t tokens = 0;
  int64_t min_tokens = 0, max_tokens = 0, p50_tokens = 0, p99_tokens = 0;
};

/// Inspects `path`. `column` names the token column; empty picks the first list<int32>
/// or list<int64> column, if any. Fails naming the file for unreadable files, or the
/// column if it is missing or not a list of integers.
Result<Inspection> Inspect(const std::string& path, const std::string& column);

}  // namespace braid
