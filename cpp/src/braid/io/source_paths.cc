// A source's path to its files (source_files.h: ResolveFiles, StorageUri): the
// filesystem of a local path or URI (S3 set up and torn down once per process, anonymous
// GCS), and the sorted list of the Parquet files a file, a directory or a glob names.
//
// Thread-safe.
#include <fnmatch.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include <arrow/filesystem/api.h>
#include <arrow/filesystem/s3fs.h>

#include "braid/io/source_files.h"

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
// form has no parameter for that. (The config parser refuses anonymous S3,
// config/parse_source.cc.)
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
    if (!listing.ok()) {
      return StorageError(path, where + ": " + listing.status().message());
    }
    for (const auto& f : *listing) {
      if (f.IsFile() && IsParquetName(f.path())) files->push_back(f.path());
    }
    std::sort(files->begin(), files->end());
    if (files->empty()) {
      return DataError(path, where + ": directory holds no .parquet files");
    }
    return Status::OK();
  }
  // A glob: list below the longest folder prefix without glob characters. A URI's query
  // (s3://b/x/*.parquet?endpoint_override=...) belongs to the filesystem, not the
  // pattern.
  const size_t scheme = path.find("://");
  const size_t query = scheme == std::string::npos ? std::string::npos : path.find('?');
  const std::string location = path.substr(0, query);
  const std::string options = query == std::string::npos ? "" : path.substr(query);
  const size_t first_glob = location.find_first_of("*?[");
  const size_t slash = location.rfind('/', first_glob);
  const std::string base = slash == std::string::npos ? "." : location.substr(0, slash);
  const std::string rest =
      slash == std::string::npos ? location : location.substr(slash + 1);
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

}  // namespace braid
