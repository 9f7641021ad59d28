// SourceFiles' row-group reads (source_files.h): ReadColumns, the read columns of a whole
// row group, one chunk each, and ReadBlock, a block of rows of one row group streamed in
// chunks of about kBlockChunkBytes from a reader that stays open. Storage failures are
// retried (Retried, source_files_internal.h) and lose the file once retries run out.
//
// Thread-compatible, as SourceFiles.
#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <arrow/api.h>
#include <arrow/io/api.h>
#include <parquet/arrow/reader.h>
#include <parquet/properties.h>

#include "braid/io/format_reader_internal.h"
#include "braid/io/read_memory.h"
#include "braid/io/source_files.h"
#include "braid/io/source_files_internal.h"

namespace braid {

using internal::ErrorAt;
using internal::OneLine;

Result<std::vector<std::shared_ptr<arrow::Array>>> SourceFiles::ReadColumns(
    int file, int row_group) {
  return Retried<std::vector<std::shared_ptr<arrow::Array>>>(
      file, row_group, [&] { return ReadColumnsOnce(file, row_group); });
}

Result<std::vector<std::vector<std::shared_ptr<arrow::Array>>>> SourceFiles::ReadChunks(
    int file, int row_group) {
  using Chunk = std::vector<std::shared_ptr<arrow::Array>>;
  return Retried<std::vector<Chunk>>(file, row_group, [&]() -> Result<std::vector<Chunk>> {
    if (format_reader_) return format_reader_->ReadChunks(file, row_group);
    ARROW_ASSIGN_OR_RAISE(auto columns, ReadColumnsOnce(file, row_group));
    return std::vector<Chunk>{std::move(columns)};
  });
}

Result<std::vector<std::shared_ptr<arrow::Array>>> SourceFiles::ReadColumnsOnce(
    int file, int row_group) {
  if (format_reader_) return format_reader_->ReadColumns(file, row_group);
  const File& f = files_[static_cast<size_t>(file)];
  const std::string where = DataLocation(f.path, row_group, -1);
  if (open_file_ != file) {
    open_reader_.reset();
    open_file_ = -1;
    open_io_failed_ = std::make_shared<std::atomic<bool>>(false);
    auto reader = OpenFile(f.path, size_t(file), /*download=*/true, open_io_failed_);
    if (!reader.ok()) return ErrorAt(reader.status(), f.path, where);
    open_reader_ = std::move(*reader);
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
      const std::string what =
          "cannot read column '" + name + "': " + OneLine(st.message());
      if (open_io_failed_->load()) return StorageError(where, what);  // retried
      return DataError(where, what);
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

Result<std::vector<std::vector<std::shared_ptr<arrow::Array>>>> SourceFiles::ReadBlock(
    int file, int row_group, int64_t block_rows, int64_t block) {
  using Chunk = std::vector<std::shared_ptr<arrow::Array>>;
  const File& f = files_[static_cast<size_t>(file)];
  const int64_t rg_rows = f.row_group_rows[size_t(row_group)];
  const int64_t first = block * block_rows;
  const int64_t end = std::min(rg_rows, first + block_rows);
  // Retried and checked against the file's stamp as every read (source_files.h).
  return Retried<std::vector<Chunk>>(file, row_group, [&]() -> Result<std::vector<Chunk>> {
    if (format_reader_) return format_reader_->ReadRows(file, row_group, first, end - first);
    return ReadParquetBlock(file, row_group, block_rows, block);
  });
}

Result<std::vector<std::vector<std::shared_ptr<arrow::Array>>>>
SourceFiles::ReadParquetBlock(int file, int row_group, int64_t block_rows,
                              int64_t block) {
  using Chunk = std::vector<std::shared_ptr<arrow::Array>>;
  const File& f = files_[static_cast<size_t>(file)];
  const int64_t rg_rows = f.row_group_rows[size_t(row_group)];
  const int64_t first = block * block_rows;
  const int64_t end = std::min(rg_rows, first + block_rows);
  const std::string where = DataLocation(f.path, row_group, -1);
  auto fail = [&](const std::string& what) {
    block_reader_.reset();
    block_file_reader_.reset();
    block_rest_.clear();
    block_file_ = -1;
    return DataError(where, "cannot read rows " + std::to_string(first) + ".." +
                                std::to_string(end) + ": " + what);
  };
  try {
    const int64_t behind = block_rest_.empty() ? block_next_ : block_rest_first_;
    if (block_file_ != file || block_row_group_ != row_group || behind > first) {
      block_reader_.reset();
      block_file_reader_.reset();
      block_rest_.clear();
      block_file_ = -1;
      // A small read buffer, no pre-buffering and small batches: what stays allocated
      // follows the chunk, not the column chunk or the block.
      const int64_t bytes = std::max<int64_t>(1, f.row_group_bytes[size_t(row_group)]);
      const int64_t chunk_rows = std::max<int64_t>(
          1, static_cast<int64_t>(__int128{rg_rows} * kBlockChunkBytes / bytes));
      parquet::ReaderProperties props(ReadMemoryPool());
      props.enable_buffered_stream();
      props.set_buffer_size(kBlockChunkBytes);
      parquet::ArrowReaderProperties arrow_props;
      arrow_props.set_pre_buffer(false);
      arrow_props.set_batch_size(chunk_rows);
      std::shared_ptr<arrow::io::RandomAccessFile> input;  // the cached copy, pinned
      if (cache_) {
        ARROW_ASSIGN_OR_RAISE(
            input, cache_->Open(fs_.get(), stamps_[size_t(file)].front(), true));
        if (input != nullptr) from_copy_[size_t(file)] = true;
      }
      if (input == nullptr) {
        auto remote = fs_->OpenInputFile(f.path);
        if (!remote.ok()) return StorageError(f.path, remote.status().message());
        input = std::move(*remote);
      }
      parquet::arrow::FileReaderBuilder builder;
      Status st = builder.Open(input, props);
      if (!st.ok()) return fail(st.message());
      builder.properties(arrow_props);
      builder.memory_pool(ReadMemoryPool());
      auto built = builder.Build();
      if (!built.ok()) return fail(built.status().message());
      block_file_reader_ = std::move(*built);
      auto reader = block_file_reader_->GetRecordBatchReader({row_group},
                                                             leaf_index_[size_t(file)]);
      if (!reader.ok()) return fail(reader.status().message());
      block_reader_ = std::move(*reader);
      block_file_ = file;
      block_row_group_ = row_group;
      block_next_ = 0;
    }
    std::vector<Chunk> out;
    int64_t covered = first;
    while (covered < end) {
      // The next piece: the rest of the last chunk, or a new chunk.
      Chunk piece;
      int64_t at = 0;
      if (!block_rest_.empty()) {
        piece = std::move(block_rest_);
        block_rest_.clear();
        at = block_rest_first_;
      } else {
        std::shared_ptr<arrow::RecordBatch> batch;
        Status st = block_reader_->ReadNext(&batch);
        if (!st.ok()) return fail(st.message());
        if (batch == nullptr) return fail("the row group ended early");
        for (const auto& c : columns_) {
          auto column = batch->GetColumnByName(c.name);
          if (column == nullptr) return fail("no column '" + c.name + "' in the batch");
          piece.push_back(std::move(column));
        }
        at = block_next_;
        block_next_ += batch->num_rows();
      }
      const int64_t piece_end = at + piece.front()->length();
      if (piece_end <= first) continue;  // before the block: skipped
      const int64_t take_end = std::min(piece_end, end);
      Chunk take;
      for (const auto& a : piece) {
        take.push_back(a->Slice(covered - at, take_end - covered));
      }
      out.push_back(std::move(take));
      if (piece_end > end) {  // the rest belongs to the next block
        for (const auto& a : piece) block_rest_.push_back(a->Slice(end - at));
        block_rest_first_ = end;
      }
      covered = take_end;
    }
    return out;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

Result<std::shared_ptr<arrow::Array>> SourceFiles::ReadTokens(int file, int row_group) {
  ARROW_ASSIGN_OR_RAISE(auto columns, ReadColumns(file, row_group));
  return columns.front();
}

}  // namespace braid
