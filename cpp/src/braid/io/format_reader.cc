#include <string>
#include <utility>

#include "braid/io/format_reader_internal.h"

namespace braid::internal {

Result<std::vector<RowLength>> FormatReader::ReadLengths(int, int) {
  return Status::NotImplemented("this format has no token counts");
}

void FormatOpen::KeepUnreadable(SourceFiles::File file, const Status& error,
                                const std::string& path) {
  const std::string prefix = path + ": ";
  file.unreadable = error.message();
  if (!path.empty() && file.unreadable.compare(0, prefix.size(), prefix) == 0) {
    file.unreadable.erase(0, prefix.size());
  }
  if (first_unreadable.empty()) first_unreadable = error.message();
  ++unreadable;
  files.push_back(std::move(file));
}

Status RefuseUnreadable(const Status& error, int tries) {
  Status st = error;
  if (tries > 1) st = st.WithMessage(st.message(), " (", tries, " tries)");
  return st.WithMessage(st.message(), " (set on_error: skip to skip unreadable files)");
}

}  // namespace braid::internal
