// Error detail for Braid's arrow::Status values.
//
// Braid reports every failure as an arrow::Status (see STYLE: no new codes). The code says
// what the caller should do (Invalid: fix the config or the data; IOError: storage), and an
// ErrorDetail says which side is at fault and where: a config key path ("sources[1].weight")
// or a data location (file, row group, row). The Python binding maps the kind to the CLI's
// exit code (2 for config, 3 for data) and to the exception type.
//
// Thread-safe: all functions are pure.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <arrow/result.h>
#include <arrow/status.h>

namespace braid {

using arrow::Status;
template <typename T>
using Result = arrow::Result<T>;

/// Which side of the job an error blames.
enum class ErrorKind : int {
  kConfig = 0,  ///< the config or the command line: `where` is a key path
  kData = 1,    ///< a data file or sample: `where` is a file path (plus row group/row)
  /// Another role of the job did not answer in time (runtime.timeout_s): `where` names
  /// it (a role, a step). An IOError: the caller may try again.
  kTimeout = 2,
  /// Another role of the job is unreachable (its process died or restarts): `where`
  /// names it. An IOError: the caller may try again, or ask a standby.
  kUnavailable = 3,
};

/// Structured location attached to a Status with Status::WithDetail.
class ErrorDetail : public arrow::StatusDetail {
 public:
  ErrorDetail(ErrorKind kind, std::string where) : kind_(kind), where_(std::move(where)) {}

  const char* type_id() const override { return "braid::ErrorDetail"; }
  std::string ToString() const override { return where_; }

  ErrorKind kind() const { return kind_; }
  const std::string& where() const { return where_; }

 private:
  ErrorKind kind_;
  std::string where_;
};

/// Invalid status for a bad config value: message "KEY_PATH: what".
Status ConfigError(const std::string& key_path, const std::string& what);

/// Invalid status for bad data: message "FILE: what".
Status DataError(const std::string& file, const std::string& what);

/// IOError status for an unreadable file: message "FILE: what".
Status StorageError(const std::string& file, const std::string& what);

/// IOError status for a role that did not answer within `timeout_s`: "WHERE: what".
Status TimeoutError(const std::string& where, const std::string& what);

/// IOError status for a role that cannot be reached now: "WHERE: what".
Status UnavailableError(const std::string& where, const std::string& what);

/// Whether `st` carries `kind`.
bool IsErrorKind(const Status& st, ErrorKind kind);

/// The ErrorDetail of `st`, or nullptr.
const ErrorDetail* GetErrorDetail(const Status& st);

/// `st` with the hint that says what `on_error: skip` would pass over: " (set on_error:
/// skip to skip WHAT)" ("unreadable files", "such rows"), unless it says one already (an
/// error passed up through several layers gives one hint, the innermost's).
Status WithSkipHint(const Status& st, const std::string& what);

/// Where in a Parquet file: "FILE (row group G, row R)"; omitted parts are -1.
std::string DataLocation(const std::string& file, int64_t row_group, int64_t row);

}  // namespace braid
