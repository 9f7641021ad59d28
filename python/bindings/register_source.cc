// Source loaders on their own: pull samples (benchmarks, tests), SentencePiece helpers
// (train a tiny model, raw encoding as a benchmark baseline), and the Python side of user
// transforms (`sources[].transform.python`, transform/user_transform.h): a RowCallback that
// converts a chunk of rows to Python values and calls the user's function (once per
// row, or once for the chunk when `batched`) holding the GIL only around that, installed
// as the core's factory when the module is imported; and the same for Hugging Face
// tokenizers (`tokenizer: {type: huggingface}`, transform/tokenizer.h). Pool threads keep
// their Python thread states (thread_states.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include "braid/config/config.h"
#include "braid/transform/image.h"
#include "braid/source/sharded_source.h"
#include "braid/source/source_loader.h"
#include "braid/transform/tokenizer.h"
#include "braid/transform/user_transform.h"
#include "braid/testing/sentencepiece_fixture.h"
#include "status_caster.h"
#include "thread_states.h"

namespace nb = nanobind;

namespace braid::python {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// --- User transforms (docs/sources.md, "User transforms") ---

// Cancels a Python callback: later calls fail at once; calls in flight are waited for. If
// this thread holds the GIL (an Engine dropped by Python), calls waiting for it would never
// finish and the loader's join would hang, so it is released until they are done.
void CancelCalls(std::atomic<bool>* cancelled, const std::atomic<int64_t>* in_flight) {
  cancelled->store(true);
  if (!PythonAlive() || !PyGILState_Check()) return;
  nb::gil_scoped_release release;
  while (in_flight->load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Every live object whose Call / EncodeBatch worker threads run Python, so that they can
// all be cancelled at interpreter exit (an atexit hook, before finalization starts): a
// worker that entered Python afterwards would never return (CPython and PyO3 park or end
// threads that attach during finalization), and the loader that joins it would hang.
struct PythonCallers {
  std::mutex mu;
  std::vector<std::weak_ptr<const RowCallback>> callbacks;  // GUARDED_BY(mu)
  std::vector<std::weak_ptr<const HfEncoder>> encoders;     // GUARDED_BY(mu)
};

PythonCallers& Callers() {
  static auto* callers = new PythonCallers();  // never destroyed: used at exit
  return *callers;
}

template <typename T>
void Track(std::vector<std::weak_ptr<const T>>* list, const std::shared_ptr<const T>& p) {
  std::lock_guard<std::mutex> lock(Callers().mu);
  std::erase_if(*list, [](const auto& w) { return w.expired(); });
  list->push_back(p);
}

// Cancels every live caller; each Cancel waits (the GIL released) for its calls in
// flight. Before that, no thread may enter Python any more (new callers are refused
// too), and ending pool threads leave their thread states to finalization. REQUIRES: the
// GIL (an atexit hook).
void CancelPythonCallers() {
  BeginPythonExit();
  std::vector<std::shared_ptr<const RowCallback>> callbacks;
  std::vector<std::shared_ptr<const HfEncoder>> encoders;
  {
    std::lock_guard<std::mutex> lock(Callers().mu);
    for (const auto& w : Callers().callbacks) {
      if (auto p = w.lock()) callbacks.push_back(std::move(p));
    }
    for (const auto& w : Callers().encoders) {
      if (auto p = w.lock()) encoders.push_back(std::move(p));
    }
  }
  for (const auto& c : callbacks) c->Cancel();
  for (const auto& e : encoders) e->Cancel();
}

// "TypeName: message" of the Python error in flight. REQUIRES: the GIL.
std::string ErrorText(nb::python_error& e) {
  std::string type = "Exception";
  try {
    type = nb::cast<std::string>(nb::handle(e.type()).attr("__qualname__"));
  } catch (...) {
  }
  std::string message;
  try {
    message = nb::cast<std::string>(nb::str(e.value()));
  } catch (...) {
  }
  return message.empty() ? type : type + ": " + message;
}

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
      return std::move(list);
    }
    case RowValue::Kind::kStruct: {
      nb::dict dict;
      for (size_t f = 0; f < v.items.size(); ++f) {
        dict[nb::str(v.field_names[f].data(), v.field_names[f].size())] =
            ToPython(v.items[f]);
      }
      return std::move(dict);
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
      if (cancelled_.load(std::memory_order_relaxed)) return Status::Cancelled("stopping");
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
    Track<RowCallback>(&Callers().callbacks, callback);
    return callback;
  } catch (nb::python_error& e) {
    return ConfigError(key, "cannot load '" + spec + "': " + ErrorText(e));
  }
}

// --- end user transforms ---

// --- Hugging Face tokenizers (docs/sources.md, "Hugging Face tokenizers") ---

// A `tokenizers.Tokenizer` as the core's HfEncoder. EncodeBatch holds the GIL to build the
// list of texts and to read the ids back; the library releases it while it encodes.
class PyHfEncoder : public HfEncoder {
 public:
  // `chat`: the tokenizer's chat template (braid._chat_template.ChatTemplate) or None.
  PyHfEncoder(nb::object tokenizer, nb::object chat)
      : tokenizer_(std::move(tokenizer)),
        chat_(std::move(chat)),
        // encode_batch_fast: the same ids without the offsets the loader never reads.
        encode_(nb::hasattr(tokenizer_, "encode_batch_fast")
                    ? tokenizer_.attr("encode_batch_fast")
                    : tokenizer_.attr("encode_batch")) {}
  ~PyHfEncoder() override {
    if (!PythonAlive()) {  // too late to touch Python: leak the references
      encode_.release();
      tokenizer_.release();
      chat_.release();
      return;
    }
    nb::gil_scoped_acquire gil;
    encode_.reset();
    tokenizer_.reset();
    chat_.reset();
  }

  bool has_chat_template() const override { return !chat_.is_none(); }

  Status EncodeChats(const std::vector<std::vector<ChatMessage>>& chats,
                     std::vector<std::vector<int32_t>>* ids,
                     std::vector<std::vector<int64_t>>* starts,
                     std::vector<std::vector<std::pair<int64_t, int64_t>>>* spans,
                     std::vector<std::string>* refused) const override {
    return CallPython("", [&] {
      nb::list batch;
      for (const auto& chat : chats) {
        nb::list messages;
        for (const ChatMessage& m : chat) {
          messages.append(nb::make_tuple(nb::str(m.role.data(), m.role.size()),
                                         nb::str(m.content.data(), m.content.size())));
        }
        batch.append(messages);
      }
      nb::object module = nb::module_::import_("braid._chat_template");
      nb::list encoded = nb::cast<nb::list>(module.attr("encode")(chat_, tokenizer_, batch));
      ids->assign(chats.size(), {});
      starts->assign(chats.size(), {});
      spans->assign(chats.size(), {});
      refused->assign(chats.size(), {});
      for (size_t k = 0; k < chats.size(); ++k) {
        if (nb::isinstance<nb::str>(encoded[k])) {  // the template refused the chat
          (*refused)[k] = nb::cast<std::string>(encoded[k]);
          if ((*refused)[k].empty()) (*refused)[k] = "refused";
          continue;
        }
        nb::tuple one = nb::cast<nb::tuple>(encoded[k]);
        (*ids)[k] = nb::cast<std::vector<int32_t>>(one[0]);
        (*starts)[k] = nb::cast<std::vector<int64_t>>(one[1]);
        (*spans)[k] = nb::cast<std::vector<std::pair<int64_t, int64_t>>>(one[2]);
      }
      return Status::OK();
    });
  }

  Status EncodeBatch(const std::vector<std::string_view>& texts, bool add_special_tokens,
                     std::vector<std::vector<int32_t>>* out) const override {
    return CallPython("tokenizers: ",
                      [&] { return EncodeLocked(texts, add_special_tokens, out); });
  }

  int32_t TokenId(const std::string& token) const override {
    nb::gil_scoped_acquire gil;
    try {
      nb::object id = tokenizer_.attr("token_to_id")(token);
      return id.is_none() ? -1 : nb::cast<int32_t>(id);
    } catch (nb::python_error&) {
      return -1;
    } catch (const std::exception&) {  // not an int32
      return -1;
    }
  }

  void Cancel() const override { CancelCalls(&cancelled_, &in_flight_); }

 private:
  // Runs `body` with the GIL on a kept thread state, unless the loader or the
  // interpreter is stopping (Cancelled); a Python or C++ exception becomes an Invalid
  // status prefixed with `what`.
  template <typename Body>
  Status CallPython(const char* what, Body&& body) const {
    // Counted before the check, so that Cancel sees either this call or the flag.
    in_flight_.fetch_add(1);
    Status st;
    if (cancelled_.load() || PythonExiting() || !PythonAlive()) {
      st = Status::Cancelled("stopping");
    } else {
      KeepThreadState();
      nb::gil_scoped_acquire gil;
      try {
        st = body();
      } catch (nb::python_error& e) {
        st = Status::Invalid(what, ErrorText(e));
      } catch (const std::exception& e) {
        st = Status::Invalid(what, e.what());
      }
    }
    in_flight_.fetch_sub(1);
    return st;
  }

  // REQUIRES: the GIL.
  Status EncodeLocked(const std::vector<std::string_view>& texts, bool add_special_tokens,
                      std::vector<std::vector<int32_t>>* out) const {
    const Py_ssize_t n = Py_ssize_t(texts.size());
    nb::list list = nb::steal<nb::list>(PyList_New(n));
    for (Py_ssize_t k = 0; k < n; ++k) {
      const std::string_view t = texts[size_t(k)];
      PyObject* s = PyUnicode_DecodeUTF8(t.data(), Py_ssize_t(t.size()), "strict");
      if (s == nullptr) throw nb::python_error();
      PyList_SET_ITEM(list.ptr(), k, s);
    }
    nb::object encodings = encode_(list, nb::arg("add_special_tokens") = add_special_tokens);
    PyObject* seq = PySequence_Fast(encodings.ptr(), "encode_batch returned no list");
    if (seq == nullptr) throw nb::python_error();
    nb::object keep = nb::steal(seq);
    if (PySequence_Fast_GET_SIZE(seq) != n) {
      return Status::Invalid("encode_batch returned ", PySequence_Fast_GET_SIZE(seq),
                             " encodings for ", n, " texts");
    }
    out->resize(texts.size());
    PyObject** items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = 0; k < n; ++k) {
      nb::object ids = nb::borrow(items[k]).attr("ids");
      PyObject* idseq = PySequence_Fast(ids.ptr(), "Encoding.ids is no list");
      if (idseq == nullptr) throw nb::python_error();
      nb::object keep_ids = nb::steal(idseq);
      const Py_ssize_t m = PySequence_Fast_GET_SIZE(idseq);
      PyObject** values = PySequence_Fast_ITEMS(idseq);
      auto& row = (*out)[size_t(k)];
      row.resize(size_t(m));
      for (Py_ssize_t j = 0; j < m; ++j) {
        const long v = PyLong_AsLong(values[j]);
        if (v == -1 && PyErr_Occurred()) throw nb::python_error();
        if (v < 0 || v > std::numeric_limits<int32_t>::max()) {
          return Status::Invalid("token id ", v, " does not fit int32");
        }
        row[size_t(j)] = static_cast<int32_t>(v);
      }
    }
    return Status::OK();
  }

  nb::object tokenizer_;
  nb::object chat_;
  nb::object encode_;
  mutable std::atomic<int64_t> in_flight_{0};
  mutable std::atomic<bool> cancelled_{false};
};

// The factory the core calls for `tokenizer: {type: huggingface, file: PATH}`.
Result<std::shared_ptr<const HfEncoder>> MakePyHfEncoder(const TokenizerConfig& config) {
  nb::gil_scoped_acquire gil;
  nb::object module;
  try {
    module = nb::module_::import_("tokenizers");
  } catch (nb::python_error& e) {
    return ConfigError(config.key + ".type",
                       "huggingface needs the 'tokenizers' package (pip install "
                       "'braid[hf]'): " + ErrorText(e));
  }
  nb::object chat = nb::none();
  if (config.chat_template) {
    try {
      chat = nb::module_::import_("braid._chat_template").attr("load")(config.model);
    } catch (nb::python_error& e) {
      return ConfigError(config.key + ".chat_template",
                         "cannot load the chat template beside '" + config.model +
                             "': " + ErrorText(e));
    }
  }
  try {
    nb::object tok = module.attr("Tokenizer").attr("from_file")(config.model);
    auto encoder = std::make_shared<const PyHfEncoder>(std::move(tok), std::move(chat));
    Track<HfEncoder>(&Callers().encoders, encoder);
    return encoder;
  } catch (nb::python_error& e) {
    return ConfigError(config.key + ".file", "cannot load tokenizer '" + config.model +
                                                 "': " + ErrorText(e));
  }
}

// --- end Hugging Face tokenizers ---

}  // namespace

void RegisterSource(nb::module_& m) {
  InstallPoolJoinHook();
  SetRowCallbackFactory(MakePythonCallback);
  SetHfEncoderFactory(MakePyHfEncoder);
  m.def("_cancel_python_calls", &CancelPythonCallers,
        "Cancels the Python calls of every loader's worker threads (user transforms, "
        "Hugging Face tokenizers) and waits for those in flight; registered with atexit.");
  nb::module_::import_("atexit").attr("register")(m.attr("_cancel_python_calls"));
  m.def("_kept_thread_states", &KeptThreadStates,
        "How many pool threads alive now keep a Python thread state (for tests).");
  m.def(
      "read_source",
      [](const Config& config, int32_t source_index, int64_t samples, bool payloads) {
        if (source_index < 0 || size_t(source_index) >= config.sources.size()) {
          throw nb::index_error("source_index out of range");
        }
        int64_t n = 0, tokens = 0, payload_tokens = 0, skipped = 0, masked = 0;
        double seconds = 0;
        Status st;
        {
          GilRelease release;
          const auto start = std::chrono::steady_clock::now();
          SourceLoader::Options options;
          options.read_payloads = payloads;
          options.read_ahead_bytes = config.runtime.read_ahead_bytes;
          auto loader = ShardedSource::Make(config, source_index, StreamPos{}, options,
                                            config.sources[size_t(source_index)].loaders);
          st = loader.status();
          for (; st.ok() && n < samples; ++n) {
            auto s = (*loader)->Next();
            if (!s.ok()) {
              st = s.status();
              break;
            }
            tokens += s->meta.tokens;
            if (s->meta.skip != SkipReason::kNone) ++skipped;
            if (s->payload) {
              // Waits for a payload still being made (metadata first); its error stops.
              auto payload = s->payload.Get();
              if (!payload.ok()) {
                st = payload.status();
                break;
              }
              payload_tokens += static_cast<int64_t>((*payload)->tokens.size());
              for (uint8_t b : (*payload)->loss_mask) masked += b;
            }
          }
          seconds = Seconds(start);
        }
        ThrowIfError(st);
        nb::dict d;
        d["samples"] = n;
        d["tokens"] = tokens;
        d["payload_tokens"] = payload_tokens;
        d["loss_mask_ones"] = masked;
        d["skipped"] = skipped;
        d["seconds"] = seconds;
        return d;
      },
      nb::arg("config"), nb::arg("source_index"), nb::arg("samples"),
      nb::arg("payloads") = true,
      "Pulls `samples` samples of one source through its loader(s) (sources[].loaders; "
      "from the start of its order); returns counts and the seconds taken, loader start "
      "included.");

  m.def(
      "source_samples",
      [](const Config& config, int32_t source_index, int64_t samples) {
        if (source_index < 0 || size_t(source_index) >= config.sources.size()) {
          throw nb::index_error("source_index out of range");
        }
        std::vector<Sample> got;
        Status st;
        {
          GilRelease release;
          auto loader = ShardedSource::Make(config, source_index, StreamPos{}, {},
                                            config.sources[size_t(source_index)].loaders);
          st = loader.status();
          for (int64_t n = 0; st.ok() && n < samples; ++n) {
            auto s = (*loader)->Next();
            if (!s.ok()) {
              st = s.status();
              break;
            }
            if (s->payload) {
              auto payload = s->payload.Get();
              if (!payload.ok()) {
                st = payload.status();
                break;
              }
            }
            got.push_back(std::move(*s));
          }
        }
        ThrowIfError(st);
        nb::list out;
        for (const Sample& s : got) {
          nb::dict d;
          d["file"] = s.meta.file;
          d["row"] = s.meta.row;
          d["epoch"] = s.meta.epoch;
          d["skip"] = static_cast<int>(s.meta.skip);
          d["tokens"] = s.meta.tokens;
          if (s.payload) {
            const Payload& p = *s.payload.operator->();  // finished above
            d["ids"] = std::vector<int32_t>(p.tokens.begin(), p.tokens.end());
            d["loss_mask"] = std::vector<int32_t>(p.loss_mask.begin(), p.loss_mask.end());
          }
          out.append(d);
        }
        return out;
      },
      nb::arg("config"), nb::arg("source_index"), nb::arg("samples"),
      "The first `samples` samples of one source's stream, each a dict (file, row, epoch, "
      "skip, tokens, and with a payload its ids and loss_mask), for tests.");

  m.def(
      "train_tiny_sentencepiece",
      [](const std::vector<std::string>& sentences, const std::string& model_prefix,
         int32_t vocab_size) {
        Status st;
        {
          GilRelease release;
          st = testing::TrainTinySentencePiece(sentences, model_prefix, vocab_size);
        }
        ThrowIfError(st);
        return model_prefix + ".model";
      },
      nb::arg("sentences"), nb::arg("model_prefix"), nb::arg("vocab_size") = 200,
      "Trains a unigram SentencePiece model on the sentences (unk 0, bos 1, eos 2) and "
      "returns the model path. For tests and benchmarks.");

  m.def(
      "sentencepiece_tokenize",
      [](const std::string& model, const std::string& text) {
        TokenizerConfig tc;
        tc.model = model;
        auto tok = ValueOrThrow(Tokenizer::Make(tc));
        std::vector<int32_t> ids;
        ThrowIfError(tok->Encode(text, &ids));
        return ids;
      },
      nb::arg("model"), nb::arg("text"),
      "The ids of text under a SentencePiece model (no BOS/EOS), for tests.");

  m.def(
      "encode_test_jpeg",
      [](nb::bytes rgb, int width, int height) {
        if (rgb.size() != size_t(width) * size_t(height) * 3) {
          ThrowStatus(ConfigError("rgb", "must hold width * height * 3 bytes"));
        }
        std::string jpeg = ValueOrThrow(
            EncodeJpeg(static_cast<const uint8_t*>(rgb.data()), width, height));
        return nb::bytes(jpeg.data(), jpeg.size());
      },
      nb::arg("rgb"), nb::arg("width"), nb::arg("height"),
      "JPEG bytes (quality 95, 4:4:4) of packed RGB8 pixels, for image tests.");

  m.def(
      "sentencepiece_encode",
      [](const std::string& model, const std::vector<std::string>& texts, int64_t threads) {
        std::vector<std::vector<int32_t>> ids(texts.size());
        double seconds = 0;
        Status st;
        {
          GilRelease release;
          TokenizerConfig tc;
          tc.model = model;
          auto tok = Tokenizer::Make(tc);
          st = tok.status();
          if (st.ok()) {
            const auto start = std::chrono::steady_clock::now();
            std::atomic<size_t> next{0};
            auto work = [&] {
              for (size_t i; (i = next.fetch_add(1)) < texts.size();) {
                (void)(*tok)->Encode(texts[i], &ids[i]);
              }
            };
            std::vector<std::thread> pool;
            for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
            work();
            for (auto& t : pool) t.join();
            seconds = Seconds(start);
          }
        }
        ThrowIfError(st);
        int64_t tokens = 0;
        for (const auto& v : ids) tokens += static_cast<int64_t>(v.size());
        nb::dict d;
        d["tokens"] = tokens;
        d["seconds"] = seconds;
        return d;
      },
      nb::arg("model"), nb::arg("texts"), nb::arg("threads") = 1,
      "Raw SentencePiece encoding of texts on `threads` threads (no BOS/EOS): the "
      "baseline of benchmarks/source_read.py. Returns total tokens and seconds.");
}

}  // namespace braid::python
