// The Python side of user transforms (`sources[].transform.python`,
// transform/user_transform.h): a RowCallback that converts a chunk of rows to Python
// values and calls the user's function (once per row, or once for the chunk when
// `batched`) holding the GIL only around that, and reads its results back as tokens and
// a loss mask. RegisterUserTransform installs it as the core's factory when the module is
// imported. Cancellation and exit: python_calls.h.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "braid/transform/user_transform.h"
#include "python_calls.h"
#include "status_caster.h"
#include "thread_states.h"

namespace nb = nanobind;

namespace braid::python {
namespace {

// A row value as a Python object. REQUIRES: the GIL.
nb::object ToPython(const RowValue& v) {
  switch (v.kind) {
    case RowValue::Kind::kNull:
      return nb::none();
    case RowValue::Kind::kBool:
      return nb::bool_(v.boolean);
    case RowValue::Kind::kInt:
      return nb::int_(v.integer);
    case RowValue::Kind::kFloat:
      return nb::float_(v.real);
    case RowValue::Kind::kString: {
      PyObject* s = PyUnicode_DecodeUTF8(v.bytes.data(), Py_ssize_t(v.bytes.size()),
                                         "strict");
      if (s == nullptr) throw nb::python_error();
      return nb::steal(s);
    }
    case RowValue::Kind::kBytes:
      return nb::bytes(v.bytes.data(), v.bytes.size());
    case RowValue::Kind::kList: {
      nb::list list;
      for (const RowValue& item : v.items) list.append(ToPython(item));
      return list;
    }
    case RowValue::Kind::kStruct: {
      nb::dict dict;
      for (size_t f = 0; f < v.items.size(); ++f) {
        dict[nb::str(v.field_names[f].data(), v.field_names[f].size())] =
            ToPython(v.items[f]);
      }
      return dict;
    }
  }
  return nb::none();
}

// Reads the integers of a 1-d buffer (NumPy array, array.array) into `out`; false if
// `obj` offers no such buffer. REQUIRES: the GIL.
bool ReadIntBuffer(PyObject* obj, std::vector<int64_t>* out) {
  Py_buffer view;
  if (PyObject_GetBuffer(obj, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_Clear();
    return false;
  }
  const char* format = view.format != nullptr ? view.format : "B";
  while (*format == '@' || *format == '=' || *format == '<' || *format == '>' ||
         *format == '!') {
    ++format;
  }
  const char code = format[0];
  const bool known = format[1] == '\0' && std::string_view("bBhHiIlLqQ?").find(code) !=
                                             std::string_view::npos;
  if (!known || view.ndim != 1) {
    PyBuffer_Release(&view);
    return false;
  }
  const bool is_signed = code == 'b' || code == 'h' || code == 'i' || code == 'l' ||
                         code == 'q';
  const Py_ssize_t n = view.shape != nullptr ? view.shape[0] : view.len / view.itemsize;
  out->resize(size_t(n));
  const auto* p = static_cast<const uint8_t*>(view.buf);
  for (Py_ssize_t k = 0; k < n; ++k, p += view.itemsize) {
    int64_t v = 0;
    switch (view.itemsize) {
      case 1:
        v = is_signed ? int64_t(*reinterpret_cast<const int8_t*>(p)) : int64_t(*p);
        break;
      case 2:
        v = is_signed ? int64_t(*reinterpret_cast<const int16_t*>(p))
                      : int64_t(*reinterpret_cast<const uint16_t*>(p));
        break;
      case 4:
        v = is_signed ? int64_t(*reinterpret_cast<const int32_t*>(p))
                      : int64_t(*reinterpret_cast<const uint32_t*>(p));
        break;
      default: {
        const uint64_t u = *reinterpret_cast<const uint64_t*>(p);
        v = (!is_signed && u > uint64_t(std::numeric_limits<int64_t>::max()))
                ? std::numeric_limits<int64_t>::max()
                : static_cast<int64_t>(u);
      }
    }
    (*out)[size_t(k)] = v;
  }
  PyBuffer_Release(&view);
  return true;
}

// The integers of a Python list or tuple. REQUIRES: the GIL.
Status ReadIntItems(PyObject** items, Py_ssize_t n, const char* what,
                    std::vector<int64_t>* out) {
  out->resize(size_t(n));
  for (Py_ssize_t k = 0; k < n; ++k) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(items[k], &overflow);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return Status::Invalid(what, "[", k, "] is not an int (",
                             Py_TYPE(items[k])->tp_name, ")");
    }
    (*out)[size_t(k)] = overflow > 0   ? std::numeric_limits<int64_t>::max()
                        : overflow < 0 ? std::numeric_limits<int64_t>::min()
                                       : int64_t(v);
  }
  return Status::OK();
}

// The integers of a list, tuple, array or other iterable of ints. REQUIRES: the GIL.
Status ReadInts(nb::handle obj, const char* what, std::vector<int64_t>* out) {
  PyObject* p = obj.ptr();
  // Lists first: most functions return one, and asking a list for a buffer raises.
  if (PyList_Check(p) || PyTuple_Check(p)) {
    return ReadIntItems(PySequence_Fast_ITEMS(p), PySequence_Fast_GET_SIZE(p), what, out);
  }
  if (PyUnicode_Check(p) || PyBytes_Check(p) || PyDict_Check(p)) {
    return Status::Invalid(what, " must be a list or array of ints, not ",
                           Py_TYPE(p)->tp_name);
  }
  if (ReadIntBuffer(p, out)) return Status::OK();
  PyObject* seq = PySequence_Fast(p, "");
  if (seq == nullptr) {
    PyErr_Clear();
    return Status::Invalid(what, " must be a list or array of ints, not ",
                           Py_TYPE(p)->tp_name);
  }
  nb::object keep = nb::steal(seq);
  return ReadIntItems(PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq), what,
                      out);
}

// The keys of a dict result, interned once. REQUIRES: the GIL.
PyObject* TokensKey() {
  static PyObject* key = PyUnicode_InternFromString("tokens");  // never freed
  return key;
}
PyObject* LossMaskKey() {
  static PyObject* key = PyUnicode_InternFromString("loss_mask");  // never freed
  return key;
}

// The user function's result for one row as tokens and loss mask. REQUIRES: the GIL.
Status ReadResult(nb::handle result, RowCallbackResult* out) {
  if (result.is_none()) {
    out->none = true;
    return Status::OK();
  }
  nb::handle tokens = result, mask;
  if (PyDict_Check(result.ptr())) {
    PyObject* d = result.ptr();
    PyObject* t = PyDict_GetItemWithError(d, TokensKey());
    PyObject* m = t != nullptr ? PyDict_GetItemWithError(d, LossMaskKey()) : nullptr;
    if (PyErr_Occurred()) throw nb::python_error();
    if (PyDict_GET_SIZE(d) != (t != nullptr) + (m != nullptr)) {
      for (auto [key, value] : nb::borrow<nb::dict>(result)) {
        const std::string k = nb::cast<std::string>(nb::str(key));
        if (k != "tokens" && k != "loss_mask") {
          return Status::Invalid("the result has the key '", k,
                                 "'; expected 'tokens' and optionally 'loss_mask'");
        }
      }
    }
    if (t == nullptr) return Status::Invalid("the result dict has no 'tokens'");
    tokens = t;
    mask = m;
  }
  std::vector<int64_t> values;
  ARROW_RETURN_NOT_OK(ReadInts(tokens, "tokens", &values));
  out->tokens.resize(values.size());
  for (size_t k = 0; k < values.size(); ++k) {
    if (values[k] < 0 || values[k] > std::numeric_limits<int32_t>::max()) {
      return Status::Invalid("tokens[", k, "] = ", values[k], " is not an int32 id >= 0");
    }
    out->tokens[k] = static_cast<int32_t>(values[k]);
  }
  if (mask && !mask.is_none()) {
    ARROW_RETURN_NOT_OK(ReadInts(mask, "loss_mask", &values));
    out->loss_mask.resize(values.size());
    for (size_t k = 0; k < values.size(); ++k) out->loss_mask[k] = values[k] != 0;
  }
  return Status::OK();
}

// The error of a Python call that failed: "TypeName: message". REQUIRES: the GIL and an
// error set.
Status CallError() {
  nb::python_error e;
  return Status::Invalid(ErrorText(e));
}

class PyRowCallback : public RowCallback {
 public:
  explicit PyRowCallback(nb::object fn) : fn_(std::move(fn)) {}
  ~PyRowCallback() override {
    if (!PythonAlive()) {
      fn_.release();  // too late to touch Python: leak the reference
      return;
    }
    nb::gil_scoped_acquire gil;
    fn_.reset();
  }

  Status Call(const std::vector<RowValue>& row, RowCallbackResult* out) const override {
    Status row_status;
    const Status st = CallRows({row}, /*batched=*/false, out, &row_status);
    return st.ok() ? row_status : st;
  }

  Status CallRows(const std::vector<std::vector<RowValue>>& rows, bool batched,
                  RowCallbackResult* out, Status* row_status) const override {
    // Counted before the check, so that Cancel sees either this call or the flag.
    in_flight_.fetch_add(1);
    Status st;
    if (cancelled_.load() || PythonExiting()) {
      st = Status::Cancelled("stopping");
    } else {
      KeepThreadState();
      nb::gil_scoped_acquire gil;
      try {
        st = batched ? CallBatchLocked(rows, out, row_status)
                     : CallEachLocked(rows, out, row_status);
      } catch (nb::python_error& e) {
        st = Status::Invalid(ErrorText(e));
      } catch (const std::exception& e) {
        st = Status::Invalid(e.what());
      }
    }
    in_flight_.fetch_sub(1);
    return st;
  }

  void Cancel() const override { CancelCalls(&cancelled_, &in_flight_); }

 private:
  // fn(*row) per row. REQUIRES: the GIL.
  Status CallEachLocked(const std::vector<std::vector<RowValue>>& rows,
                        RowCallbackResult* out, Status* row_status) const {
    for (size_t k = 0; k < rows.size(); ++k) {
      if (cancelled_.load(std::memory_order_relaxed)) {
        return Status::Cancelled("stopping");
      }
      const std::vector<RowValue>& row = rows[k];
      try {
        nb::tuple args = nb::steal<nb::tuple>(PyTuple_New(Py_ssize_t(row.size())));
        for (size_t c = 0; c < row.size(); ++c) {
          PyTuple_SET_ITEM(args.ptr(), Py_ssize_t(c), ToPython(row[c]).release().ptr());
        }
        PyObject* result = PyObject_Call(fn_.ptr(), args.ptr(), nullptr);
        row_status[k] =
            result == nullptr ? CallError() : ReadResult(nb::steal(result), &out[k]);
      } catch (nb::python_error& e) {
        row_status[k] = Status::Invalid(ErrorText(e));
      }
    }
    return Status::OK();
  }

  // fn(*columns), each a list of the rows' values, once. REQUIRES: the GIL.
  Status CallBatchLocked(const std::vector<std::vector<RowValue>>& rows,
                         RowCallbackResult* out, Status* row_status) const {
    const Py_ssize_t n = Py_ssize_t(rows.size());
    const size_t columns = rows.empty() ? 0 : rows[0].size();
    nb::tuple args = nb::steal<nb::tuple>(PyTuple_New(Py_ssize_t(columns)));
    for (size_t c = 0; c < columns; ++c) {
      PyObject* list = PyList_New(n);
      if (list == nullptr) throw nb::python_error();
      PyTuple_SET_ITEM(args.ptr(), Py_ssize_t(c), list);
      for (Py_ssize_t k = 0; k < n; ++k) {
        PyList_SET_ITEM(list, k, ToPython(rows[size_t(k)][c]).release().ptr());
      }
    }
    PyObject* result = PyObject_Call(fn_.ptr(), args.ptr(), nullptr);
    if (result == nullptr) return CallError();
    nb::object keep = nb::steal(result);
    if (PyUnicode_Check(result) || PyBytes_Check(result) || PyDict_Check(result)) {
      return Status::Invalid("a batched transform returns a list of one result per row, "
                             "not ", Py_TYPE(result)->tp_name);
    }
    PyObject* seq = PySequence_Fast(result, "");
    if (seq == nullptr) {
      PyErr_Clear();
      return Status::Invalid("a batched transform returns a list of one result per row, "
                             "not ", Py_TYPE(result)->tp_name);
    }
    nb::object keep_seq = nb::steal(seq);
    if (PySequence_Fast_GET_SIZE(seq) != n) {
      return Status::Invalid("the batched transform returned ",
                             PySequence_Fast_GET_SIZE(seq), " results for ", n, " rows");
    }
    PyObject** items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = 0; k < n; ++k) {
      try {
        row_status[k] = ReadResult(nb::handle(items[k]), &out[size_t(k)]);
      } catch (nb::python_error& e) {
        row_status[k] = Status::Invalid(ErrorText(e));
      }
    }
    return Status::OK();
  }

  nb::object fn_;
  mutable std::atomic<int64_t> in_flight_{0};
  mutable std::atomic<bool> cancelled_{false};
};

// The factory the core calls for `transform.python`: "module:function" (or
// "module:Class.attr") is imported; a bare name is looked up among the functions
// registered with braid.register_transform.
Result<std::shared_ptr<const RowCallback>> MakePythonCallback(const std::string& spec,
                                                              const std::string& key) {
  nb::gil_scoped_acquire gil;
  try {
    nb::object fn;
    const size_t colon = spec.find(':');
    if (colon == std::string::npos) {
      fn = nb::module_::import_("braid.transforms").attr("registered_transform")(spec);
      if (fn.is_none()) {
        return ConfigError(key, "'" + spec +
                                    "' is neither a function registered with "
                                    "braid.register_transform nor 'module:function'");
      }
    } else {
      const std::string module = spec.substr(0, colon);
      const std::string path = spec.substr(colon + 1);
      if (module.empty() || path.empty()) {
        return ConfigError(key, "'" + spec + "' is not 'module:function'");
      }
      fn = nb::module_::import_(module.c_str());
      for (size_t begin = 0; begin <= path.size();) {
        size_t end = path.find('.', begin);
        if (end == std::string::npos) end = path.size();
        fn = fn.attr(path.substr(begin, end - begin).c_str());
        begin = end + 1;
      }
    }
    if (!PyCallable_Check(fn.ptr())) {
      return ConfigError(key, "'" + spec + "' is not callable (" +
                                  std::string(Py_TYPE(fn.ptr())->tp_name) + ")");
    }
    auto callback = std::make_shared<const PyRowCallback>(std::move(fn));
    TrackPythonCaller(callback);
    return callback;
  } catch (nb::python_error& e) {
    return ConfigError(key, "cannot load '" + spec + "': " + ErrorText(e));
  }
}

}  // namespace

void RegisterUserTransform(nb::module_& /*m*/) {
  SetRowCallbackFactory(MakePythonCallback);
}

}  // namespace braid::python
