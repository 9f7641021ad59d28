// braid._core: the extension module. It converts types, releases the GIL around blocking
// calls, and maps Status to exceptions; it decides nothing.
#include <nanobind/nanobind.h>

#include "status_caster.h"

namespace nb = nanobind;

namespace braid::python {

[[noreturn]] void ThrowStatus(const Status& st) {
  const ErrorDetail* detail = GetErrorDetail(st);
  // Another role of the job that did not answer, or cannot be reached: Python's own
  // TimeoutError and ConnectionError (both OSError), as Ray's transport raises them.
  if (st.IsIOError() && detail != nullptr && detail->kind() == ErrorKind::kTimeout) {
    PyErr_SetString(PyExc_TimeoutError, st.message().c_str());
    throw nb::python_error();
  }
  if (st.IsIOError() && detail != nullptr && detail->kind() == ErrorKind::kUnavailable) {
    PyErr_SetString(PyExc_ConnectionError, st.message().c_str());
    throw nb::python_error();
  }
  if (st.IsIOError()) throw StorageErrorException(st.message());
  if (st.IsInvalid() && detail != nullptr) {
    if (detail->kind() == ErrorKind::kConfig) throw ConfigErrorException(st.message());
    throw DataErrorException(st.message());
  }
  // No detail says where: the input (a file, a value inside it) could not be processed.
  // The code's name stays in the message unless it is the usual Invalid.
  throw DataErrorException(st.IsInvalid() ? st.message() : st.ToString());
}
void RegisterExceptions(nb::module_& m) {
  nb::exception<ConfigErrorException>(m, "ConfigError", PyExc_ValueError);
  nb::exception<DataErrorException>(m, "DataError", PyExc_ValueError);
  nb::exception<StorageErrorException>(m, "StorageError", PyExc_OSError);
}

}  // namespace braid::python

NB_MODULE(_core, m) {
  m.doc() = "Braid's C++ core: config, planner, source loaders, constructors, runtime.";
  braid::python::RegisterExceptions(m);
  braid::python::RegisterConfig(m);
  braid::python::RegisterRuntime(m);
  braid::python::RegisterTesting(m);
  braid::python::RegisterExit(m);
  braid::python::RegisterUserTransform(m);
  braid::python::RegisterHfTokenizer(m);
  braid::python::RegisterSource(m);
  braid::python::RegisterInspect(m);
  braid::python::RegisterPlan(m);
  braid::python::RegisterService(m);
}
