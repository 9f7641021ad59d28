// The interpreter's exit and the loaders' pool threads: the ReadPool join hook
// (thread_states.h) and `_cancel_python_calls`, registered with atexit, which cancels the
// Python calls of every live adapter before finalization starts (python_calls.h).
#include <nanobind/nanobind.h>

#include "python_calls.h"
#include "status_caster.h"
#include "thread_states.h"

namespace nb = nanobind;

namespace braid::python {

void RegisterExit(nb::module_& m) {
  InstallPoolJoinHook();
  m.def("_cancel_python_calls", &CancelPythonCallers,
        "Cancels the Python calls of every loader's worker threads (user transforms, "
        "Hugging Face tokenizers) and waits for those in flight; registered with atexit.");
  nb::module_::import_("atexit").attr("register")(m.attr("_cancel_python_calls"));
}

}  // namespace braid::python
