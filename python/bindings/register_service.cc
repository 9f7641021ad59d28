// The roles as services, for the Ray runtime's actors (python/braid/ray/): the planner
// service, a source's payload service, and a constructor's decoded bucket plan. Messages
// are NumPy arrays (service/wire.h) so Ray moves them without pickling objects. Every
// blocking call releases the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "braid/client/topology.h"
#include "braid/construct/constructor.h"
#include "braid/construct/views.h"
#include "braid/plan/step_plan.h"
#include "braid/cli/job.h"
#include "braid/service/payload_service.h"
#include "braid/service/planner_service.h"
#include "braid/service/wire.h"
#include "braid/exec/budget.h"
#include "numpy_util.h"
#include "status_caster.h"
#include "thread_states.h"

namespace nb = nanobind;

namespace braid::python {
namespace {

using Int64Array = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int32Array = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using UInt8Array = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using FloatArray = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A 1-D NumPy array that owns `values` (moved to the heap, freed with the array).
template <typename T>
nb::object OwnedArray(std::vector<T> values) {
  auto* keep = new std::vector<T>(std::move(values));
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  const size_t shape[1] = {keep->size()};
  return nb::ndarray<nb::numpy, T>(keep->data(), 1, shape, owner).cast();
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

struct PlannerHandle {
  Config config;
  std::unique_ptr<PlannerService> service;
};

struct BucketPlan {
  StepPlan plan;
  int64_t bucket = 0;
};

}  // namespace

void RegisterService(nb::module_& m) {
  nb::class_<PlannerHandle>(m, "PlannerService",
                            "The planner over metadata-only source loaders (no payloads).")
      .def("next",
           [](PlannerHandle& h) {
             Result<StepPlan> plan;
             std::vector<int64_t> encoded;
             {
               GilRelease release;
               plan = h.service->Next();
               if (plan.ok()) encoded = EncodeStepPlan(*plan);
             }
             ThrowIfError(plan.status());
             nb::dict d;
             d["step"] = plan->step;
             d["plan"] = OwnedArray(std::move(encoded));
             d["state_before"] = PlannerStateToJson(plan->state_before, h.config);
             d["state_after"] = PlannerStateToJson(plan->state_after, h.config);
             d["figures"] = FiguresToDict(FiguresOf(*plan, h.config));
             return d;
           },
           "Plans the next step: {step, plan (int64 message), state_before, state_after, "
           "figures (what a run's summary takes from it)}.");
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

  m.def("make_planner_service",
        [](const Config& config, const std::string& state_json) {
          auto handle = std::make_unique<PlannerHandle>();
          handle->config = config;
          PlannerState start = Planner::InitialState(config);
          if (!state_json.empty()) {
            int64_t consumed = 0;
            start = ValueOrThrow(PlannerStateFromJson(state_json, config, &consumed));
          }
          Result<std::unique_ptr<PlannerService>> service;
          {
            GilRelease release;
            service = PlannerService::Make(config, start);
          }
          handle->service = ValueOrThrow(std::move(service));
          return handle;
        },
        nb::arg("config"), nb::arg("state_json") = "",
        "The planner service from a state (its consumed micro-batches ignored: it plans "
        "whole steps).");

  nb::class_<PayloadService>(m, "PayloadService",
                             "One source's payloads, fetched by key (file, row, range).")
      .def("fetch",
           [](PayloadService& s, Int64Array requests) {
             if (requests.shape(0) % kRequestFields != 0) {
               ThrowStatus(DataError("piece requests", "not a multiple of " +
                                                           std::to_string(kRequestFields) +
                                                           " values"));
             }
             Result<PieceReply> reply;
             {
               GilRelease release;
               reply = s.Fetch(requests.data(),
                               int64_t(requests.shape(0)) / kRequestFields);
             }
             PieceReply r = ValueOrThrow(std::move(reply));
             nb::object mask = r.loss_mask.empty() ? nb::none()
                                                   : OwnedArray(std::move(r.loss_mask));
             nb::object images = nb::none(), image_bytes = nb::none(), paths = nb::none();
             if (!r.images.empty()) {
               images = OwnedArray(std::move(r.images));
               image_bytes = OwnedArray(std::move(r.image_bytes));
               paths = OwnedArray(std::move(r.paths));
             }
             return nb::make_tuple(OwnedArray(std::move(r.tokens)),
                                   OwnedArray(std::move(r.offsets)), mask, images,
                                   image_bytes, paths);
           },
           nb::arg("requests"),
           "(tokens int32, offsets int64, loss_mask uint8 or None, images int64 or None, "
           "image_bytes uint8 or None, paths uint8 or None) for the requests: "
           "BucketPlan.attach's arguments after the source (images still encoded).")
      .def_prop_ro("cached_bytes", &PayloadService::cached_bytes);
  m.def("make_payload_service",
        [](const Config& config, int32_t source, int64_t cache_bytes) {
          if (source < 0 || size_t(source) >= config.sources.size()) {
            ThrowStatus(ConfigError("sources", "no source " + std::to_string(source)));
          }
          if (cache_bytes <= 0) cache_bytes = SourceShares(config)[size_t(source)];
          Result<std::unique_ptr<PayloadService>> service;
          {
            GilRelease release;
            service = PayloadService::Make(config, source, cache_bytes);
          }
          return ValueOrThrow(std::move(service));
        },
        nb::arg("config"), nb::arg("source"), nb::arg("cache_bytes") = 0,
        "The payload service of one source; its row-group cache holds `cache_bytes` "
        "(0: the source's share of runtime.memory_bytes).");

  nb::class_<Batch>(m, "Batch", "A built micro-batch (C++ tensors).")
      .def_ro("step", &Batch::step)
      .def_ro("dp", &Batch::dp)
      .def_ro("micro_batch", &Batch::micro_batch)
      .def("arrays", [](const Batch& b) { return BatchToDict(b); },
           "The tensors as NumPy arrays (no copy).")
      .def("view",
           [](const Batch& b, const Config& config, int64_t tp, int64_t pp, int64_t cp,
              bool split_context) {
             Topology topology = config.topology;
             RankCoords coords = WithBucket(topology, RankCoords{0, tp, pp, cp}, b.dp);
             if (!split_context && topology.slices_context()) {
               topology.cp = 1;
               coords.cp = 0;
             }
             return BatchToDict(ValueOrThrow(ViewFor(b, topology, coords)));
           },
           nb::arg("config"), nb::arg("tp"), nb::arg("pp"), nb::arg("cp"),
           nb::arg("split_context") = true,
           "Trainer rank (tp, pp, cp)'s view, as the embedded runtime gives it.");

  nb::class_<BucketPlan>(m, "BucketPlan", "One bucket of one step, decoded for building.")
      .def_prop_ro("step", [](const BucketPlan& b) { return b.plan.step; })
      .def_prop_ro("micro_batches",
                   [](const BucketPlan& b) {
                     return b.plan.ranks[size_t(b.bucket)].micro_batches.size();
                   })
      .def("requests",
           [](const BucketPlan& b, int32_t num_sources) {
             nb::list out;
             for (auto& r : PieceRequests(b.plan, b.bucket, num_sources)) {
               out.append(OwnedArray(std::move(r)));
             }
             return out;
           },
           nb::arg("num_sources"), "Per source, its pieces' requests (int64 arrays).")
      .def("attach",
           [](BucketPlan& b, const Config& config, int32_t source, Int32Array tokens,
              Int64Array offsets, std::optional<UInt8Array> mask,
              std::optional<Int64Array> images, std::optional<UInt8Array> image_bytes,
              std::optional<UInt8Array> paths) {
             if (source < 0 || size_t(source) >= config.sources.size()) {
               ThrowStatus(ConfigError("sources", "no source " + std::to_string(source)));
             }
             auto reply = std::make_shared<PieceReply>();
             auto copy = [](auto* to, const auto& from) {
               to->assign(from.data(), from.data() + from.shape(0));
             };
             copy(&reply->tokens, tokens);
             copy(&reply->offsets, offsets);
             if (mask) copy(&reply->loss_mask, *mask);
             if (images) copy(&reply->images, *images);
             if (image_bytes) copy(&reply->image_bytes, *image_bytes);
             if (paths) copy(&reply->paths, *paths);
             Status st;
             std::vector<std::string> blanked;
             {
               GilRelease release;  // decodes the images
               st = AttachPieces(&b.plan, b.bucket, source, config.sources[size_t(source)],
                                 std::move(reply), &blanked);
             }
             ThrowIfError(st);
             return blanked;
           },
           nb::arg("config"), nb::arg("source"), nb::arg("tokens"), nb::arg("offsets"),
           nb::arg("loss_mask").none(), nb::arg("images").none() = nb::none(),
           nb::arg("image_bytes").none() = nb::none(), nb::arg("paths").none() = nb::none(),
           "Attaches a source's fetch reply to this bucket's pieces, decoding its images; "
           "returns the messages of pieces blanked under on_error: skip (an image that "
           "does not decode).")
      .def("build",
           [](const BucketPlan& b, int64_t micro_batch) {
             if (micro_batch < 0 ||
                 size_t(micro_batch) >= b.plan.ranks[size_t(b.bucket)].micro_batches.size()) {
               ThrowStatus(ConfigError("micro_batch", "out of range"));
             }
             Result<Batch> batch;
             {
               GilRelease release;
               batch = BuildMicroBatch(b.plan, b.bucket, micro_batch);
             }
             return ValueOrThrow(std::move(batch));
           },
           nb::arg("micro_batch"));
  m.def("decode_bucket",
        [](Int64Array plan, int64_t bucket) {
          BucketPlan b;
          b.bucket = bucket;
          b.plan = ValueOrThrow(DecodeBucket(plan.data(), plan.shape(0), bucket));
          return b;
        },
        nb::arg("plan"), nb::arg("bucket"));
  m.def("slice_step_plan",
        [](Int64Array plan, std::vector<int64_t> buckets) {
          return OwnedArray(
              ValueOrThrow(SliceStepPlan(plan.data(), plan.shape(0), buckets)));
        },
        nb::arg("plan"), nb::arg("buckets"),
        "The part of an encoded plan holding `buckets` only (what a node's constructor "
        "needs); decode_bucket refuses the others.");
  m.def("client_state_json",
        [](const Config& config, const std::string& before, const std::string& after,
           int64_t consumed, int64_t per_step) {
          auto b = ValueOrThrow(PlannerStateFromJson(before, config));
          auto a = ValueOrThrow(PlannerStateFromJson(after, config));
          return ClientStateJson(b, a, consumed, per_step, config);
        },
        nb::arg("config"), nb::arg("state_before"), nb::arg("state_after"),
        nb::arg("consumed"), nb::arg("per_step"),
        "The state after `consumed` of a rank's `per_step` micro-batches of a step.");
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
