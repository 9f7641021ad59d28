// The data plane builder (braid/dataplane.h): braid._core.DataPlane. The builder state lives
// in C++; this file converts Python values and raises the first error at the call that
// made it (braid.ConfigError naming the primitive).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <optional>

#include "braid/config/config.h"
#include "braid/config/job_config_internal.h"
#include "braid/dataplane.h"
#include "status_caster.h"

namespace nb = nanobind;

namespace braid::python {

namespace {

[[noreturn]] void Bad(const std::string& path, const std::string& what) {
  ThrowStatus(ConfigError(path, what));
}

double ToNumber(nb::handle v, const std::string& path) {
  if (nb::isinstance<nb::bool_>(v) ||
      !(nb::isinstance<nb::float_>(v) || nb::isinstance<nb::int_>(v))) {
    Bad(path, "must be a number");
  }
  return nb::cast<double>(v);
}

// A weight as YAML writes it: a number, {"schedule": [[step, w], ...]} or
// {"steps": [[step, w], ...]}. Value checks are DataPlane::Mix's.
WeightSchedule ToWeight(nb::handle v, const std::string& path) {
  WeightSchedule ws;
  if (!nb::isinstance<nb::dict>(v)) {
    ws.points = {{0, ToNumber(v, path)}};
    return ws;
  }
  nb::dict d = nb::borrow<nb::dict>(v);
  for (auto [key, value] : d) {
    const std::string k = nb::isinstance<nb::str>(key) ? nb::cast<std::string>(key) : "?";
    if (k != "schedule" && k != "steps") {
      Bad(path + "." + k, "unknown key (expected schedule or steps)");
    }
  }
  if (d.contains("schedule") && d.contains("steps")) {
    Bad(path + ".steps", "give either schedule or steps, not both");
  }
  ws.stepwise = d.contains("steps");
  const std::string spath = path + (ws.stepwise ? ".steps" : ".schedule");
  if (!ws.stepwise && !d.contains("schedule")) {
    Bad(spath, "must be a non-empty list of [step, weight] pairs");
  }
  nb::handle sched = d[ws.stepwise ? "steps" : "schedule"];
  if (!(nb::isinstance<nb::list>(sched) || nb::isinstance<nb::tuple>(sched))) {
    Bad(spath, "must be a non-empty list of [step, weight] pairs");
  }
  ws.points.clear();
  size_t i = 0;
  for (nb::handle pt : sched) {
    const std::string ipath = spath + "[" + std::to_string(i++) + "]";
    if (!(nb::isinstance<nb::list>(pt) || nb::isinstance<nb::tuple>(pt)) || nb::len(pt) != 2) {
      Bad(ipath, "must be a [step, weight] pair");
    }
    nb::handle step = pt[0];
    if (nb::isinstance<nb::bool_>(step) || !nb::isinstance<nb::int_>(step)) {
      Bad(ipath + "[0]", "must be a step (an integer)");
    }
    ws.points.emplace_back(nb::cast<int64_t>(step), ToNumber(pt[1], ipath + "[1]"));
  }
  return ws;
}

DataPlane& Checked(DataPlane& p) {
  ThrowIfError(p.status());
  return p;
}

}  // namespace

void RegisterPlan(nb::module_& m) {
  nb::class_<DataPlane>(
      m, "DataPlane",
      "The declarative data plane over a base Config: mix, distribute, cost, balance, "
      "broadcast_at, then plan() -> Config (docs/dataplane.md). Each method returns the "
      "same DataPlane; a bad argument raises braid.ConfigError naming the primitive.")
      .def(
          "__init__",
          [](DataPlane* p, const Config& base) {
            new (p) DataPlane(JobConfigInternal::Wrap(base));
          },
          nb::arg("base"))
      .def(
          "mix",
          [](DataPlane& p, nb::dict weights) -> DataPlane& {
            for (auto [key, value] : weights) {
              if (!nb::isinstance<nb::str>(key)) Bad("mix", "source names must be strings");
              const std::string name = nb::cast<std::string>(key);
              p.Mix(name, ToWeight(value, "mix." + name));
              Checked(p);
            }
            return p;
          },
          nb::arg("weights"), nb::rv_policy::reference,
          "Source weights by name: a number, {'schedule': [[step, w], ...]} (piecewise "
          "linear) or {'steps': [[step, w], ...]} (piecewise constant).")
      .def(
          "distribute",
          [](DataPlane& p, const std::string& axis, int64_t group) -> DataPlane& {
            return Checked(p.Distribute(axis, group));
          },
          nb::arg("axis") = "dp", nb::arg("group") = 1, nb::rv_policy::reference,
          "Which ranks get different buckets: 'dp' (default), 'cp', 'world'; `group` "
          "consecutive slots share a bucket (docs/parallelism.md).")
      .def(
          "phase",
          [](DataPlane& p, int64_t until_step, std::optional<int64_t> seq_len,
             std::optional<nb::dict> weights) -> DataPlane& {
            std::vector<std::pair<std::string, WeightSchedule>> ws;
            if (weights) {
              for (auto [key, value] : *weights) {
                if (!nb::isinstance<nb::str>(key)) {
                  Bad("phase", "source names must be strings");
                }
                const std::string name = nb::cast<std::string>(key);
                ws.emplace_back(name, ToWeight(value, "phase.weights." + name));
              }
            }
            return Checked(p.Phase(until_step, seq_len.value_or(0), ws));
          },
          nb::arg("until_step"), nb::kw_only(), nb::arg("seq_len") = nb::none(),
          nb::arg("weights") = nb::none(), nb::rv_policy::reference,
          "A phase up to `until_step` (exclusive) with its own seq_len and weight "
          "overrides (like mix's); the first call replaces the base's phases.")
      .def(
          "cost",
          [](DataPlane& p, std::optional<double> attn, std::optional<double> linear,
             std::optional<double> vision, std::optional<std::string> mode) -> DataPlane& {
            if (!vision && !mode) {
              return Checked(p.Cost(attn.value_or(1.0), linear.value_or(0.0)));
            }
            return Checked(p.Cost(attn.value_or(1.0), linear.value_or(0.0),
                                  vision.value_or(0.0), mode.value_or("hybrid")));
          },
          nb::kw_only(), nb::arg("attn") = nb::none(), nb::arg("linear") = nb::none(),
          nb::arg("vision") = nb::none(), nb::arg("mode") = nb::none(),
          nb::rv_policy::reference,
          "Cost of a piece of len tokens: attn * len**2 + linear * len (defaults 1.0, 0); "
          "vision * image tokens and mode 'hybrid' | 'backbone' for the vision encoder "
          "term (when either is given; defaults 0, 'hybrid').")
      .def(
          "balance",
          [](DataPlane& p, const std::string& method) -> DataPlane& {
            return Checked(p.Balance(method));
          },
          nb::arg("method"), nb::rv_policy::reference,
          "'karmarkar_karp' | 'greedy' | 'none'.")
      .def(
          "broadcast_at",
          [](DataPlane& p, const std::string& dim) -> DataPlane& {
            return Checked(p.BroadcastAt(dim));
          },
          nb::arg("dim"), nb::rv_policy::reference,
          "A dimension whose ranks receive the same micro-batches: 'tp' or 'pp'.")
      .def(
          "plan",
          [](const DataPlane& p) -> Config {
            return JobConfigInternal::Get(ValueOrThrow(p.Plan()));
          },
          "The compiled, validated Config.")
      .def_prop_ro("distribute_axis", &DataPlane::distribute_axis)
      .def_prop_ro("broadcast_dims", &DataPlane::broadcast_dims);
}

}  // namespace braid::python
