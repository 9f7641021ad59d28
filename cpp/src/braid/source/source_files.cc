#include "braid/source/source_files.h"

#include <fnmatch.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include <arrow/api.h>
#include <arrow/filesystem/api.h>
#include <arrow/filesystem/s3fs.h>
#include <arrow/io/api.h>
#include <arrow/type.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>

namespace braid {
namespace {

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

std::string ColumnList(const arrow::Schema& schema) {
  std::string s;
  for (const auto& f : schema.fields()) s += (s.empty() ? "" : ", ") + f->name();
  return s;
}

}  // namespace

Result<std::unique_ptr<parquet::arrow::FileReader>> OpenParquet(arrow::fs::FileSystem* fs,
                                                                const std::string& path) {
  auto input = fs->OpenInputFile(path);
  if (!input.ok()) return StorageError(path, input.status().message());
  return OpenParquet(std::move(*input), path);
}

Result<std::unique_ptr<parquet::arrow::FileReader>> OpenParquet(
    std::shared_ptr<arrow::io::RandomAccessFile> input, const std::string& path) {
  try {
    auto reader = parquet::arrow::OpenFile(std::move(input), arrow::default_memory_pool());
    if (!reader.ok()) {
      return DataError(path, "not a readable Parquet file: " + reader.status().message());
    }
    return std::move(*reader);
  } catch (const std::exception& e) {
    return DataError(path, std::string("not a readable Parquet file: ") + e.what());
  }
}

Result<std::unique_ptr<parquet::arrow::FileReader>> SourceFiles::OpenFile(
    const std::string& remote, size_t index, bool download) {
  if (cache_) {
    ARROW_ASSIGN_OR_RAISE(auto local, cache_->Open(fs_.get(), infos_[index], download));
    if (local) return OpenParquet(std::move(local), remote);
  }
  return OpenParquet(fs_.get(), remote);
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
  std::vector<std::string> paths;
  ARROW_RETURN_NOT_OK(ResolveFiles(StorageUri(source), key_path, &out->fs_, &paths,
                                   source.storage_anonymous));
  if (!source.cache_dir.empty() && out->fs_->type_name() != "local") {
    out->cache_ = FileCache::Make(source.cache_dir, source.cache_max_bytes);
  }
  for (const auto& path : paths) {
    File file;
    file.path = path;
    if (out->cache_) {
      auto info = out->fs_->GetFileInfo(path);
      if (!info.ok()) return StorageError(path, info.status().message());
      out->infos_.push_back(*info);
    }
    // A footer is read from the cached copy when there is one, else remotely: copies are
    // made when rows are read, so opening does not fill (or, smaller than the source,
    // churn) the cache before the first batch.
    ARROW_ASSIGN_OR_RAISE(auto reader,
                          out->OpenFile(path, out->files_.size(), /*download=*/false));
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

Result<std::vector<std::shared_ptr<arrow::Array>>> SourceFiles::ReadColumns(int file,
                                                                            int row_group) {
  const File& f = files_[static_cast<size_t>(file)];
  const std::string where = DataLocation(f.path, row_group, -1);
  if (open_file_ != file) {
    open_reader_.reset();
    open_file_ = -1;
    ARROW_ASSIGN_OR_RAISE(open_reader_, OpenFile(f.path, size_t(file), /*download=*/true));
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

Result<std::shared_ptr<arrow::Array>> SourceFiles::ReadTokens(int file, int row_group) {
  ARROW_ASSIGN_OR_RAISE(auto columns, ReadColumns(file, row_group));
  return columns.front();
}

}  // namespace braid
