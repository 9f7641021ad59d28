// Calls into Python from pool threads (python_calls.h): cancel-and-wait, the error text
// of a failed call, and the registry of live adapters that the exit hook cancels.
#include "python_calls.h"

#include <nanobind/stl/string.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "thread_states.h"

namespace nb = nanobind;

namespace braid::python {
namespace {

// The adapters alive now (weak: tracking keeps none alive); the exit hook cancels them.
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

}  // namespace

void CancelCalls(std::atomic<bool>* cancelled, const std::atomic<int64_t>* in_flight) {
  cancelled->store(true);
  if (!PythonAlive() || !PyGILState_Check()) return;
  nb::gil_scoped_release release;
  while (in_flight->load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

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

void TrackPythonCaller(const std::shared_ptr<const RowCallback>& callback) {
  Track<RowCallback>(&Callers().callbacks, callback);
}

void TrackPythonCaller(const std::shared_ptr<const HfEncoder>& encoder) {
  Track<HfEncoder>(&Callers().encoders, encoder);
}

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

}  // namespace braid::python
