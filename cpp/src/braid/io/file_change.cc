// Telling that a source's file changed (file_change_internal.h).
#include <chrono>
#include <cstdio>
#include <string>

#include "braid/io/file_change_internal.h"

namespace braid::internal {
namespace {

const char* TypeName(arrow::fs::FileType type) {
  switch (type) {
    case arrow::fs::FileType::NotFound:
      return "missing file";
    case arrow::fs::FileType::File:
      return "file";
    case arrow::fs::FileType::Directory:
      return "directory";
    default:
      return "path of unknown type";
  }
}

// "3.2 s later", "0.004 s earlier": how far apart two modification times are.
std::string Apart(arrow::fs::TimePoint was, arrow::fs::TimePoint now) {
  const double s = std::chrono::duration<double>(now - was).count();
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f s %s", s < 0 ? -s : s,
                s < 0 ? "earlier" : "later");
  return buf;
}

}  // namespace

bool SameFile(const arrow::fs::FileInfo& was, const arrow::fs::FileInfo& now) {
  return now.type() == was.type() && now.size() == was.size() &&
         now.mtime() == was.mtime();
}

Status ChangedFileError(const arrow::fs::FileInfo& was, const arrow::fs::FileInfo& now) {
  std::string what = "changed since the source opened it (";
  if (now.type() != was.type()) {
    what +=
        std::string("was a ") + TypeName(was.type()) + ", now a " + TypeName(now.type());
  } else {
    what += "size " + std::to_string(was.size()) + " -> " + std::to_string(now.size()) +
            " bytes, modified " + Apart(was.mtime(), now.mtime());
  }
  what +=
      "); a source's files must not change while a run reads them (write new files "
      "under new names), so the file is not read further";
  return DataError(was.path(), what);
}

}  // namespace braid::internal
