// The services, for the Ray runtime's actors (python/braid/ray_runtime/hosts.py): the
// planner service, the sources' payloads, a node's constructor service, and the client's
// cursor. The services decide; these bindings convert their messages to NumPy arrays and
// their ports (a constructor's PlanSource and PieceSource) to the Python callables that
// move them through Ray. Every blocking call releases the GIL; a callback takes it.
#include <cmath>
#include <map>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "braid/cli/job.h"
#include "braid/plan/planner.h"
#include "braid/client/rank_cursor.h"
#include "braid/service/constructor_service.h"
#include "braid/service/hosting.h"
#include "braid/service/planner_service.h"
#include "braid/service/source_service.h"
#include "braid/service/wire.h"
#include "braid/transport/in_process.h"
#include "braid/transport/view_file.h"
#include "numpy_util.h"
#include "status_caster.h"
#include "thread_states.h"

namespace nb = nanobind;

namespace braid::python {
namespace {

using Int64Array = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int32Array = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using UInt8Array = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A 1-D NumPy array that owns `values` (moved to the heap, freed with the array).
template <typename T>
nb::object OwnedArray(std::vector<T> values) {
  auto* keep = new std::vector<T>(std::move(values));
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  const size_t shape[1] = {keep->size()};
  return nb::ndarray<nb::numpy, T>(keep->data(), 1, shape, owner).cast();
}

// A read-only 1-D NumPy view of a planned step's wire message; the step stays alive
// with the array (held plans are shared, not copied, by every request).
nb::object MessageView(std::shared_ptr<const PlannedStep> step) {
  auto* keep = new std::shared_ptr<const PlannedStep>(std::move(step));
  nb::capsule owner(keep, [](void* p) noexcept {
    delete static_cast<std::shared_ptr<const PlannedStep>*>(p);
  });
  const size_t shape[1] = {(*keep)->encoded.size()};
  return nb::ndarray<nb::numpy, const int64_t>((*keep)->encoded.data(), 1, shape, owner)
      .cast();
}

nb::dict FiguresToDict(const PlanFigures& f) {
  nb::dict d;
  d["step"] = f.step;
  d["imbalance"] = f.imbalance;
  d["sequential_imbalance"] = f.sequential_imbalance;
  d["source_tokens"] = f.source_tokens;
  d["skipped"] = f.skipped;
  d["padding_tokens"] = f.padding_tokens;
  d["multimodal_cut"] = f.multimodal_cut;
  d["multimodal_deferred"] = f.multimodal_deferred;
  d["seq_len"] = f.seq_len;  // planner: context and drift
  d["source_context"] = f.source_context;
  d["source_bound"] = f.source_bound;
  d["source_drift"] = f.source_drift;
  return d;
}

PlanFigures FiguresFromDict(const nb::dict& d) {
  PlanFigures f;
  f.step = nb::cast<int64_t>(d["step"]);
  f.imbalance = nb::cast<double>(d["imbalance"]);
  f.sequential_imbalance = nb::cast<double>(d["sequential_imbalance"]);
  f.source_tokens = nb::cast<std::vector<int64_t>>(d["source_tokens"]);
  f.skipped = nb::cast<std::vector<int64_t>>(d["skipped"]);
  f.padding_tokens = nb::cast<int64_t>(d["padding_tokens"]);
  f.multimodal_cut = nb::cast<int64_t>(d["multimodal_cut"]);
  f.multimodal_deferred = nb::cast<int64_t>(d["multimodal_deferred"]);
  if (d.contains("seq_len")) {  // planner: context and drift
    f.seq_len = nb::cast<int64_t>(d["seq_len"]);
    f.source_context = nb::cast<std::vector<int64_t>>(d["source_context"]);
    f.source_bound = nb::cast<std::vector<int64_t>>(d["source_bound"]);
    f.source_drift = nb::cast<std::vector<double>>(d["source_drift"]);
  }
  return f;
}

// The Status of an error a transport callback reported, by the Python exception's type
// name: the roles' own errors keep their kind; Ray's "actor unreachable" errors become
// UnavailableError (a constructor asks the host's standby), its timeouts TimeoutError.
Status StatusOfPython(const std::string& type, const std::string& message) {
  if (type == "ConfigError") {
    return Status::Invalid(message).WithDetail(
        std::make_shared<ErrorDetail>(ErrorKind::kConfig, ""));
  }
  if (type == "DataError") {
    return Status::Invalid(message).WithDetail(
        std::make_shared<ErrorDetail>(ErrorKind::kData, ""));
  }
  if (type == "StorageError") {
    return Status::IOError(message).WithDetail(
        std::make_shared<ErrorDetail>(ErrorKind::kData, ""));
  }
  if (type == "TimeoutError" || type == "GetTimeoutError") {
    return Status::IOError(message).WithDetail(
        std::make_shared<ErrorDetail>(ErrorKind::kTimeout, ""));
  }
  if (type == "ConnectionError" || type == "RayActorError" || type == "ActorDiedError" ||
      type == "ActorUnavailableError" || type == "ActorUnschedulableError" ||
      type == "ObjectLostError" || type == "OwnerDiedError") {
    return Status::IOError(message).WithDetail(
        std::make_shared<ErrorDetail>(ErrorKind::kUnavailable, ""));
  }
  return Status::UnknownError(type, ": ", message);
}

Status StatusOfPython(nb::python_error& e) {
  const std::string type = nb::cast<std::string>(e.type().attr("__name__"));
  const std::string message = nb::cast<std::string>(nb::str(e.value()));
  return StatusOfPython(type, message);
}

// A Python callable held by C++ threads: called with the GIL taken, released with it.
class Callback {
 public:
  explicit Callback(nb::object fn) : fn_(new nb::object(std::move(fn))) {}
  ~Callback() {
    if (PythonAlive()) {
      nb::gil_scoped_acquire gil;
      delete fn_;
    }  // else left to the interpreter's end
  }
  Callback(const Callback&) = delete;
  Callback& operator=(const Callback&) = delete;
  // REQUIRES: the GIL.
  const nb::object& fn() const { return *fn_; }

 private:
  nb::object* fn_;
};

// Copies a source host's reply (SourceHost.fetch's tuple) into a PieceReply.
// REQUIRES: the GIL.
std::shared_ptr<const PieceReply> ReplyFromTuple(const nb::handle& item) {
  const nb::tuple t = nb::cast<nb::tuple>(item);
  auto reply = std::make_shared<PieceReply>();
  auto copy = [](auto* to, const auto& from) {
    to->assign(from.data(), from.data() + from.shape(0));
  };
  copy(&reply->tokens, nb::cast<Int32Array>(t[0]));
  copy(&reply->offsets, nb::cast<Int64Array>(t[1]));
  if (!t[2].is_none()) copy(&reply->loss_mask, nb::cast<UInt8Array>(t[2]));
  if (t.size() > 3 && !t[3].is_none()) copy(&reply->images, nb::cast<Int64Array>(t[3]));
  if (t.size() > 4 && !t[4].is_none()) {
    copy(&reply->image_bytes, nb::cast<UInt8Array>(t[4]));
  }
  if (t.size() > 5 && !t[5].is_none()) copy(&reply->paths, nb::cast<UInt8Array>(t[5]));
  return reply;
}

// A reply as the tuple a source host returns: (tokens, offsets, loss_mask, images,
// image_bytes, paths), None where a source has none. REQUIRES: the GIL.
nb::tuple TupleFromReply(PieceReply r) {
  nb::object mask = r.loss_mask.empty() ? nb::none() : OwnedArray(std::move(r.loss_mask));
  nb::object images = nb::none(), image_bytes = nb::none(), paths = nb::none();
  if (!r.images.empty()) {
    images = OwnedArray(std::move(r.images));
    image_bytes = OwnedArray(std::move(r.image_bytes));
    paths = OwnedArray(std::move(r.paths));
  }
  return nb::make_tuple(OwnedArray(std::move(r.tokens)), OwnedArray(std::move(r.offsets)),
                        mask, images, image_bytes, paths);
}

// The sources a process serves (SourceSet opened to serve), shared with its
// constructor's in-process transport.
struct SourceHost {
  std::shared_ptr<SourceSet> sources;
  std::vector<std::string> names;  // config.sources[i].name
};

// PlanSource over `plan(step, buckets) -> (message, state_before, state_after)`.
class PyPlanSource : public PlanSource {
 public:
  PyPlanSource(const Config& config, nb::object fn) : config_(config), fn_(std::move(fn)) {}
  Result<std::shared_ptr<const PlannedStep>> Plan(
      int64_t step, const std::vector<int64_t>& buckets) override {
    if (PythonExiting()) return Status::Cancelled("the interpreter is exiting");
    auto out = std::make_shared<PlannedStep>();
    out->step = step;
    {
      nb::gil_scoped_acquire gil;
      try {
        const nb::tuple t = nb::cast<nb::tuple>(fn_.fn()(step, buckets));
        const auto message = nb::cast<Int64Array>(t[0]);
        out->encoded.assign(message.data(), message.data() + message.shape(0));
        out->state_before_json = nb::cast<std::string>(t[1]);
        out->state_after_json = nb::cast<std::string>(t[2]);
      } catch (nb::python_error& e) {
        return StatusOfPython(e);
      } catch (const std::exception& e) {
        return DataError("plan of step " + std::to_string(step), e.what());
      }
    }
    ARROW_ASSIGN_OR_RAISE(out->state_before,
                          PlannerStateFromJson(out->state_before_json, config_));
    ARROW_ASSIGN_OR_RAISE(out->state_after,
                          PlannerStateFromJson(out->state_after_json, config_));
    return out;
  }

 private:
  const Config& config_;
  Callback fn_;
};

// PieceSource over send(host, replica, {source: requests}) -> id,
// wait(ids, timeout_s) -> None | (id, error type or None, message, [reply per source]),
// forget(ids).
class PyPieceSource : public PieceSource {
 public:
  PyPieceSource(nb::object send, nb::object wait, nb::object forget)
      : send_(std::move(send)), wait_(std::move(wait)), forget_(std::move(forget)) {}

  Result<int64_t> Send(int32_t host, int32_t replica,
                       const SourceRequests& requests) override {
    if (PythonExiting()) return Status::Cancelled("the interpreter is exiting");
    nb::gil_scoped_acquire gil;
    try {
      nb::dict by_source;
      for (const auto& [source, reqs] : requests) by_source[nb::int_(source)] = OwnedArray(reqs);
      return nb::cast<int64_t>(send_.fn()(host, replica, by_source));
    } catch (nb::python_error& e) {
      return StatusOfPython(e);
    }
  }

  std::optional<PieceCall> WaitAny(const std::vector<int64_t>& calls,
                                   double timeout_s) override {
    if (PythonExiting()) {
      return PieceCall{calls.empty() ? 0 : calls[0],
                       Status::Cancelled("the interpreter is exiting"), {}};
    }
    nb::gil_scoped_acquire gil;
    PieceCall out;
    try {
      const nb::object got = wait_.fn()(calls, timeout_s);
      if (got.is_none()) return std::nullopt;
      const nb::tuple t = nb::cast<nb::tuple>(got);
      out.id = nb::cast<int64_t>(t[0]);
      if (!t[1].is_none()) {
        out.status = StatusOfPython(nb::cast<std::string>(t[1]), nb::cast<std::string>(t[2]));
        return out;
      }
      for (nb::handle item : nb::cast<nb::list>(t[3])) {
        out.replies.push_back(ReplyFromTuple(item));
      }
    } catch (nb::python_error& e) {
      out.id = calls.empty() ? 0 : calls[0];
      out.status = StatusOfPython(e);
      out.replies.clear();
    }
    return out;
  }

  void Forget(const std::vector<int64_t>& calls) override {
    if (calls.empty() || PythonExiting()) return;
    nb::gil_scoped_acquire gil;
    try {
      forget_.fn()(calls);
    } catch (nb::python_error&) {
    }
  }

 private:
  Callback send_, wait_, forget_;
};

// A planner service with the config it plans for (the service refers to it).
struct PlannerHandle {
  std::unique_ptr<Config> config;
  std::unique_ptr<Callback> commit;
  std::unique_ptr<PlannerService> service;
};

// A constructor service with what its transport refers to.
struct ConstructorHandle {
  std::unique_ptr<Config> config;
  std::shared_ptr<SourceSet> local;  // the sources this process serves, if any
  const PlannerHandle* planner = nullptr;  // the planner beside it, if any
  std::unique_ptr<ConstructorService> service;
};

// One delivered view, as a node's constructor hands it to its transport.
struct ViewHandle {
  std::shared_ptr<const DeliveredView> view;
  const Config* config;
};

std::string StateJsonOf(const PlannedStep& step, bool after, const Config& config) {
  const std::string& held = after ? step.state_after_json : step.state_before_json;
  if (!held.empty()) return held;
  return PlannerStateToJson(after ? step.state_after : step.state_before, config);
}

nb::dict PlacementToDict(const Placement& p) {
  nb::dict d;
  d["sources"] = p.sources == Placement::Sources::kNode      ? "node"
                 : p.sources == Placement::Sources::kPlanner ? "planner"
                                                             : "actors";
  d["hosts"] = p.hosts;
  d["host_of_source"] = p.host_of_source;
  d["sources_of_host"] = p.sources_of_host;
  d["standby"] = p.standby;
  return d;
}

}  // namespace

void RegisterService(nb::module_& m) {
  m.def("placement", [](const Config& config) { return PlacementToDict(PlaceSources(config)); },
        nb::arg("config"),
        "Where the job's sources are served (service/hosting.h): {sources: node | planner "
        "| actors, hosts, host_of_source, sources_of_host, standby}.");

  // --- The wire (service/wire.h), for tools that count what crosses it ---
  m.def("slice_step_plan",
        [](Int64Array plan, std::vector<int64_t> buckets) {
          return OwnedArray(
              ValueOrThrow(SliceStepPlan(plan.data(), plan.shape(0), buckets)));
        },
        nb::arg("plan"), nb::arg("buckets"),
        "The part of an encoded plan holding `buckets` only (what a node's constructor "
        "receives).");
  m.def("piece_requests",
        [](Int64Array plan, int64_t bucket, int32_t num_sources) {
          const StepPlan part = ValueOrThrow(DecodeBucket(plan.data(), plan.shape(0), bucket));
          nb::list out;
          for (auto& r : PieceRequests(part, bucket, num_sources)) {
            out.append(OwnedArray(std::move(r)));
          }
          return out;
        },
        nb::arg("plan"), nb::arg("bucket"), nb::arg("num_sources"),
        "Per source, the piece requests (int64 arrays) of `bucket` of an encoded plan.");

  // --- The planner ---
  nb::class_<PlannerHandle>(m, "PlannerService",
                            "The planner over metadata-only source streams, handing out "
                            "each step's plan by number (service/planner_service.h).")
      .def("plan",
           [](PlannerHandle& h, int64_t step, double timeout_s,
              std::optional<std::vector<int64_t>> buckets) {
             Result<std::shared_ptr<const PlannedStep>> planned;
             Result<std::vector<int64_t>> slice;
             {
               GilRelease release;
               planned = h.service->Plan(step, timeout_s);
               if (planned.ok() && buckets) {
                 slice = SliceStepPlan((*planned)->encoded.data(),
                                       (*planned)->encoded.size(), *buckets);
               }
             }
             auto p = ValueOrThrow(std::move(planned));
             nb::dict d;
             d["step"] = p->step;
             d["plan"] = buckets ? OwnedArray(ValueOrThrow(std::move(slice))) : MessageView(p);
             d["state_before"] = p->state_before_json;
             d["state_after"] = p->state_after_json;
             d["figures"] = FiguresToDict(p->figures);
             return d;
           },
           nb::arg("step"), nb::arg("timeout_s"), nb::arg("buckets").none() = nb::none(),
           "Step `step`'s plan: {step, plan (int64 message; the slice of `buckets` when "
           "given), state_before, state_after, figures}. Waits while it is planned, plans "
           "it again from a checkpoint when it is no longer held.")
      .def("attach",
           [](PlannerHandle& h, const std::string& client) {
             Result<int64_t> attached;
             {
               GilRelease release;
               attached = h.service->Attach(client);
             }
             return ValueOrThrow(std::move(attached));  // raises with the GIL held
           },
           nb::arg("client"),
           "Attaches a rank; returns the ranks attached after. ConnectionError once the "
           "job ended (its last rank detached).")
      .def("detach",
           [](PlannerHandle& h, const std::string& client) {
             GilRelease release;
             return h.service->Detach(client);
           },
           nb::arg("client"), "Detaches a rank; returns the ranks attached after.")
      .def("figures",
           [](const PlannerHandle& h) {
             PlannerService::Figures f;
             std::vector<SourceProfile> profiles;
             std::vector<ShareChange> shares;
             std::vector<ProfileSpan> timeline;
             std::vector<int64_t> skipped_files;
             {
               GilRelease release;
               f = h.service->figures();
               profiles = h.service->sources().profiles();
               shares = h.service->share_changes();
               timeline = h.service->timeline();
               skipped_files = h.service->sources().skipped_files();
             }
             nb::dict d;
             d["planned_through"] = f.planned_through;
             d["held_steps"] = f.held_steps;
             d["replayed_steps"] = f.replayed_steps;
             d["restored_from"] = f.restored_from;
             d["clients"] = f.clients;
             // The planner's source streams: what reading each source has cost here.
             nb::dict profile;
             for (size_t i = 0; i < profiles.size() && i < h.config->sources.size(); ++i) {
               profile[h.config->sources[i].name.c_str()] = ProfileToDict(profiles[i]);
             }
             d["source_profile"] = profile;
             // Files skipped in whole or part (on_error: skip), per source, as
             // report.json.
             nb::dict skipped;
             for (size_t i = 0; i < skipped_files.size() && i < h.config->sources.size();
                  ++i) {
               skipped[h.config->sources[i].name.c_str()] = skipped_files[i];
             }
             d["skipped_files"] = skipped;
             std::vector<std::string> names;
             for (const auto& src : h.config->sources) names.push_back(src.name);
             if (!shares.empty()) d["source_allocation"] = SharesToList(shares, names);
             if (!timeline.empty()) d["source_timeline"] = TimelineToList(timeline, names);
             return d;
           })
      .def("stop", [](PlannerHandle& h) {
        GilRelease release;
        h.service->Stop();
      });
  m.def("make_planner_service",
        [](const Config& config, const std::string& state_json, const std::string& journal,
           nb::object commit, bool read_payloads) {
          auto handle = std::make_unique<PlannerHandle>();
          handle->config = std::make_unique<Config>(config);
          PlannerState start = Planner::InitialState(config);
          if (!state_json.empty()) {
            int64_t consumed = 0;
            start = ValueOrThrow(PlannerStateFromJson(state_json, config, &consumed));
          }
          PlannerService::Options options =
              read_payloads ? CoHostedPlannerOptions(config) : SharedPlannerOptions(config);
          if (!commit.is_none()) {
            handle->commit = std::make_unique<Callback>(std::move(commit));
            Callback* fn = handle->commit.get();
            options.commit = [fn](const std::string& text) {
              if (PythonExiting()) return;
              nb::gil_scoped_acquire gil;
              try {
                fn->fn()(text);
              } catch (nb::python_error& e) {
                e.discard_as_unraisable("braid: committing the planner's journal");
              }
            };
          }
          Result<std::unique_ptr<PlannerService>> service;
          {
            GilRelease release;
            const Config& c = *handle->config;
            PlannerService::OpenSources open = PlannerService::MetadataOnly(c);
            if (read_payloads) {
              open = [&c](const PlannerState& at) {
                return SourceSet::Open(c, at, SourceService::Stream::kPayloads,
                                       /*serve=*/false);
              };
            }
            service = PlannerService::Make(c, start, std::move(open), std::move(options),
                                           journal);
          }
          handle->service = ValueOrThrow(std::move(service));
          return handle;
        },
        nb::arg("config"), nb::arg("state_json") = "", nb::arg("journal") = "",
        nb::arg("commit").none() = nb::none(), nb::arg("read_payloads") = false,
        "The planner service of a job that starts at `state_json` (its consumed "
        "micro-batches ignored: it plans whole steps), restored from `journal` when "
        "given; commit(journal) receives every change of the journal. read_payloads: "
        "its streams read the payloads too, for a constructor in the same process "
        "(service/hosting.h, CoHostedPlannerOptions).");

  // --- The sources' payloads ---
  nb::class_<SourceHost>(m, "SourceHost", "The payloads of the sources a process serves.")
      .def(
          "serve_from_plans",
          [](SourceHost& h, PlannerHandle& planner) {
            PlannerService* service = planner.service.get();
            h.sources->ServeFromPlans(
                [service](int32_t source, int32_t file, int64_t row) {
                  return service->KeptPayload(source, file, row);
                });
          },
          nb::arg("planner"), nb::keep_alive<1, 2>(),
          "Answers fetches from the payloads of the plans `planner` (a planner service "
          "in this process whose streams read payloads) holds, before reading a row "
          "again.")
      .def("fetch",
           [](SourceHost& h, const nb::dict& requests) {
             std::vector<std::pair<int32_t, Int64Array>> asked;
             for (auto [key, value] : requests) {
               asked.emplace_back(nb::cast<int32_t>(key), nb::cast<Int64Array>(value));
             }
             std::vector<Result<PieceReply>> replies;
             {
               GilRelease release;
               for (const auto& [source, reqs] : asked) {
                 SourceService* s = h.sources->find(source);
                 if (s == nullptr) {
                   replies.push_back(ConfigError("sources[" + std::to_string(source) + "]",
                                                 "not served by this process"));
                 } else if (reqs.shape(0) % kRequestFields != 0) {
                   replies.push_back(DataError("piece requests", "not a multiple of " +
                                                                     std::to_string(
                                                                         kRequestFields) +
                                                                     " values"));
                 } else {
                   replies.push_back(s->Fetch(reqs.data(),
                                              int64_t(reqs.shape(0)) / kRequestFields));
                 }
               }
             }
             nb::dict out;
             for (size_t k = 0; k < asked.size(); ++k) {
               out[nb::int_(asked[k].first)] =
                   TupleFromReply(ValueOrThrow(std::move(replies[k])));
             }
             return out;
           },
           nb::arg("requests"),
           "Per source, (tokens int32, offsets int64, loss_mask uint8 or None, images int64 "
           "or None, image_bytes uint8 or None, paths uint8 or None) for its piece "
           "requests (images still encoded).")
      .def("status", [](const SourceHost& h) {
        nb::dict d;
        std::vector<int32_t> sources;
        int64_t requests = 0, cached = 0;
        for (const auto& s : h.sources->services()) {
          sources.push_back(s->source_index());
          requests += s->requests();
          cached += s->cached_bytes();
        }
        d["sources"] = sources;
        d["requests"] = requests;
        d["cached_bytes"] = cached;
        // Per source served here: what its fetches cost (ServeProfile).
        nb::dict serving;
        for (const auto& s : h.sources->services()) {
          const size_t i = size_t(s->source_index());
          if (i < h.names.size()) serving[h.names[i].c_str()] = ServeToDict(s->serve_profile());
        }
        d["source_serving"] = serving;
        return d;
      });
  m.def("make_source_host",
        [](const Config& config, const std::vector<int32_t>& sources) {
          for (int32_t s : sources) {
            if (s < 0 || size_t(s) >= config.sources.size()) {
              ThrowStatus(ConfigError("sources", "no source " + std::to_string(s)));
            }
          }
          Result<std::unique_ptr<SourceSet>> set;
          {
            GilRelease release;
            set = SourceSet::Open(config, Planner::InitialState(config),
                                  SourceService::Stream::kNone, /*serve=*/true, sources);
          }
          SourceHost host;
          host.sources = ValueOrThrow(std::move(set));
          for (const auto& s : config.sources) host.names.push_back(s.name);
          return host;
        },
        nb::arg("config"), nb::arg("sources"),
        "Serves the payloads of `sources` (a row-group cache of each source's share of "
        "runtime.memory_bytes).");

  // --- A node's constructor ---
  nb::class_<ViewHandle>(m, "DeliveredView", "One view of one micro-batch, built once.")
      .def("arrays", [](const ViewHandle& v) { return BatchToDict(v.view->batch()); },
           "The view's tensors as NumPy arrays (no copy; shared by its receivers).")
      .def_prop_ro("state_before",
                   [](const ViewHandle& v) {
                     return StateJsonOf(v.view->step(), false, *v.config);
                   })
      .def_prop_ro("state_after",
                   [](const ViewHandle& v) {
                     return StateJsonOf(v.view->step(), true, *v.config);
                   })
      .def("attachment",
           [](const ViewHandle& v, nb::object make) {
             auto made = std::make_shared<Callback>(std::move(make));
             std::shared_ptr<void> held;
             {
               // Not under the GIL: another receiver of the view may be making it now.
               GilRelease release;
               held = v.view->Attachment([&made]() -> std::shared_ptr<void> {
                 nb::gil_scoped_acquire gil;
                 auto* object = new nb::object(made->fn()());
                 return std::shared_ptr<void>(object, [](void* p) {
                   if (!PythonAlive()) return;  // left to the interpreter's end
                   nb::gil_scoped_acquire g;
                   delete static_cast<nb::object*>(p);
                 });
               });
             }
             return *static_cast<nb::object*>(held.get());
           },
           nb::arg("make"),
           "The transport's form of this view: make() once, for every receiver; released "
           "with the view.")
      .def("node_file",
           [](const ViewHandle& v) {
             std::shared_ptr<void> held;
             Status failed;
             {
               GilRelease release;
               held = v.view->Attachment([&]() -> std::shared_ptr<void> {
                 auto file = ViewFile::Write(v.view->shared_batch(),
                                             StateJsonOf(v.view->step(), false, *v.config),
                                             StateJsonOf(v.view->step(), true, *v.config));
                 if (!file.ok()) {
                   failed = file.status();
                   return nullptr;
                 }
                 return *std::move(file);
               });
             }
             if (held == nullptr) {
               ThrowStatus(failed.ok() ? Status::IOError("node delivery: no view file")
                                       : failed);
             }
             const auto* file = static_cast<const ViewFile*>(held.get());
             return nb::make_tuple(file->header_fd(), file->header_size(), file->files());
           },
           "Node delivery's form of this view (transport/view_file.h), made once for every "
           "receiver and released with the view: (header_fd, header_size, [tensor file "
           "fds]); the descriptors stay the view's (send them, do not close them).");
  nb::class_<ConstructorHandle>(m, "ConstructorService",
                                "A node's constructor (service/constructor_service.h).")
      .def("view",
           [](ConstructorHandle& h, int64_t step, int64_t bucket, int64_t micro_batch,
              int64_t pp, int64_t cp, bool split_context, bool whole) {
             Result<std::shared_ptr<const DeliveredView>> view;
             {
               GilRelease release;
               view = h.service->View(
                   ViewKey{step, bucket, micro_batch, pp, cp, split_context, whole});
             }
             return ViewHandle{ValueOrThrow(std::move(view)), h.config.get()};
           },
           nb::arg("step"), nb::arg("bucket"), nb::arg("micro_batch"), nb::arg("pp"),
           nb::arg("cp"), nb::arg("split_context"), nb::arg("whole") = false,
           "The view of micro-batch `micro_batch` of `bucket` at `step` for pipeline stage "
           "`pp`, context rank `cp` (the same for every TP rank), built once; `whole`: "
           "the micro-batch itself, every tensor, whole sequences (pp, cp, split_context "
           "ignored).")
      .def("figures",
           [](const ConstructorHandle& h) {
             ConstructorService::Figures f;
             {
               GilRelease release;
               f = h.service->figures();
               if (h.planner != nullptr) {
                 // Built from the planner's own streams: their rows blanked under
                 // on_error: skip reached this constructor blank.
                 const auto blanked = h.planner->service->sources().blanked_payloads();
                 for (size_t i = 0; i < blanked.size(); ++i) {
                   if (blanked[i] > 0) f.blanked_pieces[int32_t(i)] += blanked[i];
                 }
               }
             }
             nb::dict d;
             d["newest_step"] = f.newest_step;
             d["built_buckets"] = f.built_buckets;
             d["rebuilt_buckets"] = f.rebuilt_buckets;
             d["shadow_failovers"] = f.standby_requests;
             d["held_builds"] = f.held_builds;
             d["held_views"] = f.held_views;
             d["plan_bytes"] = f.plan_bytes;
             d["blanked_pieces"] = f.blanked_pieces;
             return d;
           })
      .def("stop", [](ConstructorHandle& h) {
        GilRelease release;
        h.service->Stop();
      });
  m.def("make_constructor_service",
        [](const Config& config, nb::object plan, nb::object send, nb::object wait,
           nb::object forget, SourceHost* local, PlannerHandle* planner) {
          auto handle = std::make_unique<ConstructorHandle>();
          handle->config = std::make_unique<Config>(config);
          ConstructorService::Options options = NodeConstructorOptions(config);
          std::shared_ptr<PieceSource> pieces = std::make_shared<PyPieceSource>(
              std::move(send), std::move(wait), std::move(forget));
          if (local != nullptr) {
            handle->local = local->sources;
            std::set<int32_t> hosts;
            for (const auto& s : handle->local->services()) {
              hosts.insert(options.host_of_source[size_t(s->source_index())]);
            }
            pieces = std::make_shared<RoutedPieces>(
                std::move(hosts), std::make_shared<LocalPieces>(handle->local.get()),
                std::move(pieces));
          }
          std::shared_ptr<PlanSource> plans;
          if (planner != nullptr) {  // the planner of this process: its plans themselves
            handle->planner = planner;
            plans = std::make_shared<InProcessPlans>(planner->service.get(),
                                                     config.runtime.timeout_s);
          } else {
            plans = std::make_shared<PyPlanSource>(*handle->config, std::move(plan));
          }
          handle->service = ValueOrThrow(ConstructorService::Make(
              *handle->config, std::move(options), std::move(plans), std::move(pieces)));
          return handle;
        },
        nb::arg("config"), nb::arg("plan"), nb::arg("send"), nb::arg("wait"),
        nb::arg("forget"), nb::arg("local").none() = nb::none(),
        nb::arg("planner").none() = nb::none(), nb::keep_alive<0, 6>(),
        nb::keep_alive<0, 7>(),
        "A node's constructor service: plans from `planner` (a PlannerService of this "
        "process) or else plan(step, buckets) -> (message, state_before, state_after); "
        "pieces from send/wait/forget (hosts served by `local`, a SourceHost of this "
        "process, in process).");

  // --- The client ---
  nb::class_<RankCursor>(m, "RankCursor",
                         "A rank's place in its stream (client/rank_cursor.h).")
      .def("next",
           [](RankCursor& c) {
             const RankCursor::Position p = c.Next();
             return nb::make_tuple(p.step, p.bucket, p.micro_batch, p.index);
           },
           "(step, bucket, micro_batch, index) of the next micro-batch; moves past it.")
      .def("per_step", &RankCursor::per_step, nb::arg("step"))
      .def_prop_ro("start_json", &RankCursor::start_json)
      .def("state_after",
           [](const RankCursor& c, const Config& config, int64_t step, int64_t index,
              const std::string& before, const std::string& after) {
             RankCursor::Position at;
             at.step = step;
             at.index = index;
             return c.StateAfter(at, ValueOrThrow(PlannerStateFromJson(before, config)),
                                 ValueOrThrow(PlannerStateFromJson(after, config)));
           },
           nb::arg("config"), nb::arg("step"), nb::arg("index"), nb::arg("state_before"),
           nb::arg("state_after"),
           "The state right after receiving micro-batch `index` of `step` (planned from "
           "state_before to state_after).");
  m.def("make_rank_cursor",
        [](const Config& config, const std::string& state_json,
           std::vector<int64_t> buckets) {
          return ValueOrThrow(RankCursor::Make(config, state_json, std::move(buckets)));
        },
        nb::arg("config"), nb::arg("state_json"), nb::arg("buckets"),
        nb::keep_alive<0, 1>());

  nb::class_<RunRecorder>(m, "RunRecorder",
                          "A run's summary built step by step (cli/job.h).")
      .def(nb::init<const Config&>(), nb::arg("config"), nb::keep_alive<1, 2>())
      .def("add_step",
           [](RunRecorder& r, const nb::dict& figures, int64_t tokens, int64_t micro_batches,
              double step_seconds, double elapsed) {
             r.AddStep(FiguresFromDict(figures), tokens, micro_batches, step_seconds,
                       elapsed);
           },
           nb::arg("figures"), nb::arg("tokens"), nb::arg("micro_batches"),
           nb::arg("step_seconds"), nb::arg("elapsed"))
      .def("summary",
           [](RunRecorder& r, int64_t peak_rss_bytes) {
             r.summary().peak_rss_bytes = peak_rss_bytes;
             return SummaryToDict(r.summary());
           },
           nb::arg("peak_rss_bytes"), "The summary so far, as run_job returns it.");

  m.def("state_position",
        [](const Config& config, const std::string& state_json) {
          int64_t consumed = 0;
          auto state = ValueOrThrow(PlannerStateFromJson(state_json, config, &consumed));
          return nb::make_tuple(state.step, consumed);
        },
        nb::arg("config"), nb::arg("state_json"),
        "(step, consumed micro-batches of that step) of a state.");
}

}  // namespace braid::python
