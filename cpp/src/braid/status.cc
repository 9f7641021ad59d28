#include "braid/status.h"

namespace braid {

Status ConfigError(const std::string& key_path, const std::string& what) {
  return Status::Invalid(key_path, ": ", what)
      .WithDetail(std::make_shared<ErrorDetail>(ErrorKind::kConfig, key_path));
}

Status DataError(const std::string& file, const std::string& what) {
  return Status::Invalid(file, ": ", what)
      .WithDetail(std::make_shared<ErrorDetail>(ErrorKind::kData, file));
}

Status WithSkipHint(const Status& st, const std::string& what) {
  constexpr const char* kHint = " (set on_error: skip to skip ";
  if (st.message().find(kHint) != std::string::npos) return st;
  return st.WithMessage(st.message(), kHint, what, ")");
}

Status StorageError(const std::string& file, const std::string& what) {
  return Status::IOError(file, ": ", what)
      .WithDetail(std::make_shared<ErrorDetail>(ErrorKind::kData, file));
}

Status TimeoutError(const std::string& where, const std::string& what) {
  return Status::IOError(where, ": ", what)
      .WithDetail(std::make_shared<ErrorDetail>(ErrorKind::kTimeout, where));
}

Status UnavailableError(const std::string& where, const std::string& what) {
  return Status::IOError(where, ": ", what)
      .WithDetail(std::make_shared<ErrorDetail>(ErrorKind::kUnavailable, where));
}

bool IsErrorKind(const Status& st, ErrorKind kind) {
  const ErrorDetail* detail = GetErrorDetail(st);
  return detail != nullptr && detail->kind() == kind;
}

const ErrorDetail* GetErrorDetail(const Status& st) {
  const auto& detail = st.detail();
  if (detail == nullptr || std::string(detail->type_id()) != "braid::ErrorDetail") {
    return nullptr;
  }
  return static_cast<const ErrorDetail*>(detail.get());
}

std::string DataLocation(const std::string& file, int64_t row_group, int64_t row) {
  std::string out = file;
  if (row_group >= 0 || row >= 0) {
    out += " (";
    if (row_group >= 0) out += "row group " + std::to_string(row_group);
    if (row_group >= 0 && row >= 0) out += ", ";
    if (row >= 0) out += "row " + std::to_string(row);
    out += ")";
  }
  return out;
}

}  // namespace braid
