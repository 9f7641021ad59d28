// SourceFiles::Open (source_files.h): every file's footer, read once (several side by
// side), with retries; the type check of each column the transform reads; per row group
// its rows, the bytes it decodes to and, with a length cache, its digest. Also the
// column specs and IntegerAt. Reads are in source_files_read.cc and
// source_files_lengths.cc, the file listing in source_paths.cc, opening a Parquet file
// in parquet_open.cc.
//
// Thread-compatible, as SourceFiles.
#include "braid/io/source_files.h"

#include <algorithm>
#include <limits>

#include <arrow/api.h>
#include <arrow/io/interfaces.h>
#include <arrow/type.h>
#include <arrow/util/parallel.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/metadata.h>
#include <parquet/statistics.h>

#include "braid/io/format_reader_internal.h"
#include "braid/io/retry_internal.h"
#include "braid/io/source_files_internal.h"
#include "braid/util/hash_internal.h"

namespace braid {
namespace {

// What identifies a row group's contents without reading it: each read leaf chunk's
// place, sizes, value count and statistics, from the footer.
uint64_t RowGroupDigest(const parquet::RowGroupMetaData& row_group,
                        const std::vector<int>& leaves) {
  std::string key = std::to_string(row_group.num_rows());
  for (int leaf : leaves) {
    const auto chunk = row_group.ColumnChunk(leaf);
    key += '|' + std::to_string(chunk->file_offset()) + ',' +
           std::to_string(chunk->data_page_offset()) + ',' +
           std::to_string(chunk->total_compressed_size()) + ',' +
           std::to_string(chunk->total_uncompressed_size()) + ',' +
           std::to_string(chunk->num_values());
    if (chunk->is_stats_set()) {
      const auto stats = chunk->statistics();
      if (stats && stats->HasMinMax()) {
        key += ',' + stats->EncodeMin() + ',' + stats->EncodeMax();
      }
      if (stats) key += ',' + std::to_string(stats->null_count());
    }
  }
  return internal::Fnv1a(key);
}

template <typename ArrayType>
int64_t ValueOf(const arrow::Array& a, int64_t i) {
  return static_cast<int64_t>(static_cast<const ArrayType&>(a).Value(i));
}

void LeafColumns(const parquet::arrow::SchemaField& field, std::vector<int>* out) {
  if (field.is_leaf()) out->push_back(field.column_index);
  for (const auto& child : field.children) LeafColumns(child, out);
}

std::string ColumnList(const arrow::Schema& schema) {
  std::string s;
  for (const auto& f : schema.fields()) s += (s.empty() ? "" : ", ") + f->name();
  return s;
}

}  // namespace

bool IsTokenListType(const arrow::DataType& type) {
  if (type.id() != arrow::Type::LIST && type.id() != arrow::Type::LARGE_LIST) {
    return false;
  }
  const auto value_id = type.field(0)->type()->id();
  return value_id == arrow::Type::INT32 || value_id == arrow::Type::INT64;
}

SourceFiles::~SourceFiles() = default;

std::shared_ptr<FileCache> SourceFiles::WholeFileCache(const SourceConfig& source) const {
  if (source.cache_dir.empty() || fs_->type_name() == "local") return nullptr;
  return FileCache::Make(source.cache_dir, source.cache_max_bytes);
}

Status SourceFiles::OpenFormat(const SourceConfig& source, const std::string& key_path,
                               const std::vector<std::string>& paths) {
  // Stamped before any index or record is read (the header's "Files that change"),
  // side by side on Arrow's I/O threads (a round trip each on a remote store); the
  // first failure in path order is the error.
  stamps_.resize(paths.size());
  std::vector<Status> stamped(paths.size());
  ARROW_RETURN_NOT_OK(arrow::internal::OptionalParallelFor(
      paths.size() > 1, static_cast<int>(paths.size()),
      [&](int i) {
        stamped[size_t(i)] = internal::RetryStorage(
            [&] { return Stamp(size_t(i), paths[size_t(i)]); },
            internal::kStorageRetryDelaysMs);
        return Status::OK();
      },
      arrow::io::default_io_context().executor()));
  for (const Status& st : stamped) ARROW_RETURN_NOT_OK(st);
  std::vector<arrow::fs::FileInfo> stamps;  // of each path's one file (not Megatron's)
  for (const auto& stamp : stamps_) stamps.push_back(stamp.front());
  internal::FormatOpen opened;
  switch (format_) {
    case SourceFormat::kMegatron: {
      // A token source: one column, the documents' ids.
      if (columns_.size() != 1 || !columns_[0].check(*arrow::list(arrow::int32())).empty()) {
        return ConfigError(key_path, "a Megatron dataset (" + source.path +
                                         ") is a token source: give no text_column, "
                                         "chat, transform or length_column");
      }
      ARROW_ASSIGN_OR_RAISE(opened, internal::OpenMegatronFiles(fs_, paths, source,
                                                                key_path, columns_));
      break;
    }
    case SourceFormat::kJsonl: {
      ARROW_ASSIGN_OR_RAISE(opened, internal::OpenJsonlFiles(fs_, WholeFileCache(source),
                                                             paths, stamps, source,
                                                             key_path, columns_));
      break;
    }
    case SourceFormat::kHfArrow: {
      ARROW_ASSIGN_OR_RAISE(opened,
                            internal::OpenHfArrowFiles(fs_, WholeFileCache(source), paths,
                                                       stamps, source, key_path, columns_));
      break;
    }
    case SourceFormat::kWebDataset: {
      ARROW_ASSIGN_OR_RAISE(opened,
                            internal::OpenWebDatasetFiles(fs_, paths, stamps, source,
                                                          key_path, columns_));
      break;
    }
    default:
      return ConfigError(key_path + ".format",
                         std::string("the ") + ToString(format_) +
                             " format is not supported yet");
  }
  format_reader_ = std::move(opened.reader);
  files_ = std::move(opened.files);
  for (size_t i = 0; i < files_.size(); ++i) {  // each format keeps one file per path
    if (i >= paths.size() || files_[i].path != paths[i]) {
      return Status::Invalid("internal: ", key_path, "'s files are not its paths");
    }
  }
  unreadable_files_ = opened.unreadable;
  column_index_.assign(files_.size(), {});
  leaf_index_.assign(files_.size(), {});
  total_rows_ = 0;
  for (const auto& f : files_) total_rows_ += f.num_rows;
  if (unreadable_files_ == static_cast<int64_t>(files_.size())) {
    return DataError(source.path, key_path + " (source '" + source.name +
                                      "'): no readable file left: the " +
                                      std::to_string(files_.size()) +
                                      " file(s) it names are all unreadable and were "
                                      "skipped (on_error: skip); the first: " +
                                      opened.first_unreadable);
  }
  if (total_rows_ == 0) return DataError(source.path, key_path + ": the source has no rows");
  lost_.assign(files_.size(), Status::OK());
  from_copy_.assign(files_.size(), false);
  return Status::OK();
}

ColumnSpec TokenColumnSpec(const std::string& name, const std::string& key) {
  return ColumnSpec{name, key, [](const arrow::DataType& type) {
                      return IsTokenListType(type)
                                 ? std::string()
                                 : std::string("list<int32> or list<int64>");
                    }};
}

bool IntegerAt(const arrow::Array& a, int64_t i, int64_t* out) {
  if (a.IsNull(i)) return false;
  switch (a.type_id()) {
    case arrow::Type::INT8: *out = ValueOf<arrow::Int8Array>(a, i); break;
    case arrow::Type::INT16: *out = ValueOf<arrow::Int16Array>(a, i); break;
    case arrow::Type::INT32: *out = ValueOf<arrow::Int32Array>(a, i); break;
    case arrow::Type::INT64: *out = ValueOf<arrow::Int64Array>(a, i); break;
    case arrow::Type::UINT8: *out = ValueOf<arrow::UInt8Array>(a, i); break;
    case arrow::Type::UINT16: *out = ValueOf<arrow::UInt16Array>(a, i); break;
    case arrow::Type::UINT32: *out = ValueOf<arrow::UInt32Array>(a, i); break;
    case arrow::Type::UINT64: {
      const uint64_t v = static_cast<const arrow::UInt64Array&>(a).Value(i);
      *out = v > uint64_t(std::numeric_limits<int64_t>::max()) ? -1 : int64_t(v);
      break;
    }
    default: *out = -1; break;
  }
  return true;
}

ColumnSpec LengthColumnSpec(const std::string& name, const std::string& key) {
  ColumnSpec spec{name, key, [](const arrow::DataType& type) {
                    const bool ok = arrow::is_integer(type.id());
                    return std::string(ok ? "" : "an integer column");
                  }};
  spec.length = true;
  return spec;
}

Result<std::unique_ptr<parquet::arrow::FileReader>> SourceFiles::OpenFile(
    const std::string& remote, size_t index, bool download,
    std::shared_ptr<std::atomic<bool>> io_failed,
    const parquet::ReaderProperties* props) {
  if (io_failed == nullptr) io_failed = std::make_shared<std::atomic<bool>>(false);
  if (cache_) {
    ARROW_ASSIGN_OR_RAISE(auto local,
                          cache_->Open(fs_.get(), stamps_[index].front(), download));
    if (local) {
      if (index < from_copy_.size()) from_copy_[index] = true;
      return internal::OpenWatchedInput(std::move(local), remote, std::move(io_failed),
                                        props);
    }
  }
  return internal::OpenWatched(fs_.get(), remote, std::move(io_failed), props);
}

Result<std::unique_ptr<SourceFiles>> SourceFiles::Open(const SourceConfig& source,
                                                       const std::string& key_path) {
  return Open(source, key_path,
              {TokenColumnSpec(source.tokens_column, key_path + ".tokens_column")});
}

Result<std::unique_ptr<SourceFiles>> SourceFiles::Open(const SourceConfig& source,
                                                       const std::string& key_path,
                                                       std::vector<ColumnSpec> columns) {
  std::unique_ptr<SourceFiles> out(new SourceFiles());
  out->columns_ = std::move(columns);
  for (size_t c = 0; c < out->columns_.size(); ++c) {
    if (out->columns_[c].length) out->length_spec_ = static_cast<int>(c);
  }
  std::vector<std::string> paths;
  SourceFormat format = source.format;
  ARROW_RETURN_NOT_OK(ResolveFormatFiles(StorageUri(source), key_path, &out->fs_, &paths,
                                         &format, source.storage_anonymous));
  out->format_ = format;
  if (format != SourceFormat::kMegatron) {
    for (const auto& c : out->columns_) {
      if (c.name.empty()) {
        return ConfigError(key_path + ".tokens_column",
                           "is required (or give text_column, chat or transform): the "
                           "source's files are " +
                               std::string(ToString(format)) + ", not a Megatron dataset");
      }
    }
  }
  if (format != SourceFormat::kParquet) {
    ARROW_RETURN_NOT_OK(out->OpenFormat(source, key_path, paths));
    return out;
  }
  if (!source.cache_dir.empty() && out->fs_->type_name() != "local") {
    out->cache_ = FileCache::Make(source.cache_dir, source.cache_max_bytes);
  }
  const bool skip = source.on_error == OnError::kSkip;
  std::string first_unreadable;  // the error of the first file skipped
  // The footers, read side by side on Arrow's I/O threads (a round trip or two each on
  // a remote store) kFootersAtOnce files at a time, so that no more footers than that
  // are held; each file is then taken in path order. A failure makes the file
  // unreadable. Storage failures are retried (io/retry_internal.h). A footer is read
  // from the cached copy when there is one, else remotely: copies are made when rows are
  // read, so opening does not fill (or, smaller than the source, churn) the cache before
  // the first batch.
  constexpr size_t kFootersAtOnce = 64;
  out->stamps_.resize(paths.size());
  std::vector<Result<std::unique_ptr<parquet::arrow::FileReader>>> footers;
  std::vector<int> footer_tries;
  for (const auto& path : paths) {
    File file;
    file.path = path;
    const size_t index = out->files_.size();
    if (index % kFootersAtOnce == 0) {
      const size_t n = std::min(kFootersAtOnce, paths.size() - index);
      footers.clear();
      footers.resize(n);  // each read below
      footer_tries.assign(n, 0);
      ARROW_RETURN_NOT_OK(arrow::internal::OptionalParallelFor(
          n > 1, static_cast<int>(n),
          [&](int k) {
            const size_t i = index + size_t(k);
            footers[size_t(k)] = internal::RetryStorage(
                [&]() -> Result<std::unique_ptr<parquet::arrow::FileReader>> {
                  // Stamped before the footer is read (the header's "Files that change").
                  ARROW_RETURN_NOT_OK(out->Stamp(i, paths[i]));
                  return out->OpenFile(paths[i], i, /*download=*/false);
                },
                internal::kStorageRetryDelaysMs, &footer_tries[size_t(k)]);
            return Status::OK();
          },
          arrow::io::default_io_context().executor()));
    }
    auto reader = std::move(footers[index % kFootersAtOnce]);
    const int tries = footer_tries[index % kFootersAtOnce];
    std::shared_ptr<arrow::Schema> schema;
    Status footer = reader.status();
    if (footer.ok()) {
      const Status schema_st = (*reader)->GetSchema(&schema);
      if (!schema_st.ok()) {
        footer = DataError(path, "cannot read the schema: " + schema_st.message());
      }
    }
    if (!footer.ok()) {
      if (tries > 1) {
        footer = footer.WithMessage(footer.message(), " (", tries, " tries)");
      }
      if (!skip) {
        return WithSkipHint(footer, "unreadable files");
      }
      // Kept in the list without row groups: the file indexes and the order stay a pure
      // function of which footers read (docs/decisions.md 22).
      const std::string prefix = path + ": ";
      file.unreadable = footer.message();
      if (file.unreadable.compare(0, prefix.size(), prefix) == 0) {
        file.unreadable.erase(0, prefix.size());
      }
      if (first_unreadable.empty()) first_unreadable = footer.message();
      ++out->unreadable_files_;
      out->files_.push_back(std::move(file));
      out->column_index_.emplace_back();
      out->leaf_index_.emplace_back();
      continue;
    }
    std::vector<int> indices;
    for (const auto& c : out->columns_) {
      const int index = schema->GetFieldIndex(c.name);
      if (index < 0) {
        // The length column is the config's promise about the files: a config error.
        if (c.length) {
          return ConfigError(c.key, "no column '" + c.name + "' in " + path +
                                        "; columns: " + ColumnList(*schema));
        }
        return DataError(path, "no column '" + c.name + "' (" + c.key +
                                   "); columns: " + ColumnList(*schema));
      }
      const auto& type = *schema->field(index)->type();
      const std::string expected = c.check(type);
      if (!expected.empty()) {
        if (c.length) {
          return ConfigError(c.key, "column '" + c.name + "' in " + path + " has type " +
                                        type.ToString() + ", expected " + expected +
                                        " (each row's token count)");
        }
        return DataError(path, "column '" + c.name + "' (" + c.key + ") has type " +
                                   type.ToString() + ", expected " + expected);
      }
      indices.push_back(index);
    }
    file.column = indices.empty() ? -1 : indices.front();
    const auto metadata = (*reader)->parquet_reader()->metadata();
    std::vector<int> leaves;  // read
    std::vector<int> sized;   // counted in row_group_bytes: not the length column's
    for (size_t c = 0; c < indices.size(); ++c) {
      const auto& field = (*reader)->manifest().schema_fields[size_t(indices[c])];
      LeafColumns(field, &leaves);
      if (!out->columns_[c].length) LeafColumns(field, &sized);
    }
    int64_t first = 0;
    for (int rg = 0; rg < metadata->num_row_groups(); ++rg) {
      const auto row_group = metadata->RowGroup(rg);
      const int64_t rows = row_group->num_rows();
      file.row_group_rows.push_back(rows);
      file.row_group_first_row.push_back(first);
      int64_t bytes = 0;
      for (int leaf : sized) {
        // What the chunk decodes to: its uncompressed size, or, for fixed-width values
        // (dictionary- or bit-packed token ids are smaller on disk), the values' width.
        const auto chunk = row_group->ColumnChunk(leaf);
        int64_t width = 0;
        switch (chunk->type()) {
          case parquet::Type::INT32:
          case parquet::Type::FLOAT: width = 4; break;
          case parquet::Type::INT64:
          case parquet::Type::DOUBLE: width = 8; break;
          default: break;
        }
        bytes += std::max(chunk->total_uncompressed_size(), width * chunk->num_values());
      }
      file.row_group_bytes.push_back(bytes);
      if (!source.length_cache_dir.empty()) {
        file.row_group_digest.push_back(RowGroupDigest(*row_group, leaves));
      }
      first += rows;
    }
    out->leaf_index_.push_back(std::move(leaves));
    file.num_rows = first;
    out->total_rows_ += first;
    out->files_.push_back(std::move(file));
    out->column_index_.push_back(std::move(indices));
  }
  if (out->unreadable_files_ == static_cast<int64_t>(out->files_.size())) {
    return DataError(source.path, key_path + " (source '" + source.name +
                                      "'): no readable file left: the " +
                                      std::to_string(out->files_.size()) +
                                      " file(s) it names are all unreadable and were "
                                      "skipped (on_error: skip); the first: " +
                                      first_unreadable);
  }
  if (out->total_rows_ == 0) {
    return DataError(source.path, key_path + ": the source has no rows");
  }
  out->lost_.assign(out->files_.size(), Status::OK());
  out->from_copy_.assign(out->files_.size(), false);
  return out;
}

}  // namespace braid
