// A source's path to its files (source_files.h: ResolveFiles, StorageUri): the
// filesystem of a local path or URI (S3 set up and torn down once per process, anonymous
// GCS), and the sorted list of the files a file, a directory or a glob names: Parquet
// files, or those of another format (io/formats.h), Megatron datasets by their prefix.
//
// Thread-safe.
#include <fnmatch.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include <arrow/filesystem/api.h>
#include <arrow/filesystem/s3fs.h>

#include "braid/io/formats.h"
#include "braid/io/source_files.h"

namespace braid {
namespace {

// Glob characters in the location part (a URI's "?query" is not a glob).
bool HasGlob(const std::string& s) {
  const size_t scheme = s.find("://");
  const size_t end = scheme == std::string::npos ? std::string::npos : s.find('?');
  return s.substr(0, end).find_first_of("*?[") != std::string::npos;
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

// How long the GCS client retries one request that fails transiently, unless the URI
// sets `retry_limit_seconds`. Its own default is 15 minutes, so a store that stays down
// would hold each of Braid's 4 tries of a read (io/retry_internal.h) that long; with
// this, such a read fails within a minute, as on S3 (docs/sources.md, "Unreadable
// files").
constexpr double kGcsRetryLimitSeconds = 5;

// The filesystem of `uri` (or a local path) and the path inside it. With `anonymous`, a
// gs:// URI's filesystem uses no credentials (public buckets, emulators); Arrow's URI
// form has no parameter for that. (The config parser refuses anonymous S3,
// config/parse_source.cc.)
Result<std::shared_ptr<arrow::fs::FileSystem>> FileSystemFor(const std::string& uri,
                                                             bool anonymous,
                                                             std::string* internal) {
  if (uri.rfind("s3://", 0) == 0) return S3FileSystemFor(uri, internal);
  if (uri.rfind("gs://", 0) == 0) {
    ARROW_ASSIGN_OR_RAISE(auto options, arrow::fs::GcsOptions::FromUri(uri, internal));
    if (anonymous) options.credentials = arrow::fs::GcsOptions::Anonymous().credentials;
    if (!options.retry_limit_seconds) options.retry_limit_seconds = kGcsRetryLimitSeconds;
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

namespace {

// What a path lists: one file, the files below a directory, or a glob's matches (all of
// them, sorted, whatever their names). `kind` says which.
enum class Listed { kFile, kDirectory, kGlob };

Status ListPath(const std::string& path, const std::string& where, bool anonymous,
                std::shared_ptr<arrow::fs::FileSystem>* fs, std::vector<std::string>* files,
                Listed* kind) {
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
      *kind = Listed::kFile;
      files->push_back(internal);
      return Status::OK();
    }
    *kind = Listed::kDirectory;
    arrow::fs::FileSelector sel;
    sel.base_dir = internal;
    sel.recursive = true;
    auto listing = (*fs)->GetFileInfo(sel);
    if (!listing.ok()) {
      return StorageError(path, where + ": " + listing.status().message());
    }
    for (const auto& f : *listing) {
      if (f.IsFile()) files->push_back(f.path());
    }
    std::sort(files->begin(), files->end());
    return Status::OK();
  }
  // A glob: list below the longest folder prefix without glob characters. A URI's query
  // (s3://b/x/*.parquet?endpoint_override=...) belongs to the filesystem, not the
  // pattern.
  *kind = Listed::kGlob;
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

std::string StripMegatronSuffix(const std::string& p) {
  for (const char* s : {".idx", ".bin"}) {
    const size_t n = std::char_traits<char>::length(s);
    if (p.size() > n && p.compare(p.size() - n, n, s) == 0) return p.substr(0, p.size() - n);
  }
  return p;
}

// The prefixes of the Megatron datasets among `files` (an .idx or a .bin names its
// dataset), sorted and each once.
std::vector<std::string> MegatronPrefixes(const std::vector<std::string>& files,
                                          bool idx_only) {
  std::vector<std::string> out;
  for (const auto& f : files) {
    const bool idx = f.size() > 4 && f.compare(f.size() - 4, 4, ".idx") == 0;
    const bool bin = f.size() > 4 && f.compare(f.size() - 4, 4, ".bin") == 0;
    if (idx || (bin && !idx_only)) out.push_back(f.substr(0, f.size() - 4));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// A save_to_disk DatasetDict below a directory (its dataset_dict.json) holds its splits
// in folders of their own: read as one source, a test split would be trained on. An
// error naming the splits' folders; a glob of the files reads them together on purpose.
Status NotADatasetDict(const std::string& path, const std::string& where,
                       const std::vector<std::string>& listed) {
  auto base = [](const std::string& p) { return p.substr(p.rfind('/') + 1); };
  auto folder = [](const std::string& p) {
    const size_t slash = p.rfind('/');
    return slash == std::string::npos ? std::string() : p.substr(0, slash);
  };
  auto is_dict = [&](const std::string& f) { return base(f) == "dataset_dict.json"; };
  if (std::none_of(listed.begin(), listed.end(), is_dict)) return Status::OK();
  std::vector<std::string> splits;
  for (const auto& f : listed) {
    if (HasFormatSuffix(f, SourceFormat::kHfArrow)) splits.push_back(base(folder(f)));
  }
  std::sort(splits.begin(), splits.end());
  splits.erase(std::unique(splits.begin(), splits.end()), splits.end());
  std::string shown = path;
  while (shown.size() > 1 && shown.back() == '/') shown.pop_back();
  std::string names;
  for (const auto& split : splits) {
    names += (names.empty() ? "" : ", ") + shown + "/" + split;
  }
  return DataError(path, where + ": a save_to_disk DatasetDict (dataset_dict.json), "
                                 "whose splits would be read as one source: name one "
                                 "split's folder (" + names + "), or a glob of the "
                                 "files to read them together");
}

}  // namespace

Status ResolveFiles(const std::string& path, const std::string& key_path,
                    std::shared_ptr<arrow::fs::FileSystem>* fs,
                    std::vector<std::string>* files, bool anonymous) {
  SourceFormat format = SourceFormat::kParquet;
  return ResolveFormatFiles(path, key_path, fs, files, &format, anonymous);
}

Status ResolveFormatFiles(const std::string& path, const std::string& key_path,
                          std::shared_ptr<arrow::fs::FileSystem>* fs,
                          std::vector<std::string>* files, SourceFormat* format,
                          bool anonymous) {
  const std::string where = key_path + ".path";
  if (*format == SourceFormat::kAuto) *format = DetectFormatFromName(path);
  std::vector<std::string> listed;
  Listed kind = Listed::kFile;
  if ((*format == SourceFormat::kMegatron || *format == SourceFormat::kAuto) &&
      !HasGlob(path)) {
    // A prefix, or either file of the pair: the dataset's prefix, if its .idx exists.
    // (A URI's query, the storage options, follows the name.)
    const size_t query =
        path.find("://") == std::string::npos ? std::string::npos : path.find('?');
    const std::string prefix = StripMegatronSuffix(path.substr(0, query));
    const std::string options = query == std::string::npos ? "" : path.substr(query);
    std::string internal;
    auto fs_result = FileSystemFor(prefix + ".idx" + options, anonymous, &internal);
    if (!fs_result.ok()) {
      return DataError(path, where + ": " + FileSystemError(path, fs_result.status()));
    }
    auto info = (*fs_result)->GetFileInfo(internal);
    if (!info.ok()) return StorageError(path, where + ": " + info.status().message());
    bool dataset = info->type() == arrow::fs::FileType::File;
    if (dataset && *format == SourceFormat::kAuto) {
      // Detected only where the path itself is no file or directory (a prefix).
      const std::string self = internal.substr(0, internal.size() - 4);
      auto own = (*fs_result)->GetFileInfo(self);
      dataset = own.ok() && own->type() == arrow::fs::FileType::NotFound;
    }
    if (dataset) {
      *fs = *fs_result;
      *format = SourceFormat::kMegatron;
      files->assign(1, internal.substr(0, internal.size() - 4));
      return Status::OK();
    }
    // Not a dataset's prefix: a directory of datasets.
  }
  Status st = ListPath(path, where, anonymous, fs, &listed, &kind);
  if (!st.ok()) {
    if (*format == SourceFormat::kMegatron && st.message().find("no such file") !=
                                                  std::string::npos) {
      return DataError(path, where + ": no Megatron dataset there (no .idx file of "
                                     "that prefix, nor a directory of .idx files)");
    }
    return st;
  }
  if (*format == SourceFormat::kAuto) {
    // A directory or a glob: the format of the names found, Parquet first (a directory
    // of Parquet files may hold other files beside them).
    *format = SourceFormat::kParquet;
    if (kind != Listed::kFile) {
      auto any = [&](SourceFormat f) {
        return std::any_of(listed.begin(), listed.end(),
                           [&](const std::string& n) { return HasFormatSuffix(n, f); });
      };
      if (!any(SourceFormat::kParquet)) {
        // (An Energon-prepared WebDataset folder holds a .tar.idx beside each shard:
        // tar before Megatron. A save_to_disk folder holds state.json and
        // dataset_info.json beside its .arrow files: Arrow before JSON Lines.)
        for (SourceFormat f : {SourceFormat::kWebDataset, SourceFormat::kMegatron,
                               SourceFormat::kHfArrow, SourceFormat::kJsonl}) {
          if (any(f)) {
            *format = f;
            break;
          }
        }
      }
    }
  }
  files->clear();
  if (*format == SourceFormat::kMegatron) {
    *files = MegatronPrefixes(listed, /*idx_only=*/kind == Listed::kDirectory);
    if (files->empty()) {
      return DataError(path, where + ": holds no Megatron dataset (.idx and .bin)");
    }
    return Status::OK();
  }
  if (kind != Listed::kDirectory) {  // a file, or a glob's matches: as named
    *files = std::move(listed);
    return Status::OK();
  }
  if (*format == SourceFormat::kHfArrow) {
    ARROW_RETURN_NOT_OK(NotADatasetDict(path, where, listed));
  }
  for (auto& f : listed) {
    if (HasFormatSuffix(f, *format)) files->push_back(std::move(f));
  }
  if (files->empty()) {
    if (*format == SourceFormat::kParquet) {
      return DataError(path, where + ": directory holds no .parquet files (nor " +
                                 FormatSuffixList(SourceFormat::kMegatron) + ", " +
                                 FormatSuffixList(SourceFormat::kJsonl) + ", " +
                                 FormatSuffixList(SourceFormat::kHfArrow) + " or " +
                                 FormatSuffixList(SourceFormat::kWebDataset) +
                                 " files)");
    }
    return DataError(path, where + ": directory holds no " +
                               FormatSuffixList(*format) + " files");
  }
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
