// Python thread states of the loaders' pool threads, and the interpreter's exit.
//
// A C++ thread must have a Python thread state to take the GIL. PyGILState_Ensure on a
// thread without one creates it and the matching Release frees it, which per call cost
// about half of a plain Python loop's rate for a user transform. Instead, a ReadPool
// thread (exec/read_pool.h) that calls Python keeps the state it first made until the
// thread ends (KeepThreadState); nanobind's gil_scoped_acquire then finds it and only
// takes the GIL. Threads that are not the pool's (Python's own, or a C++ caller's) are
// left as they are: their end is not the extension's to observe.
//
// A kept state is freed by its own thread as the thread ends (CPython 3.12+ unbinds a
// state from the thread that deletes it, so no other thread may), which takes the GIL:
//   - a pool's destructor joins its threads with the GIL released (the ReadPool join hook
//     installed by InstallPoolJoinHook), since a Python thread that drops an Engine holds
//     it;
//   - at interpreter exit, BeginPythonExit (the atexit hook, before finalization starts)
//     makes threads that end from then on leave their state to finalization, which frees
//     every thread state, and waits (GIL released) for those freeing theirs right then. A
//     thread that took the GIL after finalization started would never return (CPython
//     ends or parks it), and the pool that joins it would hang.
//
// Thread-safe.
#pragma once

#include <Python.h>

namespace braid::python {

/// False once the interpreter is finalizing or gone (Python objects must not be touched).
bool PythonAlive();

/// True once BeginPythonExit has run: worker threads must not enter Python any more.
bool PythonExiting();

/// On a ReadPool thread that has no Python thread state, makes one that the thread keeps
/// for its life; elsewhere, or once exiting, does nothing. REQUIRES: the calling thread
/// does not hold the GIL, and calls it inside a window that the exit's cancellation waits
/// for (a callback's in-flight count), so that no thread makes one during finalization.
void KeepThreadState();

/// The number of thread states kept by threads alive now (for tests).
long KeptThreadStates();

/// The atexit hook's part: from now on PythonExiting() is true and ending threads leave
/// their states to finalization; waits, the GIL released, for any thread freeing its
/// state right now, then (at most a second) for the threads running Python between two
/// GilRelease calls to make their next one, where they park. REQUIRES: the GIL.
void BeginPythonExit();

/// Makes every ReadPool destructor join its threads with the GIL released when the
/// destroying thread holds it (once, when the module is imported).
void InstallPoolJoinHook();

/// Releases the GIL around a blocking call, as nb::gil_scoped_release, except that a
/// thread returning once the interpreter is exiting (BeginPythonExit has run), other than
/// the exiting thread itself, never takes the GIL again: it waits forever. CPython 3.11 -
/// 3.13 end a thread that takes the GIL during finalization by unwinding it with
/// pthread_exit, which aborts the process in C++ frames (nanobind's catch (...), noexcept
/// destructors); 3.14 parks such a thread the same way. So a daemon thread blocked in
/// Engine.next() at exit sleeps until the process ends instead of crashing it.
/// REQUIRES: the GIL when constructed.
class GilRelease {
 public:
  GilRelease();
  ~GilRelease();
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace braid::python
