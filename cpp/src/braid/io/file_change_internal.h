// How Braid tells that a source's file changed under a run: its stamp (type, size and
// modification time, from the filesystem) against a later one, and the error that names
// it. Used by SourceFiles (source_files.h, "Files that change") and FileCache.
//
// Thread-safe (pure functions).
#pragma once

#include <arrow/filesystem/filesystem.h>

#include "braid/status.h"

namespace braid::internal {

/// True when `now` has the type, size and modification time of `was`.
bool SameFile(const arrow::fs::FileInfo& was, const arrow::fs::FileInfo& now);

/// The data error for a file stamped `was` and found `now`: names the file, says what
/// changed, and that the file is not read further.
Status ChangedFileError(const arrow::fs::FileInfo& was, const arrow::fs::FileInfo& now);

}  // namespace braid::internal
