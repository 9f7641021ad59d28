// The files of one source: path resolution, footers, and row-group reads.
//
// SourceFiles resolves a source's `path` (a file, a directory of Parquet files, or a glob;
// local or any URI Arrow's filesystems accept, with the source's storage options) to a
// sorted list of files, reads every footer once, checks the type of each column the
// source's transform reads (a token list, or text / chat columns) in each file, and reads
// those columns of one row group on request. Errors name the file (and row group), the
// column and its config key. With runtime.cache, remote files are read from local copies
// (FileCache): a file is copied when its rows are first read, and its copy stays pinned
// while the reader of that file is open.
//
// Thread-compatible: concurrent ReadTokens calls need external synchronization; the
// source loader calls it from its one reader thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <arrow/array.h>
#include <arrow/filesystem/filesystem.h>
#include <arrow/io/interfaces.h>

#include "braid/config/config.h"
#include "braid/source/file_cache.h"
#include "braid/status.h"

namespace parquet::arrow {
class FileReader;
}

namespace braid {

/// Resolves `path` to a filesystem and the sorted list of file paths it names. With
/// `anonymous`, a gs:// filesystem uses no credentials (storage.anonymous).
/// Fails (data error naming `key_path` and the path) when nothing matches.
Status ResolveFiles(const std::string& path, const std::string& key_path,
                    std::shared_ptr<arrow::fs::FileSystem>* fs,
                    std::vector<std::string>* files, bool anonymous = false);

/// Opens a Parquet file's reader; a missing file is a storage error, a file that is not
/// Parquet (bad magic, truncated footer) a data error naming it.
Result<std::unique_ptr<parquet::arrow::FileReader>> OpenParquet(arrow::fs::FileSystem* fs,
                                                                const std::string& path);
/// The same for an open file; `path` names it in errors.
Result<std::unique_ptr<parquet::arrow::FileReader>> OpenParquet(
    std::shared_ptr<arrow::io::RandomAccessFile> input, const std::string& path);

/// True for list<int32>, list<int64> and their large_list forms: a token column.
bool IsTokenListType(const arrow::DataType& type);

/// The source's path with its storage options (endpoint, region) as URI query
/// parameters, which Arrow's S3 and GCS filesystems read; other paths unchanged.
std::string StorageUri(const SourceConfig& source);

/// A column a transform reads: its name, its config key, and a type check that returns
/// "" when the type is acceptable, else what was expected ("a string column").
struct ColumnSpec {
  std::string name;
  std::string key;
  std::function<std::string(const arrow::DataType&)> check;
};

/// The spec of a token column (list<int32|int64>).
ColumnSpec TokenColumnSpec(const std::string& name, const std::string& key);

class SourceFiles {
 public:
  struct File {
    std::string path;
    std::vector<int64_t> row_group_rows;
    std::vector<int64_t> row_group_first_row;  ///< row index of each row group's first row
    int column = -1;                           ///< field index of the first column
    int64_t num_rows = 0;
  };

  /// Resolves and opens every file of `source`; `key_path` is its config path
  /// ("sources[2]"). Fails if no file matches, a footer is unreadable, a column is
  /// missing or of the wrong type, or the source has no rows.
  static Result<std::unique_ptr<SourceFiles>> Open(const SourceConfig& source,
                                                   const std::string& key_path,
                                                   std::vector<ColumnSpec> columns);
  /// The same for the source's token column (`tokens_column`).
  static Result<std::unique_ptr<SourceFiles>> Open(const SourceConfig& source,
                                                   const std::string& key_path);
  ~SourceFiles();

  const std::vector<File>& files() const { return files_; }
  int64_t total_rows() const { return total_rows_; }

  /// The columns of one row group, in ColumnSpec order, one chunk each.
  Result<std::vector<std::shared_ptr<arrow::Array>>> ReadColumns(int file, int row_group);

  /// The first column of one row group (the token column of a token source).
  Result<std::shared_ptr<arrow::Array>> ReadTokens(int file, int row_group);

 private:
  SourceFiles() = default;

  // Opens file `index` (`remote` in fs_) from its cached copy when the source is cached
  // and the copy is there (made first when `download`), else from fs_. The reader pins
  // the copy while it lives.
  Result<std::unique_ptr<parquet::arrow::FileReader>> OpenFile(const std::string& remote,
                                                               size_t index, bool download);

  std::shared_ptr<arrow::fs::FileSystem> fs_;
  std::shared_ptr<FileCache> cache_;         // set when remote files are cached
  std::vector<arrow::fs::FileInfo> infos_;  // per file, when cached: size and mtime
  std::vector<ColumnSpec> columns_;
  std::vector<File> files_;
  std::vector<std::vector<int>> column_index_;  // per file, per ColumnSpec
  int64_t total_rows_ = 0;
  // The reader of the file read last; row groups of one file are often read in a row.
  int open_file_ = -1;
  std::unique_ptr<parquet::arrow::FileReader> open_reader_;
};

}  // namespace braid
