// The embedded runtime: a rank's stream of micro-batches, and the CLI's whole jobs.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <mutex>
#include <optional>

#include "braid/cli/job.h"
#include "braid/plan/planner.h"
#include "braid/plan/step_plan.h"
#include "braid/runtime/engine.h"
#include "numpy_util.h"
#include "status_caster.h"
#include "thread_states.h"

namespace nb = nanobind;

namespace braid::python {
nb::dict ProfileToDict(const SourceProfile& p) {
  nb::dict d;
  d["samples"] = p.samples;
  d["tokens"] = p.tokens;
  d["rows_read"] = p.rows_read;
  d["bytes_read"] = p.bytes_read;
  d["read_cpu_s"] = 1e-9 * double(p.read_cpu_ns);
  d["payloads_finished"] = p.payloads_finished;
  d["finish_cpu_s"] = 1e-9 * double(p.finish_cpu_ns);
  d["consumer_wait_s"] = 1e-9 * double(p.consumer_wait_ns);
  d["cpu_s_per_sample"] = p.cpu_s_per_sample();
  d["cpu_s_per_token"] = p.cpu_s_per_token();
  d["bytes_per_sample"] = p.bytes_per_sample();
  d["held_bytes"] = p.held_bytes;
  d["peak_held_bytes"] = p.peak_held_bytes;
  return d;
}

nb::dict ServeToDict(const ServeProfile& p) {
  nb::dict d;
  d["calls"] = p.calls;
  d["pieces"] = p.pieces;
  d["tokens_sent"] = p.tokens_sent;
  d["bytes_sent"] = p.bytes_sent;
  d["units_read"] = p.units_read;
  d["bytes_read"] = p.bytes_read;
  d["rows_transformed"] = p.rows_transformed;
  d["pieces_from_plans"] = p.pieces_from_plans;
  d["cpu_s"] = 1e-9 * double(p.cpu_ns);
  d["cached_bytes"] = p.cached_bytes;
  d["peak_cached_bytes"] = p.peak_cached_bytes;
  return d;
}

nb::list TimelineToList(const std::vector<ProfileSpan>& spans,
                        const std::vector<std::string>& names) {
  nb::list out;
  for (const ProfileSpan& span : spans) {
    nb::dict sources;
    for (size_t i = 0; i < span.sources.size() && i < names.size(); ++i) {
      const SourceProfile& p = span.sources[i];
      nb::dict d;
      d["cpu_s"] = 1e-9 * double(p.read_cpu_ns + p.finish_cpu_ns);
      d["wait_s"] = 1e-9 * double(p.consumer_wait_ns);
      d["samples"] = p.samples;
      d["tokens"] = p.tokens;
      d["bytes_read"] = p.bytes_read;
      // The thread time its loaders had, and how much of it their read steps used.
      const int64_t thread_ns = i < span.thread_ns.size() ? span.thread_ns[i] : 0;
      d["thread_s"] = 1e-9 * double(thread_ns);
      d["busy"] = thread_ns > 0 ? nb::cast(double(p.read_cpu_ns) / double(thread_ns))
                                : nb::none();
      sources[names[i].c_str()] = d;
    }
    nb::dict entry;
    entry["steps"] = nb::make_tuple(span.first_step, span.end_step);
    entry["wall_s"] = 1e-9 * double(span.wall_ns);
    entry["sources"] = sources;
    out.append(entry);
  }
  return out;
}

nb::list SharesToList(const std::vector<ShareChange>& changes,
                      const std::vector<std::string>& names) {
  nb::list out;
  for (const ShareChange& c : changes) {
    nb::dict sources;
    for (size_t i = 0; i < c.shares.size() && i < names.size(); ++i) {
      nb::dict share;
      share["workers"] = c.shares[i].workers;
      share["read_ahead_bytes"] = c.shares[i].read_ahead_bytes;
      share["active"] = c.shares[i].active;
      sources[names[i].c_str()] = share;
    }
    nb::dict entry;
    entry["step"] = c.step;
    entry["sources"] = sources;
    out.append(entry);
  }
  return out;
}

nb::dict SummaryToDict(const RunSummary& s) {
  nb::dict d;
  d["steps"] = s.steps;
  d["tokens"] = s.tokens;
  d["micro_batches"] = s.micro_batches;
  d["seconds"] = s.seconds;
  d["tokens_per_s"] = s.tokens_per_s;
  d["steady_tokens_per_s"] = s.steady_tokens_per_s;
  d["imbalance_mean"] = s.imbalance_mean;
  d["imbalance_max"] = s.imbalance_max;
  d["sequential_imbalance_mean"] = s.sequential_imbalance_mean;
  d["loader_peak_rss_bytes"] = s.peak_rss_bytes;
  d["padding_tokens"] = s.padding_tokens;
  d["multimodal_cut"] = s.multimodal_cut;
  d["multimodal_deferred"] = s.multimodal_deferred;
  nb::dict tokens, share, target, skipped, blanked, skipped_files, rows_unknown;
  for (size_t i = 0; i < s.source_names.size(); ++i) {
    const char* name = s.source_names[i].c_str();
    tokens[name] = s.source_tokens[i];
    if (i < s.source_share.size()) share[name] = s.source_share[i];
    target[name] = s.target_share[i];
    skipped[name] = s.skipped[i];
    blanked[name] = i < s.blanked.size() ? s.blanked[i] : 0;
    skipped_files[name] = i < s.skipped_files.size() ? s.skipped_files[i] : 0;
    rows_unknown[name] =
        i < s.skipped_files_rows_unknown.size() ? s.skipped_files_rows_unknown[i] : 0;
  }
  d["source_tokens"] = tokens;
  d["source_share"] = share;
  d["target_share"] = target;
  d["skipped"] = skipped;
  d["blanked"] = blanked;
  d["skipped_files"] = skipped_files;
  d["skipped_files_rows_unknown"] = rows_unknown;
  if (!s.source_profile.empty()) {  // the embedded runtime's (Ray's: the planner host's)
    nb::dict profile;
    for (size_t i = 0; i < s.source_names.size() && i < s.source_profile.size(); ++i) {
      profile[s.source_names[i].c_str()] = ProfileToDict(s.source_profile[i]);
    }
    d["source_profile"] = profile;
  }
  if (!s.share_changes.empty()) {
    d["source_allocation"] = SharesToList(s.share_changes, s.source_names);
  }
  if (!s.source_timeline.empty()) {
    d["source_timeline"] = TimelineToList(s.source_timeline, s.source_names);
  }
  d["step_imbalance"] = s.step_imbalance;
  d["step_seconds"] = s.step_seconds;
  // Planner: per source, mean context / bound and share drift (docs/plan-format.md).
  nb::dict context, drift, drift_max;
  for (size_t i = 0; i < s.source_names.size(); ++i) {
    const char* name = s.source_names[i].c_str();
    context[name] = i < s.source_context.size() ? s.source_context[i] : 1.0;
    drift[name] = i < s.source_drift.size() ? s.source_drift[i] : 0.0;
    drift_max[name] = i < s.source_drift_max.size() ? s.source_drift_max[i] : 0.0;
  }
  d["source_context"] = context;
  d["source_drift"] = drift;
  d["source_drift_max"] = drift_max;
  d["max_seq_len"] = s.max_seq_len;
  return d;
}

namespace {

// A rank's stream on the embedded runtime (python/braid/stream.py's protocol: next,
// state, restore, close): an Engine, made again from a state by restore().
//
// Thread-safe: close() may come from another thread while next() waits (a launcher's
// signal handler, a finalizer): next() holds its own reference to the engine, which
// Stop() makes return Cancelled, and the engine goes when the last holder lets go.
//
// Signals: Python runs its handlers on the main thread only, between two bytecodes. While
// next() waits there, the engine asks CheckSignals every 100 ms; a handler that raised
// (KeyboardInterrupt; a SIGTERM handler's SystemExit, after it closed the Loader) ends
// the wait, and next() raises it with the stream where it was.
class EmbeddedStream {
 public:
  // REQUIRES: the GIL.
  EmbeddedStream(const Config& config, Engine::Options options)
      : config_(config),
        options_(std::move(options)),
        main_thread_(nb::cast<unsigned long>(
            nb::module_::import_("threading").attr("main_thread")().attr("ident"))) {}

  Status Open(const std::string& state_json) {
    Engine::Options options = options_;
    options.state_json = state_json;
    options.interrupt = [this] { return CheckSignals(); };
    auto engine = Engine::Make(config_, std::move(options));
    if (!engine.ok()) return engine.status();
    std::lock_guard<std::mutex> lock(mu_);
    engine_ = std::shared_ptr<Engine>(std::move(*engine));
    return Status::OK();
  }
  std::shared_ptr<Engine> engine() {
    std::lock_guard<std::mutex> lock(mu_);
    if (engine_ == nullptr) ThrowStatus(ConfigError("stream", "closed"));
    return engine_;
  }
  std::string state() const {
    std::lock_guard<std::mutex> lock(mu_);
    return engine_ ? engine_->StateJson() : closed_state_;
  }
  // What a signal handler raised during the last wait, if anything (taken once).
  // REQUIRES: the GIL.
  std::optional<nb::python_error> TakeRaised() {
    std::lock_guard<std::mutex> lock(mu_);
    std::optional<nb::python_error> out = std::move(raised_);
    raised_.reset();
    return out;
  }
  void Close() {
    std::lock_guard<std::mutex> closing(close_mu_);  // one close at a time
    std::shared_ptr<Engine> engine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      engine = engine_;
    }
    if (engine == nullptr) return;
    engine->Stop();
    std::lock_guard<std::mutex> lock(mu_);
    closed_state_ = engine->StateJson();
    engine_.reset();
  }

 private:
  // On the main thread, without the GIL: runs Python's pending signal handlers.
  Status CheckSignals() {
    if (PyThread_get_thread_ident() != main_thread_ || PythonExiting())
      return Status::OK();
    nb::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return Status::OK();
    nb::python_error raised;  // takes the error the handler set
    std::lock_guard<std::mutex> lock(mu_);
    raised_.emplace(std::move(raised));
    return Status::Cancelled("interrupted by a signal");
  }

  const Config config_;
  const Engine::Options options_;
  const unsigned long main_thread_;  // the interpreter's main thread
  std::mutex close_mu_;
  mutable std::mutex mu_;
  std::shared_ptr<Engine> engine_;          // GUARDED_BY(mu_)
  std::string closed_state_;                // GUARDED_BY(mu_)
  std::optional<nb::python_error> raised_;  // GUARDED_BY(mu_)
};

nb::dict ToDict(const Batch& batch) {
  nb::dict d;
  for (const Tensor& t : batch.tensors) d[t.name.c_str()] = ToNumpy(t);
  return d;
}

}  // namespace

void RegisterRuntime(nb::module_& m) {
  nb::class_<EmbeddedStream>(
      m, "Engine",
      "A rank's stream on the embedded runtime (every role in this "
      "process). Yields micro-batches as dicts of NumPy arrays (no "
      "copy).")
      .def(
          "next",
          [](EmbeddedStream& s) {
            std::shared_ptr<Engine> e = s.engine();
            Result<std::shared_ptr<const Batch>> result;
            {
              GilRelease release;  // at exit, a daemon thread sleeps here
              result = e->Next();
              e.reset();  // the last reference after a close(): torn down here
            }
            if (auto raised = s.TakeRaised()) throw std::move(*raised);
            return ToDict(*ValueOrThrow(std::move(result)));
          },
          "The next micro-batch (blocks until built).")
      .def(
          "next_views",
          [](EmbeddedStream& s,
             const std::vector<std::tuple<int64_t, int64_t, int64_t>>& coords) {
            std::shared_ptr<Engine> e = s.engine();
            std::vector<RankCoords> ranks;
            for (const auto& [tp, pp, cp] : coords) {
              ranks.push_back(RankCoords{/*dp=*/0, tp, pp, cp});
            }
            Result<std::vector<std::shared_ptr<const Batch>>> result;
            {
              GilRelease release;
              result = e->NextViews(ranks);
              e.reset();
            }
            if (auto raised = s.TakeRaised()) throw std::move(*raised);
            nb::list out;
            for (const auto& view : ValueOrThrow(std::move(result)))
              out.append(ToDict(*view));
            return out;
          },
          nb::arg("coords"),
          "The views of the next micro-batch for several (tp, pp, cp) ranks of its DP "
          "group, from one build (TP/PP views share memory).")
      .def("state", &EmbeddedStream::state,
           "The state right after the last micro-batch returned, as JSON.")
      .def("state_json", &EmbeddedStream::state, "The same as state().")
      .def(
          "restore",
          [](EmbeddedStream& s, const std::string& state_json) {
            Status st;
            {
              GilRelease release;
              s.Close();
              st = s.Open(state_json);
            }
            ThrowIfError(st);
          },
          nb::arg("state_json"), "Continues the stream from `state_json` instead.")
      .def(
          "local_micro_batches_per_step",
          [](EmbeddedStream& s, int64_t step) {
            return s.engine()->local_micro_batches_per_step(step);
          },
          nb::arg("step"),
          "Micro-batches this engine yields at `step` (phases change it).")
      .def(
          "close",
          [](EmbeddedStream& s) {
            // Loader threads may wait for the GIL (Python transforms) before they end.
            GilRelease release;
            s.Close();
          },
          "Stops and joins every thread; later next() calls raise. Idempotent.")
      .def(
          "stop",
          [](EmbeddedStream& s) {
            GilRelease release;
            s.Close();
          },
          "The same as close().");

  m.def("make_engine",
        [](const Config& config, std::vector<int64_t> buckets, std::string state_json,
           std::optional<std::tuple<int64_t, int64_t, int64_t>> view,
           bool split_context) {
          Engine::Options options;
          options.buckets = std::move(buckets);
          if (view) {
            const auto [tp, pp, cp] = *view;
            options.view = RankCoords{/*dp=*/0, tp, pp, cp};
          }
          options.split_context = split_context;
          auto stream = std::make_unique<EmbeddedStream>(config, std::move(options));
          Status st;
          {
            GilRelease release;
            st = stream->Open(state_json);
          }
          ThrowIfError(st);
          return stream;
        },
        nb::arg("config"), nb::arg("buckets"), nb::arg("state_json") = "",
        nb::arg("view").none() = nb::none(), nb::arg("split_context") = true,
        "A stream of the micro-batches of `buckets`. view=(tp, pp, cp): next() returns "
        "that trainer rank's view of each micro-batch (docs/parallelism.md); "
        "split_context=False keeps whole sequences for CP ranks.");

  m.def("check_state",
        [](const Config& config, const std::string& state_json) {
          int64_t consumed = 0;
          auto state = PlannerStateFromJson(state_json, config, &consumed);
          ThrowIfError(state.status());
          return state->step;
        },
        nb::arg("config"), nb::arg("state_json"),
        "Validates a state against a config; returns its step.");

  m.def("initial_state_json",
        [](const Config& config) {
          return PlannerStateToJson(Planner::InitialState(config), config);
        },
        nb::arg("config"));

  m.def("plan_job",
        [](const Config& config, int64_t steps, const std::string& state_in,
           const std::function<void(const std::string&)>& on_line) {
          Result<std::string> result;
          // The Python exception that stopped the output (BrokenPipeError,
          // KeyboardInterrupt), raised again as it was once the planner is gone.
          std::optional<nb::python_error> output_error;
          {
            GilRelease release;
            result = RunPlanJob(config, steps, state_in, [&](const std::string& line) {
              nb::gil_scoped_acquire acquire;
              try {
                on_line(line);
              } catch (nb::python_error& e) {
                output_error.emplace(std::move(e));
                return Status::Cancelled("the output callback raised");
              }
              return Status::OK();
            });
          }
          if (output_error) throw std::move(*output_error);
          return ValueOrThrow(std::move(result));
        },
        nb::arg("config"), nb::arg("steps"), nb::arg("state_in"), nb::arg("on_line"),
        "Plans `steps` steps from metadata; calls on_line(json) per step; returns the "
        "final state JSON.");

  m.def("run_job",
        [](const Config& config, int64_t steps,
           const std::function<void(nb::dict)>& progress) {
          Result<RunSummary> result;
          {
            GilRelease release;
            result = RunJob(config, steps, [&](const RunSummary& s) {
              if (!progress) return;
              nb::gil_scoped_acquire acquire;
              progress(SummaryToDict(s));
            });
          }
          return SummaryToDict(ValueOrThrow(std::move(result)));
        },
        nb::arg("config"), nb::arg("steps"), nb::arg("progress").none() = nb::none(),
        "Runs the whole pipeline with every DP rank simulated; returns the summary.");
}

}  // namespace braid::python
