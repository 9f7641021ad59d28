// The one table from braid::Status to Python exceptions.
//
//   Invalid, config detail  -> braid.ConfigError (a ValueError)
//   Invalid, data detail    -> braid.DataError   (a ValueError)
//   IOError, timeout detail -> TimeoutError (another role did not answer in time)
//   IOError, unavailable    -> ConnectionError (another role cannot be reached)
//   IOError                 -> braid.StorageError (an OSError)
//   anything else           -> braid.DataError, the code named in the message unless it
//                              is Invalid (a status without detail; the C++ core gives
//                              every error it makes a detail, so this is a status that
//                              Arrow or Parquet returned as it was)
//
// A Python exception raised in a callback (a progress or output function, a transform)
// that stopped a C++ call is raised again as it was (KeyboardInterrupt, BrokenPipeError).
#pragma once

#include <nanobind/nanobind.h>

#include <stdexcept>
#include <string>

#include "braid/cli/job.h"
#include "braid/service/source_service.h"
#include "braid/status.h"

namespace braid::python {

struct ConfigErrorException : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct DataErrorException : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct StorageErrorException : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Throws the C++ exception that nanobind translates per the table above.
[[noreturn]] void ThrowStatus(const Status& st);

inline void ThrowIfError(const Status& st) {
  if (!st.ok()) ThrowStatus(st);
}

template <typename T>
T ValueOrThrow(Result<T> result) {
  if (!result.ok()) ThrowStatus(result.status());
  return std::move(result).ValueUnsafe();
}

void RegisterExceptions(nanobind::module_& m);
void RegisterConfig(nanobind::module_& m);
void RegisterRuntime(nanobind::module_& m);
void RegisterTesting(nanobind::module_& m);
void RegisterExit(nanobind::module_& m);
void RegisterUserTransform(nanobind::module_& m);
void RegisterHfTokenizer(nanobind::module_& m);
void RegisterSource(nanobind::module_& m);
void RegisterInspect(nanobind::module_& m);
void RegisterPlan(nanobind::module_& m);
void RegisterService(nanobind::module_& m);
// A run's summary as the CLI and report.json read it (register_runtime.cc).
nanobind::dict SummaryToDict(const RunSummary& summary);
// One source's profile (source/profile.h) as report.json and `braid status` show it
// (register_runtime.cc).
nanobind::dict ProfileToDict(const SourceProfile& profile);
// What one source's piece fetches cost (service/source_service.h ServeProfile), as
// `braid status` and the Ray runtime's report.json show it (register_runtime.cc).
nanobind::dict ServeToDict(const ServeProfile& serve);
// The sources' shares each time runtime.autoscale changed them (exec/allocation.h), as
// report.json's and `braid status`'s `source_allocation`: [{step, sources: {name:
// {workers, read_ahead_bytes, active}}}] (register_runtime.cc).
nanobind::list SharesToList(const std::vector<ShareChange>& changes,
                            const std::vector<std::string>& names);
// What each source cost per span of steps (service/profile_timeline.h), as report.json's
// and `braid status`'s `source_timeline`: [{steps: (first, end), sources: {name: {cpu_s,
// wait_s, samples, tokens, bytes_read}}}] (register_runtime.cc).
nanobind::list TimelineToList(const std::vector<ProfileSpan>& spans,
                              const std::vector<std::string>& names);

}  // namespace braid::python
