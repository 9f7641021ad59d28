#include "braid/io/image_refs_internal.h"

#include <arrow/api.h>
#include <arrow/io/interfaces.h>
#include <arrow/util/base64.h>
#include <arrow/util/parallel.h>

#include <filesystem>
#include <string_view>

namespace braid::internal {
namespace {

// One reference of the column: its row and what it says.
struct Ref {
  int64_t row = 0;
  std::string_view text;
  std::shared_ptr<arrow::Buffer> bytes;  // loaded
  std::string bad;                       // why it did not load
};

// The path of `ref` on the filesystem: under `folder` unless absolute, with `.` and `..`
// taken as a shell takes them (an object store has no such folders to follow).
std::string FullPath(const std::string& folder, std::string_view ref) {
  std::string path;
  if (!folder.empty() && ref.front() != '/') {
    path = folder;
    if (path.back() != '/') path += '/';
  }
  path.append(ref);
  return std::filesystem::path(path).lexically_normal().generic_string();
}

// Loads one reference into ref->bytes, or says why not in ref->bad; a storage failure
// is the error.
Status Load(arrow::fs::FileSystem* fs, FileCache* cache, const std::string& folder,
            Ref* ref) {
  constexpr std::string_view kData = "data:", kBase64 = ";base64,";
  if (ref->text.empty()) {
    ref->bad = "an empty reference";
    return Status::OK();
  }
  if (ref->text.substr(0, kData.size()) == kData) {
    const size_t at = ref->text.find(kBase64);
    const size_t comma = ref->text.find(',');
    if (at == std::string_view::npos || at + kBase64.size() != comma + 1) {
      ref->bad = "a data: URI that is not base64 (" +
                 std::string(ref->text.substr(0, std::min<size_t>(comma, 40))) + ")";
      return Status::OK();
    }
    auto decoded = arrow::util::base64_decode(ref->text.substr(at + kBase64.size()));
    if (!decoded.ok()) {
      ref->bad = "a data: URI whose base64 does not decode (" +
                 decoded.status().message() + ")";
      return Status::OK();
    }
    ref->bytes = arrow::Buffer::FromString(std::move(*decoded));
    return Status::OK();
  }
  const std::string path = FullPath(folder, ref->text);
  arrow::Result<std::shared_ptr<arrow::Buffer>> bytes =
      [&]() -> arrow::Result<std::shared_ptr<arrow::Buffer>> {
    std::shared_ptr<arrow::io::RandomAccessFile> file;
    if (cache != nullptr) {  // its local copy (a stat of the remote file keys it)
      ARROW_ASSIGN_OR_RAISE(const auto info, fs->GetFileInfo(path));
      if (info.type() != arrow::fs::FileType::File) {
        return arrow::Status::IOError("not a file");  // named below
      }
      ARROW_ASSIGN_OR_RAISE(file, cache->Open(fs, info, /*download=*/true));
    }
    if (file == nullptr) {
      ARROW_ASSIGN_OR_RAISE(file, fs->OpenInputFile(path));
    }
    ARROW_ASSIGN_OR_RAISE(const int64_t size, file->GetSize());
    return file->ReadAt(0, size);
  }();
  if (bytes.ok()) {
    ref->bytes = std::move(*bytes);
    return Status::OK();
  }
  // No such file (or a folder) is the record's fault; any other failure the storage's.
  auto info = fs->GetFileInfo(path);
  if (info.ok() && info->type() != arrow::fs::FileType::File) {
    ref->bad = (info->type() == arrow::fs::FileType::NotFound ? "no image file "
                                                              : "not a file: ") + path;
    return Status::OK();
  }
  return StorageError(path, "cannot read the image: " + bytes.status().message());
}

}  // namespace

bool IsImageRefType(const arrow::DataType& type) {
  if (type.id() == arrow::Type::STRING) return true;
  return type.id() == arrow::Type::LIST &&
         type.field(0)->type()->id() == arrow::Type::STRING;
}

Result<LoadedImages> LoadImageRefs(arrow::fs::FileSystem* fs, const std::string& folder,
                                   const arrow::Array& refs, FileCache* cache) {
  if (!IsImageRefType(*refs.type())) {
    return Status::Invalid("internal: image references of type ",
                           refs.type()->ToString());
  }
  const bool listed = refs.type_id() == arrow::Type::LIST;
  const auto* list = listed ? static_cast<const arrow::ListArray*>(&refs) : nullptr;
  const auto& strings = static_cast<const arrow::StringArray&>(
      listed ? *list->values() : refs);
  // Each row's references: [first[row], first[row + 1]) of `all`.
  std::vector<Ref> all;
  std::vector<size_t> first(size_t(refs.length()) + 1, 0);
  std::vector<bool> null_row(size_t(refs.length()), false);
  for (int64_t row = 0; row < refs.length(); ++row) {
    first[size_t(row)] = all.size();
    if (refs.IsNull(row)) {
      null_row[size_t(row)] = true;
      continue;
    }
    const int64_t begin = listed ? list->value_offset(row) : row;
    const int64_t end = listed ? list->value_offset(row + 1) : row + 1;
    for (int64_t k = begin; k < end; ++k) {
      if (strings.IsNull(k)) {
        null_row[size_t(row)] = true;
        continue;
      }
      all.push_back(Ref{row, strings.GetView(k), nullptr, {}});
    }
  }
  first.back() = all.size();
  std::vector<Status> errors(all.size());
  ARROW_RETURN_NOT_OK(arrow::internal::OptionalParallelFor(
      all.size() > 1, static_cast<int>(all.size()),
      [&](int i) {
        errors[size_t(i)] = Load(fs, cache, folder, &all[size_t(i)]);
        return Status::OK();
      },
      arrow::io::default_io_context().executor()));
  for (const Status& st : errors) ARROW_RETURN_NOT_OK(st);

  LoadedImages out;
  auto* pool = arrow::default_memory_pool();
  auto values = std::make_shared<arrow::BinaryBuilder>(pool);
  arrow::ListBuilder lists(pool, values);
  for (int64_t row = 0; row < refs.length(); ++row) {
    const size_t a = first[size_t(row)], b = first[size_t(row) + 1];
    std::string bad;
    for (size_t i = a; i < b && bad.empty(); ++i) {
      if (all[i].bad.empty()) continue;
      std::string_view shown = all[i].text.substr(0, 80);
      bad = "image '" + std::string(shown) + (shown.size() < all[i].text.size() ? "...'"
                                                                                  : "'") +
            ": " + all[i].bad;
    }
    if (!bad.empty()) out.bad.emplace_back(row, bad);
    if (!bad.empty() || null_row[size_t(row)]) {
      ARROW_RETURN_NOT_OK(listed ? lists.AppendNull() : values->AppendNull());
      continue;
    }
    if (listed) ARROW_RETURN_NOT_OK(lists.Append());
    for (size_t i = a; i < b; ++i) {
      ARROW_RETURN_NOT_OK(values->Append(all[i].bytes->data(), all[i].bytes->size()));
    }
  }
  if (listed) {
    ARROW_ASSIGN_OR_RAISE(out.bytes, lists.Finish());
  } else {
    ARROW_ASSIGN_OR_RAISE(out.bytes, values->Finish());
  }
  return out;
}

}  // namespace braid::internal
