#include "braid/source/column_files.h"

#include <arrow/api.h>
#include <arrow/filesystem/api.h>
#include <arrow/io/api.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>

namespace braid {
namespace {

std::string ColumnList(const arrow::Schema& schema) {
  std::string s;
  for (const auto& f : schema.fields()) s += (s.empty() ? "" : ", ") + f->name();
  return s;
}

}  // namespace

ColumnFiles::~ColumnFiles() = default;

Result<std::unique_ptr<ColumnFiles>> ColumnFiles::Open(const SourceConfig& source,
                                                       const std::string& key_path,
                                                       std::vector<ColumnSpec> columns) {
  std::unique_ptr<ColumnFiles> out(new ColumnFiles());
  out->columns_ = std::move(columns);
  std::vector<std::string> paths;
  ARROW_RETURN_NOT_OK(ResolveFiles(source.path, key_path, &out->fs_, &paths));
  for (const auto& path : paths) {
    SourceFiles::File file;
    file.path = path;
    auto input = out->fs_->OpenInputFile(path);
    if (!input.ok()) return StorageError(path, input.status().message());
    std::unique_ptr<parquet::arrow::FileReader> reader;
    try {
      auto r = parquet::arrow::OpenFile(*input, arrow::default_memory_pool());
      if (!r.ok()) {
        return DataError(path, "not a readable Parquet file: " + r.status().message());
      }
      reader = std::move(*r);
    } catch (const std::exception& e) {
      return DataError(path, std::string("not a readable Parquet file: ") + e.what());
    }
    std::shared_ptr<arrow::Schema> schema;
    const Status schema_st = reader->GetSchema(&schema);
    if (!schema_st.ok()) {
      return DataError(path, "cannot read the schema: " + schema_st.message());
    }
    std::vector<int> indices;
    for (const auto& c : out->columns_) {
      const int index = schema->GetFieldIndex(c.name);
      if (index < 0) {
        return DataError(path, "no column '" + c.name + "' (" + c.key +
                                   "); columns: " + ColumnList(*schema));
      }
      const auto& type = *schema->field(index)->type();
      const std::string expected = c.check(type);
      if (!expected.empty()) {
        return DataError(path, "column '" + c.name + "' (" + c.key + ") has type " +
                                   type.ToString() + ", expected " + expected);
      }
      indices.push_back(index);
    }
    file.column = indices.empty() ? -1 : indices.front();
    const auto metadata = reader->parquet_reader()->metadata();
    int64_t first = 0;
    for (int rg = 0; rg < metadata->num_row_groups(); ++rg) {
      const int64_t rows = metadata->RowGroup(rg)->num_rows();
      file.row_group_rows.push_back(rows);
      file.row_group_first_row.push_back(first);
      first += rows;
    }
    file.num_rows = first;
    out->total_rows_ += first;
    out->files_.push_back(std::move(file));
    out->column_index_.push_back(std::move(indices));
  }
  if (out->total_rows_ == 0) {
    return DataError(source.path, key_path + ": the source has no rows");
  }
  return out;
}

Result<std::vector<std::shared_ptr<arrow::Array>>> ColumnFiles::ReadColumns(int file,
                                                                            int row_group) {
  const auto& f = files_[static_cast<size_t>(file)];
  const std::string where = DataLocation(f.path, row_group, -1);
  if (open_file_ != file) {
    open_reader_.reset();
    open_file_ = -1;
    auto input = fs_->OpenInputFile(f.path);
    if (!input.ok()) return StorageError(f.path, input.status().message());
    try {
      auto reader = parquet::arrow::OpenFile(*input, arrow::default_memory_pool());
      if (!reader.ok()) {
        return DataError(f.path,
                         "not a readable Parquet file: " + reader.status().message());
      }
      open_reader_ = std::move(*reader);
    } catch (const std::exception& e) {
      return DataError(f.path, std::string("not a readable Parquet file: ") + e.what());
    }
    open_file_ = file;
  }
  std::vector<std::shared_ptr<arrow::Array>> out;
  for (size_t c = 0; c < columns_.size(); ++c) {
    const std::string& name = columns_[c].name;
    std::shared_ptr<arrow::ChunkedArray> chunked;
    Status st;
    try {
      st = open_reader_->RowGroup(row_group)
               ->Column(column_index_[size_t(file)][c])
               ->Read(&chunked);
    } catch (const std::exception& e) {
      st = Status::IOError(e.what());
    }
    if (!st.ok()) {
      open_reader_.reset();
      open_file_ = -1;
      return DataError(where, "cannot read column '" + name + "': " + st.message());
    }
    if (chunked->length() != f.row_group_rows[size_t(row_group)]) {
      return DataError(where, "column '" + name + "' has " +
                                  std::to_string(chunked->length()) +
                                  " rows, footer says " +
                                  std::to_string(f.row_group_rows[size_t(row_group)]));
    }
    if (chunked->num_chunks() == 0) {
      auto empty = arrow::MakeEmptyArray(chunked->type());
      if (!empty.ok()) return DataError(where, empty.status().message());
      out.push_back(*empty);
    } else if (chunked->num_chunks() == 1) {
      out.push_back(chunked->chunk(0));
    } else {
      auto combined = arrow::Concatenate(chunked->chunks());
      if (!combined.ok()) return DataError(where, combined.status().message());
      out.push_back(*combined);
    }
  }
  return out;
}

}  // namespace braid
