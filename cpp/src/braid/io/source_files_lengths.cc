// SourceFiles::ReadLengths (source_files.h): each row's token count in one row group
// without its tokens, from the length column's values or from the token list's
// repetition and definition levels alone (no id decoded; docs/decisions.md 30), read
// through a small buffered stream; the last row group's counts are kept.
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
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/column_page.h>
#include <parquet/column_reader.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>

#include "braid/io/format_reader_internal.h"
#include "braid/io/read_memory.h"
#include "braid/io/source_files.h"
#include "braid/io/source_files_internal.h"

namespace braid {

using internal::ErrorAt;
using internal::OneLine;

Result<std::shared_ptr<const std::vector<RowLength>>> SourceFiles::ReadLengths(
    int file, int row_group) {
  if (lengths_cached_ != nullptr && lengths_cached_file_ == file &&
      lengths_cached_row_group_ == row_group) {
    return lengths_cached_;
  }
  return Retried<std::shared_ptr<const std::vector<RowLength>>>(
      file, row_group, [&] { return ReadLengthsOnce(file, row_group); });
}

std::string SourceFiles::WhyNull(int file, int64_t row) const {
  return format_reader_ ? format_reader_->WhyNull(file, row) : std::string();
}

Result<std::shared_ptr<const std::vector<RowLength>>> SourceFiles::ReadBlockLengths(
    int file, int row_group, int64_t first, int64_t rows) {
  if (format_reader_) {
    ARROW_ASSIGN_OR_RAISE(
        std::optional<std::vector<RowLength>> block,
        Retried<std::optional<std::vector<RowLength>>>(
            file, row_group, [&]() -> Result<std::optional<std::vector<RowLength>>> {
              return format_reader_->ReadRowLengths(file, row_group, first, rows);
            }));
    if (block.has_value()) {
      if (int64_t(block->size()) != rows) {
        return DataError(DataLocation(files_[size_t(file)].path, row_group, -1),
                         "rows " + std::to_string(first) + ".." +
                             std::to_string(first + rows) + " gave " +
                             std::to_string(block->size()) + " counts");
      }
      return std::make_shared<const std::vector<RowLength>>(std::move(*block));
    }
  }
  ARROW_ASSIGN_OR_RAISE(auto whole, ReadLengths(file, row_group));
  if (first == 0 && rows == int64_t(whole->size())) return whole;
  if (first < 0 || rows < 0 || first + rows > int64_t(whole->size())) {
    return Status::Invalid("rows ", first, "..", first + rows, " of a row group of ",
                           whole->size());
  }
  return std::make_shared<const std::vector<RowLength>>(whole->begin() + first,
                                                        whole->begin() + first + rows);
}

Result<std::shared_ptr<const std::vector<RowLength>>> SourceFiles::ReadLengthsOnce(
    int file, int row_group) {
  const File& f = files_[static_cast<size_t>(file)];
  const std::string where = DataLocation(f.path, row_group, -1);
  lengths_cached_.reset();
  if (format_reader_) {
    ARROW_ASSIGN_OR_RAISE(auto counts, format_reader_->ReadLengths(file, row_group));
    lengths_cached_ = std::make_shared<const std::vector<RowLength>>(std::move(counts));
    lengths_cached_file_ = file;
    lengths_cached_row_group_ = row_group;
    return lengths_cached_;
  }
  if (lengths_file_ != file) {
    lengths_reader_.reset();
    lengths_file_ = -1;
    lengths_io_failed_ = std::make_shared<std::atomic<bool>>(false);
    // A small buffered stream: what stays allocated is a page and the buffer, not the
    // column chunk (as ReadBlock).
    parquet::ReaderProperties props(ReadMemoryPool());
    props.enable_buffered_stream();
    props.set_buffer_size(kBlockChunkBytes);
    auto reader =
        OpenFile(f.path, size_t(file), /*download=*/true, lengths_io_failed_, &props);
    if (!reader.ok()) return ErrorAt(reader.status(), f.path, where);
    lengths_reader_ = std::move(*reader);
    lengths_file_ = file;
  }
  Result<std::vector<RowLength>> lengths;
  try {
    lengths = length_spec_ >= 0 ? LengthsFromColumn(file, row_group)
                                : LengthsFromLevels(file, row_group);
  } catch (const std::exception& e) {
    lengths = Status::IOError(e.what());
  }
  if (!lengths.ok()) {
    const Status& st = lengths.status();
    if (GetErrorDetail(st) != nullptr) return st;  // a data error that names the row
    lengths_reader_.reset();
    lengths_file_ = -1;
    const std::string what = "cannot read the token counts of column '" +
                             columns_[size_t(std::max(length_spec_, 0))].name +
                             "': " + OneLine(st.message());
    if (lengths_io_failed_->load()) return StorageError(where, what);  // retried
    return DataError(where, what);
  }
  const int64_t rows = f.row_group_rows[size_t(row_group)];
  if (static_cast<int64_t>(lengths->size()) != rows) {
    return DataError(where, "column '" +
                                columns_[size_t(std::max(length_spec_, 0))].name +
                                "' has " + std::to_string(lengths->size()) +
                                " rows, footer says " + std::to_string(rows));
  }
  lengths_cached_ = std::make_shared<const std::vector<RowLength>>(std::move(*lengths));
  lengths_cached_file_ = file;
  lengths_cached_row_group_ = row_group;
  return lengths_cached_;
}

Result<std::vector<RowLength>> SourceFiles::LengthsFromColumn(int file, int row_group) {
  const File& f = files_[static_cast<size_t>(file)];
  const ColumnSpec& spec = columns_[size_t(length_spec_)];
  std::shared_ptr<arrow::ChunkedArray> chunked;
  ARROW_RETURN_NOT_OK(lengths_reader_->RowGroup(row_group)
                          ->Column(column_index_[size_t(file)][size_t(length_spec_)])
                          ->Read(&chunked));
  std::vector<RowLength> out;
  out.reserve(size_t(chunked->length()));
  for (const auto& chunk : chunked->chunks()) {
    for (int64_t i = 0; i < chunk->length(); ++i) {
      RowLength r;
      r.null = !IntegerAt(*chunk, i, &r.tokens);
      if (r.tokens < 0) {
        return DataError(
            DataLocation(f.path, row_group, f.row_group_first_row[size_t(row_group)] +
                                                int64_t(out.size())),
            "column '" + spec.name + "' (" + spec.key + ") holds " +
                (chunk->type_id() == arrow::Type::UINT64
                     ? std::string("a value past int64")
                     : std::to_string(r.tokens)) +
                ", not a token count");
      }
      out.push_back(r);
    }
  }
  return out;
}

Result<std::vector<RowLength>> SourceFiles::LengthsFromLevels(int file, int row_group) {
  // A token list is one leaf under one repeated level. Per level: a repetition level of 0
  // starts a row; a definition level below the list's repeated level minus one is a null
  // row, equal to it an empty list, at least the repeated level an element (null below
  // the element's own level). Only the levels are decoded; the pages' values are not.
  const auto& field =
      lengths_reader_->manifest().schema_fields[size_t(column_index_[size_t(file)][0])];
  if (field.children.size() != 1 || !field.children[0].is_leaf()) {
    return Status::Invalid("not a list of integers");
  }
  const auto& level = field.children[0].level_info;
  const int leaf = field.children[0].column_index;
  auto* parquet_reader = lengths_reader_->parquet_reader();
  const parquet::ColumnDescriptor* descr =
      parquet_reader->metadata()->schema()->Column(leaf);
  const int16_t max_def = descr->max_definition_level();
  const int16_t max_rep = descr->max_repetition_level();
  if (max_rep != 1 || level.rep_level != 1) {
    return Status::Invalid("not a flat list (repetition level ", max_rep, ")");
  }
  const int16_t present = level.repeated_ancestor_def_level;  // an element is there
  const int16_t valued = level.def_level;                      // a non-null element
  const int16_t defined = static_cast<int16_t>(present - 1);   // an empty list
  std::vector<RowLength> out;
  out.reserve(size_t(files_[size_t(file)].row_group_rows[size_t(row_group)]));
  auto pages = parquet_reader->RowGroup(row_group)->GetColumnPageReader(leaf);
  parquet::LevelDecoder rep_decoder, def_decoder;
  constexpr int kLevels = 4096;
  int16_t rep[kLevels], def[kLevels];
  while (std::shared_ptr<parquet::Page> page = pages->NextPage()) {
    int n = 0;
    if (page->type() == parquet::PageType::DATA_PAGE) {
      const auto& p = static_cast<const parquet::DataPageV1&>(*page);
      n = p.num_values();
      const uint8_t* data = p.data();
      int32_t size = static_cast<int32_t>(p.size());
      const int used =
          rep_decoder.SetData(p.repetition_level_encoding(), max_rep, n, data, size);
      def_decoder.SetData(p.definition_level_encoding(), max_def, n, data + used,
                          size - used);
    } else if (page->type() == parquet::PageType::DATA_PAGE_V2) {
      const auto& p = static_cast<const parquet::DataPageV2&>(*page);
      n = p.num_values();
      const int32_t rep_bytes = p.repetition_levels_byte_length();
      const int32_t def_bytes = p.definition_levels_byte_length();
      if (rep_bytes < 0 || def_bytes < 0 || int64_t{rep_bytes} + def_bytes > p.size()) {
        return Status::Invalid("bad level lengths in a data page");
      }
      rep_decoder.SetDataV2(rep_bytes, max_rep, n, p.data());
      def_decoder.SetDataV2(def_bytes, max_def, n, p.data() + rep_bytes);
    } else {
      continue;  // a dictionary (or index) page: values only
    }
    while (n > 0) {
      const int k = std::min(n, kLevels);
      if (rep_decoder.Decode(k, rep) != k || def_decoder.Decode(k, def) != k) {
        return Status::Invalid("a data page ended before its levels");
      }
      for (int i = 0; i < k; ++i) {
        if (rep[i] == 0) {
          out.emplace_back();
          if (def[i] < defined) {
            out.back().null = true;
            continue;
          }
        } else if (out.empty()) {
          return Status::Invalid("the column chunk starts inside a row");
        }
        if (def[i] >= present) {
          ++out.back().tokens;
          if (def[i] < valued) out.back().null_values = true;
        }
      }
      n -= k;
    }
  }
  return out;
}

}  // namespace braid
