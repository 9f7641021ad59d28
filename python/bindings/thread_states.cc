#include "thread_states.h"

#include <nanobind/nanobind.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "braid/exec/read_pool.h"

namespace nb = nanobind;

namespace braid::python {
namespace {

struct ExitState {
  std::mutex mu;
  std::condition_variable cv;  // a thread finished freeing its state
  bool exiting = false;        // GUARDED_BY(mu)
  std::thread::id exiting_thread;  // GUARDED_BY(mu) the thread that ran the exit hook
  int64_t freeing = 0;         // GUARDED_BY(mu) threads freeing their state right now
  long kept = 0;               // GUARDED_BY(mu) states kept by live threads
  // GUARDED_BY(mu) live threads that returned from a GilRelease call to Python and have
  // not made another one yet (a loop between two Engine.next() calls).
  int64_t returned = 0;
};

ExitState& Exit() {
  static auto* state = new ExitState();  // never destroyed: threads end after exit
  return *state;
}

// Whether this thread is counted in ExitState::returned; uncounted as it ends.
struct Returned {
  bool counted = false;
  ~Returned();
};

thread_local Returned returned;

Returned::~Returned() {
  if (!counted) return;
  ExitState& exit = Exit();
  std::lock_guard<std::mutex> lock(exit.mu);
  --exit.returned;
  exit.cv.notify_all();
}

// The state this thread keeps; its destructor runs as the thread ends.
struct KeptState {
  PyThreadState* tstate = nullptr;
  ~KeptState();
};

thread_local KeptState kept;

KeptState::~KeptState() {
  if (tstate == nullptr) return;
  ExitState& exit = Exit();
  {
    std::lock_guard<std::mutex> lock(exit.mu);
    --exit.kept;
    // Exiting: finalization frees every thread state (and may have already).
    if (exit.exiting || !PythonAlive()) return;
    ++exit.freeing;
  }
  // The thread's last hold: PyGILState_Release clears and deletes the state and releases
  // the GIL. A pool's destructor joins with the GIL released, so this cannot wait for the
  // thread that joins it.
  PyEval_RestoreThread(tstate);
  PyGILState_Release(PyGILState_UNLOCKED);
  tstate = nullptr;
  {
    std::lock_guard<std::mutex> lock(exit.mu);
    --exit.freeing;
  }
  exit.cv.notify_all();
}

}  // namespace

bool PythonAlive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

bool PythonExiting() {
  std::lock_guard<std::mutex> lock(Exit().mu);
  return Exit().exiting;
}

void KeepThreadState() {
  if (kept.tstate != nullptr || !ReadPool::OnPoolThread()) return;
  // A state this thread already has (made by someone else) stays as it is.
  if (PyGILState_GetThisThreadState() != nullptr) return;
  {
    std::lock_guard<std::mutex> lock(Exit().mu);
    if (Exit().exiting || !PythonAlive()) return;
    ++Exit().kept;
  }
  // Ensure makes the state, binds it to this thread and takes the GIL with one hold,
  // which is never released: later Ensure / Release pairs (gil_scoped_acquire) only take
  // and release the GIL.
  PyGILState_Ensure();
  kept.tstate = PyEval_SaveThread();
}

long KeptThreadStates() {
  std::lock_guard<std::mutex> lock(Exit().mu);
  return Exit().kept;
}

void BeginPythonExit() {
  ExitState& exit = Exit();
  {
    std::lock_guard<std::mutex> lock(exit.mu);
    exit.exiting = true;
    exit.exiting_thread = std::this_thread::get_id();
  }
  nb::gil_scoped_release release;  // the threads freeing their states need the GIL
  std::unique_lock<std::mutex> lock(exit.mu);
  exit.cv.wait(lock, [&] { return exit.freeing == 0; });
  // Threads running Python between two Braid calls (a daemon thread pulling batches)
  // get a moment to make their next call, where they park: a thread that is still
  // running Python when finalization starts is ended by CPython the next time it takes
  // the GIL, and PyTorch's tensor destructors take it (freeing a batch then aborts the
  // process). A thread that stopped calling Braid only delays the exit by this bound.
  const int64_t own = returned.counted ? 1 : 0;
  exit.cv.wait_for(lock, std::chrono::seconds(1),
                   [&] { return exit.returned - own <= 0; });
}

void InstallPoolJoinHook() {
  ReadPool::SetJoinHook([](const std::function<void()>& join) {
    if (PythonAlive() && PyGILState_Check()) {
      nb::gil_scoped_release release;  // ending pool threads take it to free their states
      join();
    } else {
      join();
    }
  });
}

GilRelease::GilRelease() : state_(PyEval_SaveThread()) {
  if (!returned.counted) return;
  ExitState& exit = Exit();
  std::lock_guard<std::mutex> lock(exit.mu);
  returned.counted = false;
  --exit.returned;
  exit.cv.notify_all();
}

GilRelease::~GilRelease() {
  bool park = false;
  {
    std::lock_guard<std::mutex> lock(Exit().mu);
    park = Exit().exiting && Exit().exiting_thread != std::this_thread::get_id();
    if (!park && !returned.counted) {
      returned.counted = true;
      ++Exit().returned;
    }
  }
  if (park) {
    std::mutex mu;
    std::condition_variable never;
    std::unique_lock<std::mutex> lock(mu);
    never.wait(lock, [] { return false; });  // until the process ends
  }
  PyEval_RestoreThread(state_);
}

}  // namespace braid::python
