// Calls into Python from the core's pool threads, made by the adapters the extension
// installs: user transforms' RowCallback (register_user_transform.cc) and Hugging Face
// tokenizers' HfEncoder (register_hf_tokenizer.cc).
//
// Each adapter counts its calls in flight and has a cancel flag; CancelCalls sets the
// flag and waits for those calls. Every live adapter is tracked, so that
// CancelPythonCallers (registered with atexit by register_exit.cc, before finalization
// starts) can cancel them all: a pool thread that entered Python afterwards would never
// return (CPython and PyO3 park or end threads that attach during finalization), and the
// loader that joins it would hang. Pool threads keep their Python thread states
// (thread_states.h).
//
// Thread-safe.
#pragma once

#include <nanobind/nanobind.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "braid/transform/tokenizer.h"
#include "braid/transform/user_transform.h"

namespace braid::python {

/// "TypeName: message" of the Python error in flight. REQUIRES: the GIL.
std::string ErrorText(nanobind::python_error& e);

/// Cancels an adapter's calls: later calls fail at once (they check `cancelled`), calls
/// in flight are waited for. If this thread holds the GIL (an Engine dropped by Python),
/// calls waiting for it would never finish and the loader's join would hang, so it is
/// released until they are done.
void CancelCalls(std::atomic<bool>* cancelled, const std::atomic<int64_t>* in_flight);

/// Tracks a live adapter until it is destroyed, for CancelPythonCallers.
void TrackPythonCaller(const std::shared_ptr<const RowCallback>& callback);
void TrackPythonCaller(const std::shared_ptr<const HfEncoder>& encoder);

/// Cancels every live adapter; each Cancel waits (the GIL released) for its calls in
/// flight. Before that, no thread may enter Python any more (new adapters' calls are
/// refused too), and ending pool threads leave their thread states to finalization.
/// REQUIRES: the GIL (an atexit hook).
void CancelPythonCallers();

}  // namespace braid::python
