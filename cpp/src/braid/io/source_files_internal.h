// What the files of SourceFiles (source_files.h) share. The family, by concern:
//   source_paths.cc          a source's path to its filesystem and sorted files
//   parquet_open.cc          opening a Parquet file so that a failure is blamed on the
//                            storage (retried) or on the bytes (not): OpenParquet
//   source_files.cc          SourceFiles::Open: footers, column checks, row group sizes
//   source_files_read.cc     row-group reads (ReadColumns) and block reads (ReadBlock)
//   source_files_lengths.cc  token counts without the tokens (ReadLengths)
//
// Thread-safe: the functions are; SourceFiles is thread-compatible (source_files.h).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include <arrow/filesystem/filesystem.h>
#include <arrow/io/interfaces.h>

#include "braid/io/retry_internal.h"
#include "braid/io/source_files.h"
#include "braid/status.h"

namespace braid {
namespace internal {

/// Arrow's message on one line (Parquet's span several): Braid's errors are one line.
std::string OneLine(std::string message);

/// `st` (a storage or data error naming `path`) as the same kind of error naming `where`.
Status ErrorAt(const Status& st, const std::string& path, const std::string& where);

/// Opens the Parquet file `path` of `fs` through a file that sets `io_failed` when a read
/// of the underlying file fails, with `props` (null: Parquet's defaults, in Braid's read
/// pool). A failed open is a storage error when the storage failed, else a data error.
Result<std::unique_ptr<parquet::arrow::FileReader>> OpenWatched(
    arrow::fs::FileSystem* fs, const std::string& path,
    std::shared_ptr<std::atomic<bool>> io_failed,
    const parquet::ReaderProperties* props = nullptr);

/// The same for the open file `input` (`path` names it in errors).
Result<std::unique_ptr<parquet::arrow::FileReader>> OpenWatchedInput(
    std::shared_ptr<arrow::io::RandomAccessFile> input, const std::string& path,
    std::shared_ptr<std::atomic<bool>> io_failed,
    const parquet::ReaderProperties* props = nullptr);

}  // namespace internal

template <typename T>
Result<T> SourceFiles::Retried(int file, int row_group,
                               const std::function<Result<T>()>& read) {
  const Status& lost = lost_[size_t(file)];
  if (!lost.ok()) {
    return StorageError(DataLocation(files_[size_t(file)].path, row_group, -1),
                        "not read: the file was lost earlier (" + lost.message() + ")");
  }
  int tries = 0;
  auto out = internal::RetryStorage(
      [&]() -> Result<T> {
        Result<T> got = read();
        // What came back must come from the stamped file (source_files.h), and bad bytes
        // may be a change. A storage failure is retried as it is: nothing was read, and
        // a store that is down would fail the stat too.
        if (got.ok() || !got.status().IsIOError())
          ARROW_RETURN_NOT_OK(CheckUnchanged(file));
        return got;
      },
      internal::kStorageRetryDelaysMs, &tries);
  if (out.ok() || !out.status().IsIOError()) return out;
  Status st = out.status();
  if (tries > 1) st = st.WithMessage(st.message(), " (", tries, " tries)");
  lost_[size_t(file)] = st;
  ++dead_files_;
  return st;
}

}  // namespace braid
