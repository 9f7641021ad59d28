// The Python side of Hugging Face tokenizers (`tokenizer: {type: huggingface}`,
// transform/tokenizer.h): an HfEncoder over a `tokenizers.Tokenizer` and, when the
// tokenizer ships one, its chat template (braid._chat_template). RegisterHfTokenizer
// installs it as the core's factory when the module is imported. Cancellation and exit:
// python_calls.h.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "braid/config/config.h"
#include "braid/transform/tokenizer.h"
#include "python_calls.h"
#include "status_caster.h"
#include "thread_states.h"

namespace nb = nanobind;

namespace braid::python {
namespace {

// A `tokenizers.Tokenizer` as the core's HfEncoder. EncodeBatch holds the GIL to build
// the list of texts and to read the ids back; the library releases it while it encodes.
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
      nb::list encoded =
          nb::cast<nb::list>(module.attr("encode")(chat_, tokenizer_, batch));
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
    nb::object encodings =
        encode_(list, nb::arg("add_special_tokens") = add_special_tokens);
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
    TrackPythonCaller(encoder);
    return encoder;
  } catch (nb::python_error& e) {
    return ConfigError(config.key + ".file", "cannot load tokenizer '" + config.model +
                                                 "': " + ErrorText(e));
  }
}

}  // namespace

void RegisterHfTokenizer(nb::module_& /*m*/) { SetHfEncoderFactory(MakePyHfEncoder); }

}  // namespace braid::python
