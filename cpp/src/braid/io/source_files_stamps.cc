// SourceFiles' guard against files that change under a run (source_files.h, "Files that
// change"): each file's underlying files are stamped (size, modification time) before its
// footer or index is read, and every read is checked against the stamp after it returns.
//
// Thread-compatible, as SourceFiles.
#include <arrow/record_batch.h>
#include <parquet/arrow/reader.h>

#include <string>
#include <vector>

#include "braid/io/file_change_internal.h"
#include "braid/io/source_files.h"
#include "braid/io/source_files_internal.h"

namespace braid {

std::vector<std::string> SourceFiles::Underlying(const std::string& path) const {
  if (format_ == SourceFormat::kMegatron) return {path + ".idx", path + ".bin"};
  return {path};
}

Status SourceFiles::Stamp(size_t index, const std::string& path) {
  if (stamps_.size() <= index) stamps_.resize(index + 1);
  std::vector<arrow::fs::FileInfo> stamp;
  for (const std::string& p : Underlying(path)) {
    auto info = fs_->GetFileInfo(p);
    if (!info.ok()) {
      return StorageError(p,
                          "cannot stat: " + internal::OneLine(info.status().message()));
    }
    stamp.push_back(std::move(*info));  // a missing file: its open then names it
  }
  stamps_[index] = std::move(stamp);
  return Status::OK();
}

Status SourceFiles::CheckUnchanged(int file) {
  const size_t index = size_t(file);
  if (index >= stamps_.size() || stamps_[index].empty() || from_copy_[index]) {
    return Status::OK();
  }
  if (!lost_[index].ok()) return lost_[index];
  for (const arrow::fs::FileInfo& was : stamps_[index]) {
    auto now = fs_->GetFileInfo(was.path());
    if (!now.ok()) {  // a storage failure: retried with the read
      return StorageError(was.path(), "cannot stat after a read: " +
                                          internal::OneLine(now.status().message()));
    }
    if (now->type() == arrow::fs::FileType::NotFound &&
        was.type() == arrow::fs::FileType::File) {
      // Deleted: what was read came through a descriptor opened before (a local file
      // stays readable while open), so it is the stamped file; a later open fails and
      // names the file.
      continue;
    }
    if (internal::SameFile(was, *now)) continue;
    Status st = internal::ChangedFileError(was, *now);
    lost_[index] = st;
    ++dead_files_;
    CloseReaders();
    return st;
  }
  return Status::OK();
}

void SourceFiles::CloseReaders() {
  open_reader_.reset();
  open_file_ = -1;
  block_reader_.reset();
  block_file_reader_.reset();
  block_rest_.clear();
  block_file_ = -1;
  lengths_reader_.reset();
  lengths_file_ = -1;
  lengths_cached_.reset();
  lengths_cached_file_ = -1;
}

}  // namespace braid
