// The files of a transform source (text or chat columns): footers and row-group reads of
// several named columns.
//
// The counterpart of SourceFiles for sources whose columns are not one token list:
// resolves the path the same way (ResolveFiles), reads every footer once, checks each
// column's type, and reads the columns of one row group. Errors name the file (and row
// group), the column and its config key.
//
// Thread-compatible: the source loader calls it from its one reader thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <arrow/array.h>
#include <arrow/filesystem/filesystem.h>

#include "braid/config/config.h"
#include "braid/source/source_files.h"
#include "braid/status.h"

namespace parquet::arrow {
class FileReader;
}

namespace braid {

/// A column a transform reads: its name, its config key, and a type check that returns
/// "" when the type is acceptable, else what was expected ("a string column").
struct ColumnSpec {
  std::string name;
  std::string key;
  std::function<std::string(const arrow::DataType&)> check;
};

class ColumnFiles {
 public:
  /// Resolves and opens every file of `source` (config path `key_path`). Fails if no file
  /// matches, a footer is unreadable, a column is missing or of the wrong type, or the
  /// source has no rows.
  static Result<std::unique_ptr<ColumnFiles>> Open(const SourceConfig& source,
                                                   const std::string& key_path,
                                                   std::vector<ColumnSpec> columns);
  ~ColumnFiles();

  /// The files in sorted path order (File::column is the first column's index).
  const std::vector<SourceFiles::File>& files() const { return files_; }
  int64_t total_rows() const { return total_rows_; }

  /// The columns of one row group, in ColumnSpec order, one chunk each.
  Result<std::vector<std::shared_ptr<arrow::Array>>> ReadColumns(int file, int row_group);

 private:
  ColumnFiles() = default;

  std::shared_ptr<arrow::fs::FileSystem> fs_;
  std::vector<ColumnSpec> columns_;
  std::vector<SourceFiles::File> files_;
  std::vector<std::vector<int>> column_index_;  // per file, per ColumnSpec
  int64_t total_rows_ = 0;
  int open_file_ = -1;
  std::unique_ptr<parquet::arrow::FileReader> open_reader_;
};

}  // namespace braid
