// Images a record names instead of holding them (a JSON Lines image field, as LLaVA-style
// and caption sets write them): each a path to an image file, relative to a folder
// (sources[].image.folder, else the folder of the records' file) or absolute, or a
// `data:` URI holding the bytes in base64 (`data:image/jpeg;base64,...`). Loading turns
// a column of such references (a string, or a list of strings) into the column of
// encoded bytes the image-caption transform reads (binary, or a list of binary).
//
// Errors: a reference that names no file, or a `data:` URI that does not decode, is a
// bad row (returned with why; the caller follows on_error); a failed read of a file that
// exists is a storage error (IOError) for the caller to retry.
//
// Thread-safe: LoadImageRefs keeps no state; it reads the files of one call side by side
// on Arrow's I/O thread pool.
#pragma once

#include <arrow/array.h>
#include <arrow/filesystem/filesystem.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "braid/io/file_cache.h"
#include "braid/status.h"

namespace braid::internal {

/// True for the types a column of references may be read as: string, list<string>.
bool IsImageRefType(const arrow::DataType& type);

struct LoadedImages {
  std::shared_ptr<arrow::Array> bytes;  ///< binary, or list<binary> for a list of refs
  /// Rows (of `refs`) whose reference, or one of whose references, did not load: the
  /// row is null in `bytes`, and why.
  std::vector<std::pair<int64_t, std::string>> bad;
};

/// The images `refs` (IsImageRefType) names, from `fs`: a relative path under `folder`.
/// A null reference is a null row (a null in a list, a null row too). With `cache`
/// (runtime.cache, for a remote `fs`), each image file is read from its local copy, made
/// the first time it is read.
Result<LoadedImages> LoadImageRefs(arrow::fs::FileSystem* fs, const std::string& folder,
                                   const arrow::Array& refs, FileCache* cache = nullptr);

}  // namespace braid::internal
