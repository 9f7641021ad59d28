#include "braid/io/source_files.h"

#include <fnmatch.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <mutex>

#include <arrow/api.h>
#include <arrow/filesystem/api.h>
#include <arrow/filesystem/s3fs.h>
#include <arrow/io/api.h>
#include <arrow/type.h>
#include <arrow/util/future.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/properties.h>
#include <parquet/exception.h>
#include <parquet/column_page.h>
#include <parquet/column_reader.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/statistics.h>

#include "braid/io/read_memory.h"
#include "braid/util/hash_internal.h"
#include "braid/io/retry_internal.h"

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

// Glob characters in the location part (a URI's "?query" is not a glob).
bool HasGlob(const std::string& s) {
  const size_t scheme = s.find("://");
  const size_t end = scheme == std::string::npos ? std::string::npos : s.find('?');
  return s.substr(0, end).find_first_of("*?[") != std::string::npos;
}

bool IsParquetName(const std::string& p) {
  return p.size() > 8 && p.compare(p.size() - 8, 8, ".parquet") == 0;
}

// Arrow ships S3 in a library of its own (libarrow_s3, linked by braid_core); loading it
// registers the s3:// factory. The filesystem of an s3:// URI is made here with the SDK
// initialized first and finalized at process exit: an SDK never finalized, or finalized
// after its own static state is gone, crashes or hangs the exit. Arrow makes that state
// (the registry of S3 clients that finalization walks) with the first client, and a
// function registered with atexit runs before the destructors of the statics made before
// it; so the finalizer is registered once the first S3 filesystem exists. (When
// pyarrow.fs finalized S3 first, it does nothing.) Thread-safe.
Result<std::shared_ptr<arrow::fs::FileSystem>> S3FileSystemFor(const std::string& uri,
                                                               std::string* internal) {
  static std::mutex mu;
  static bool finalizer_registered = false;
  std::lock_guard<std::mutex> lock(mu);
  ARROW_RETURN_NOT_OK(arrow::fs::EnsureS3Initialized());
  ARROW_ASSIGN_OR_RAISE(auto fs, arrow::fs::FileSystemFromUriOrPath(uri, internal));
  if (!finalizer_registered) {
    std::atexit([] { (void)arrow::fs::EnsureS3Finalized(); });
    finalizer_registered = true;
  }
  return fs;
}

// The filesystem of `uri` (or a local path) and the path inside it. With `anonymous`, a
// gs:// URI's filesystem uses no credentials (public buckets, emulators); Arrow's URI
// form has no parameter for that. (config.cc refuses anonymous S3.)
Result<std::shared_ptr<arrow::fs::FileSystem>> FileSystemFor(const std::string& uri,
                                                             bool anonymous,
                                                             std::string* internal) {
  if (uri.rfind("s3://", 0) == 0) return S3FileSystemFor(uri, internal);
  if (anonymous && uri.rfind("gs://", 0) == 0) {
    ARROW_ASSIGN_OR_RAISE(auto options, arrow::fs::GcsOptions::FromUri(uri, internal));
    options.credentials = arrow::fs::GcsOptions::Anonymous().credentials;
    return arrow::fs::GcsFileSystem::Make(options);
  }
  return arrow::fs::FileSystemFromUriOrPath(uri, internal);
}

// Why the filesystem of `path` could not be made, in one line: Arrow's HDFS lists every
// place it looked for a JVM, one line each.
std::string FileSystemError(const std::string& path, const Status& st) {
  const std::string& message = st.message();
  std::string line = message.substr(0, message.find('\n'));
  if (path.rfind("hdfs://", 0) == 0 || path.rfind("viewfs://", 0) == 0) {
    line += " (hdfs:// needs Hadoop's libhdfs and a JVM at run time: JAVA_HOME, "
            "HADOOP_HOME or ARROW_LIBHDFS_DIR)";
  } else if (line.size() < message.size()) {
    line += " (...)";
  }
  return line;
}

}  // namespace

bool IsTokenListType(const arrow::DataType& type) {
  if (type.id() != arrow::Type::LIST && type.id() != arrow::Type::LARGE_LIST) {
    return false;
  }
  const auto value_id = type.field(0)->type()->id();
  return value_id == arrow::Type::INT32 || value_id == arrow::Type::INT64;
}

Status ResolveFiles(const std::string& path, const std::string& key_path,
                    std::shared_ptr<arrow::fs::FileSystem>* fs,
                    std::vector<std::string>* files, bool anonymous) {
  const std::string where = key_path + ".path";
  files->clear();
  if (!HasGlob(path)) {
    std::string internal;
    auto fs_result = FileSystemFor(path, anonymous, &internal);
    if (!fs_result.ok()) {
      return DataError(path, where + ": " + FileSystemError(path, fs_result.status()));
    }
    *fs = *fs_result;
    auto info = (*fs)->GetFileInfo(internal);
    if (!info.ok()) return StorageError(path, where + ": " + info.status().message());
    if (info->type() == arrow::fs::FileType::NotFound) {
      return DataError(path, where + ": no such file or directory");
    }
    if (info->type() == arrow::fs::FileType::File) {
      files->push_back(internal);
      return Status::OK();
    }
    arrow::fs::FileSelector sel;
    sel.base_dir = internal;
    sel.recursive = true;
    auto listing = (*fs)->GetFileInfo(sel);
    if (!listing.ok()) return StorageError(path, where + ": " + listing.status().message());
    for (const auto& f : *listing) {
      if (f.IsFile() && IsParquetName(f.path())) files->push_back(f.path());
    }
    std::sort(files->begin(), files->end());
    if (files->empty()) return DataError(path, where + ": directory holds no .parquet files");
    return Status::OK();
  }
  // A glob: list below the longest folder prefix without glob characters. A URI's query
  // (s3://b/x/*.parquet?endpoint_override=...) belongs to the filesystem, not the pattern.
  const size_t scheme = path.find("://");
  const size_t query = scheme == std::string::npos ? std::string::npos : path.find('?');
  const std::string location = path.substr(0, query);
  const std::string options = query == std::string::npos ? "" : path.substr(query);
  const size_t first_glob = location.find_first_of("*?[");
  const size_t slash = location.rfind('/', first_glob);
  const std::string base = slash == std::string::npos ? "." : location.substr(0, slash);
  const std::string rest = slash == std::string::npos ? location : location.substr(slash + 1);
  std::string base_internal;
  auto fs_result = FileSystemFor((base.empty() ? std::string("/") : base) + options,
                                 anonymous, &base_internal);
  if (!fs_result.ok()) {
    return DataError(path, where + ": " + FileSystemError(path, fs_result.status()));
  }
  *fs = *fs_result;
  arrow::fs::FileSelector sel;
  sel.base_dir = base_internal;
  sel.recursive = rest.find('/') != std::string::npos;
  sel.allow_not_found = true;
  auto listing = (*fs)->GetFileInfo(sel);
  if (!listing.ok()) return StorageError(path, where + ": " + listing.status().message());
  const std::string pattern =
      (base_internal.empty() || base_internal.back() == '/' ? base_internal
                                                             : base_internal + "/") +
      rest;
  for (const auto& f : *listing) {
    if (f.IsFile() && fnmatch(pattern.c_str(), f.path().c_str(), FNM_PATHNAME) == 0) {
      files->push_back(f.path());
    }
  }
  std::sort(files->begin(), files->end());
  if (files->empty()) return DataError(path, where + ": the pattern matches no files");
  return Status::OK();
}

std::string StorageUri(const SourceConfig& source) {
  std::vector<std::string> params;
  if (!source.storage_endpoint.empty()) {
    const std::string& e = source.storage_endpoint;
    const size_t sep = e.find("://");
    if (sep == std::string::npos) {
      params.push_back("endpoint_override=" + e);
    } else {
      params.push_back("endpoint_override=" + e.substr(sep + 3));
      params.push_back("scheme=" + e.substr(0, sep));
    }
  }
  // (Only S3 has regions; Arrow's GCS refuses unknown parameters.)
  if (!source.storage_region.empty() && source.path.rfind("s3://", 0) == 0) {
    params.push_back("region=" + source.storage_region);
  }
  if (params.empty()) return source.path;
  std::string uri = source.path;
  char sep = uri.find('?') == std::string::npos ? '?' : '&';
  for (const auto& p : params) {
    uri += sep + p;
    sep = '&';
  }
  return uri;
}

SourceFiles::~SourceFiles() = default;

ColumnSpec TokenColumnSpec(const std::string& name, const std::string& key) {
  return ColumnSpec{name, key, [](const arrow::DataType& type) {
                      return IsTokenListType(type) ? std::string()
                                                   : std::string("list<int32> or list<int64>");
                    }};
}

namespace {

template <typename ArrayType>
int64_t ValueOf(const arrow::Array& a, int64_t i) {
  return static_cast<int64_t>(static_cast<const ArrayType&>(a).Value(i));
}

}  // namespace

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

namespace {

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

namespace {

// A file that notes whether a read of the underlying file failed, so that a failure of
// the Parquet reader above it can be blamed on the storage (retry, then a storage error)
// or on the bytes (a data error, never retried).
class WatchedFile : public arrow::io::RandomAccessFile {
 public:
  WatchedFile(std::shared_ptr<arrow::io::RandomAccessFile> inner,
              std::shared_ptr<std::atomic<bool>> failed)
      : inner_(std::move(inner)), failed_(std::move(failed)) {}

  arrow::Status Close() override { return inner_->Close(); }
  bool closed() const override { return inner_->closed(); }
  arrow::Result<int64_t> Tell() const override { return inner_->Tell(); }
  arrow::Status Seek(int64_t position) override { return Note(inner_->Seek(position)); }
  arrow::Result<int64_t> GetSize() override { return Note(inner_->GetSize()); }
  bool supports_zero_copy() const override { return inner_->supports_zero_copy(); }
  const arrow::io::IOContext& io_context() const override { return inner_->io_context(); }
  arrow::Result<int64_t> Read(int64_t nbytes, void* out) override {
    return Note(inner_->Read(nbytes, out));
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> Read(int64_t nbytes) override {
    return Note(inner_->Read(nbytes));
  }
  arrow::Result<int64_t> ReadAt(int64_t position, int64_t nbytes, bool allow_short_read,
                                void* out) override {
    return Note(inner_->ReadAt(position, nbytes, allow_short_read, out));
  }
  arrow::Result<int64_t> ReadAt(int64_t position, int64_t nbytes, void* out) override {
    return Note(inner_->ReadAt(position, nbytes, out));
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(int64_t position, int64_t nbytes,
                                                       bool allow_short_read) override {
    return Note(inner_->ReadAt(position, nbytes, allow_short_read));
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(int64_t position,
                                                       int64_t nbytes) override {
    return Note(inner_->ReadAt(position, nbytes));
  }
  arrow::Future<std::shared_ptr<arrow::Buffer>> ReadAsync(
      const arrow::io::IOContext& ctx, int64_t position, int64_t nbytes,
      bool allow_short_read) override {
    return Watch(inner_->ReadAsync(ctx, position, nbytes, allow_short_read));
  }
  arrow::Future<std::shared_ptr<arrow::Buffer>> ReadAsync(const arrow::io::IOContext& ctx,
                                                          int64_t position,
                                                          int64_t nbytes) override {
    return Watch(inner_->ReadAsync(ctx, position, nbytes));
  }
  arrow::Status WillNeed(const std::vector<arrow::io::ReadRange>& ranges) override {
    return inner_->WillNeed(ranges);
  }

 private:
  arrow::Status Note(arrow::Status st) {
    if (!st.ok()) failed_->store(true);
    return st;
  }
  template <typename T>
  arrow::Result<T> Note(arrow::Result<T> r) {
    if (!r.ok()) failed_->store(true);
    return r;
  }
  arrow::Future<std::shared_ptr<arrow::Buffer>> Watch(
      arrow::Future<std::shared_ptr<arrow::Buffer>> f) {
    return f.Then(
        [](const std::shared_ptr<arrow::Buffer>& b) { return b; },
        [failed = failed_](const arrow::Status& st)
            -> arrow::Result<std::shared_ptr<arrow::Buffer>> {
          failed->store(true);
          return st;
        });
  }

  std::shared_ptr<arrow::io::RandomAccessFile> inner_;
  std::shared_ptr<std::atomic<bool>> failed_;
};

// Arrow's message on one line (Parquet's span several): Braid's errors are one line.
std::string OneLine(std::string message) {
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
    message.pop_back();
  }
  for (size_t at = message.find('\n'); at != std::string::npos;
       at = message.find('\n', at)) {
    message.replace(at, 1, " ");
  }
  return message;
}

// `st` (a storage or data error naming `path`) as the same kind of error naming `where`.
Status At(const Status& st, const std::string& path, const std::string& where) {
  std::string what = st.message();
  const std::string prefix = path + ": ";
  if (what.compare(0, prefix.size(), prefix) == 0) what.erase(0, prefix.size());
  return st.IsIOError() ? StorageError(where, what) : DataError(where, what);
}

Result<std::unique_ptr<parquet::arrow::FileReader>> OpenWatchedInput(
    std::shared_ptr<arrow::io::RandomAccessFile> input, const std::string& path,
    std::shared_ptr<std::atomic<bool>> io_failed,
    const parquet::ReaderProperties* props = nullptr);

// Opens `path` through a WatchedFile that sets `io_failed`.
Result<std::unique_ptr<parquet::arrow::FileReader>> OpenWatched(
    arrow::fs::FileSystem* fs, const std::string& path,
    std::shared_ptr<std::atomic<bool>> io_failed,
    const parquet::ReaderProperties* props = nullptr) {
  auto input = fs->OpenInputFile(path);
  if (!input.ok()) return StorageError(path, OneLine(input.status().message()));
  return OpenWatchedInput(std::move(*input), path, std::move(io_failed), props);
}

// Opens the Parquet file `input` (`path`) through a WatchedFile that sets `io_failed`,
// with `props` (null: Parquet's defaults).
Result<std::unique_ptr<parquet::arrow::FileReader>> OpenWatchedInput(
    std::shared_ptr<arrow::io::RandomAccessFile> input, const std::string& path,
    std::shared_ptr<std::atomic<bool>> io_failed,
    const parquet::ReaderProperties* props) {
  auto file = std::make_shared<WatchedFile>(std::move(input), io_failed);
  std::string what;
  try {
    // Pages and arrays both in Braid's read pool (io/read_memory.h), unless the
    // caller gives its own reader properties.
    const parquet::ReaderProperties defaults(ReadMemoryPool());
    parquet::arrow::FileReaderBuilder builder;
    Status st = builder.Open(file, props != nullptr ? *props : defaults);
    if (st.ok()) {
      builder.memory_pool(ReadMemoryPool());
      auto reader = builder.Build();
      if (reader.ok()) return std::move(*reader);
      st = reader.status();
    }
    what = st.message();
  } catch (const std::exception& e) {
    what = e.what();
  }
  if (io_failed->load()) {
    return StorageError(path, "cannot read the footer: " + OneLine(what));
  }
  return DataError(path, "not a readable Parquet file: " + OneLine(what));
}

}  // namespace

Result<std::unique_ptr<parquet::arrow::FileReader>> OpenParquet(arrow::fs::FileSystem* fs,
                                                                const std::string& path) {
  return OpenWatched(fs, path, std::make_shared<std::atomic<bool>>(false));
}

Result<std::unique_ptr<parquet::arrow::FileReader>> OpenParquet(
    std::shared_ptr<arrow::io::RandomAccessFile> input, const std::string& path) {
  return OpenWatchedInput(std::move(input), path,
                          std::make_shared<std::atomic<bool>>(false));
}

Result<std::unique_ptr<parquet::arrow::FileReader>> SourceFiles::OpenFile(
    const std::string& remote, size_t index, bool download,
    std::shared_ptr<std::atomic<bool>> io_failed,
    const parquet::ReaderProperties* props) {
  if (io_failed == nullptr) io_failed = std::make_shared<std::atomic<bool>>(false);
  if (cache_) {
    ARROW_ASSIGN_OR_RAISE(auto local, cache_->Open(fs_.get(), infos_[index], download));
    if (local) {
      return OpenWatchedInput(std::move(local), remote, std::move(io_failed), props);
    }
  }
  return OpenWatched(fs_.get(), remote, std::move(io_failed), props);
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
  ARROW_RETURN_NOT_OK(ResolveFiles(StorageUri(source), key_path, &out->fs_, &paths,
                                   source.storage_anonymous));
  if (!source.cache_dir.empty() && out->fs_->type_name() != "local") {
    out->cache_ = FileCache::Make(source.cache_dir, source.cache_max_bytes);
  }
  const bool skip = source.on_error == OnError::kSkip;
  std::string first_unreadable;  // the error of the first file skipped
  for (const auto& path : paths) {
    File file;
    file.path = path;
    const size_t index = out->files_.size();
    if (out->cache_) out->infos_.emplace_back();
    // The footer and schema; a failure here makes the file unreadable. Storage failures
    // are retried (io/retry_internal.h). A footer is read from the cached copy when
    // there is one, else remotely: copies are made when rows are read, so opening does
    // not fill (or, smaller than the source, churn) the cache before the first batch.
    int tries = 0;
    auto reader = internal::RetryStorage(
        [&]() -> Result<std::unique_ptr<parquet::arrow::FileReader>> {
          if (out->cache_) {
            auto info = out->fs_->GetFileInfo(path);
            if (!info.ok()) return StorageError(path, info.status().message());
            out->infos_[index] = *info;
          }
          return out->OpenFile(path, index, /*download=*/false);
        },
        internal::kStorageRetryDelaysMs, &tries);
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
        return footer.WithMessage(footer.message(),
                                  " (set on_error: skip to skip unreadable files)");
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
  return out;
}

template <typename T>
Result<T> SourceFiles::Retried(int file, int row_group,
                               const std::function<Result<T>()>& read) {
  const Status& lost = lost_[size_t(file)];
  if (!lost.ok()) {
    return StorageError(DataLocation(files_[size_t(file)].path, row_group, -1),
                        "not read: the file was lost earlier (" + lost.message() + ")");
  }
  int tries = 0;
  auto out = internal::RetryStorage(read, internal::kStorageRetryDelaysMs, &tries);
  if (out.ok() || !out.status().IsIOError()) return out;
  Status st = out.status();
  if (tries > 1) st = st.WithMessage(st.message(), " (", tries, " tries)");
  lost_[size_t(file)] = st;
  ++dead_files_;
  return st;
}

Result<std::vector<std::shared_ptr<arrow::Array>>> SourceFiles::ReadColumns(int file,
                                                                            int row_group) {
  return Retried<std::vector<std::shared_ptr<arrow::Array>>>(
      file, row_group, [&] { return ReadColumnsOnce(file, row_group); });
}

Result<std::vector<std::shared_ptr<arrow::Array>>> SourceFiles::ReadColumnsOnce(
    int file, int row_group) {
  const File& f = files_[static_cast<size_t>(file)];
  const std::string where = DataLocation(f.path, row_group, -1);
  if (open_file_ != file) {
    open_reader_.reset();
    open_file_ = -1;
    open_io_failed_ = std::make_shared<std::atomic<bool>>(false);
    auto reader = OpenFile(f.path, size_t(file), /*download=*/true, open_io_failed_);
    if (!reader.ok()) return At(reader.status(), f.path, where);
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
        ARROW_ASSIGN_OR_RAISE(input,
                              cache_->Open(fs_.get(), infos_[size_t(file)], true));
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
      for (const auto& a : piece) take.push_back(a->Slice(covered - at, take_end - covered));
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

Result<std::shared_ptr<const std::vector<RowLength>>> SourceFiles::ReadLengths(
    int file, int row_group) {
  if (lengths_cached_ != nullptr && lengths_cached_file_ == file &&
      lengths_cached_row_group_ == row_group) {
    return lengths_cached_;
  }
  return Retried<std::shared_ptr<const std::vector<RowLength>>>(
      file, row_group, [&] { return ReadLengthsOnce(file, row_group); });
}

Result<std::shared_ptr<const std::vector<RowLength>>> SourceFiles::ReadLengthsOnce(
    int file, int row_group) {
  const File& f = files_[static_cast<size_t>(file)];
  const std::string where = DataLocation(f.path, row_group, -1);
  lengths_cached_.reset();
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
    if (!reader.ok()) return At(reader.status(), f.path, where);
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
