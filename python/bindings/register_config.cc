// Config and topology: parse, override, inspect.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "braid/client/topology.h"
#include "braid/config/config.h"
#include "braid/exec/budget.h"
#include "status_caster.h"

namespace nb = nanobind;

namespace braid::python {

void RegisterConfig(nb::module_& m) {
  nb::class_<Config>(m, "Config", "A parsed, validated job configuration.")
      .def_prop_ro("seed", [](const Config& c) { return c.seed; })
      .def_prop_ro("topology",
                   [](const Config& c) {
                     const auto& t = c.topology;
                     nb::dict d;
                     d["dp"] = t.dp;
                     d["tp"] = t.tp;
                     d["pp"] = t.pp;
                     d["cp"] = t.cp;
                     nb::list order;
                     for (Dim dim : t.order) order.append(ToString(dim));
                     d["order"] = order;
                     const char* axes[] = {"dp", "cp", "world"};
                     d["distribute"] = axes[static_cast<int>(t.distribute)];
                     d["group"] = t.group;
                     nb::list broadcast;
                     if (!t.distributed(Dim::kTp)) broadcast.append("tp");
                     if (!t.distributed(Dim::kPp)) broadcast.append("pp");
                     d["broadcast_at"] = broadcast;
                     d["buckets"] = t.buckets();
                     return d;
                   })
      .def_prop_ro("seq_len", [](const Config& c) { return c.batch.seq_len; })
      .def_prop_ro("global_tokens", [](const Config& c) { return c.batch.global_tokens; })
      .def_prop_ro("micro_batches_per_rank", &Config::micro_batches_per_rank)
      .def("micro_batches_per_rank_at", &Config::MicroBatchesPerRankAt, nb::arg("step"),
           "Micro-batches per DP rank at `step` (a phase's seq_len changes it).")
      .def_prop_ro("source_names",
                   [](const Config& c) {
                     std::vector<std::string> names;
                     for (const auto& s : c.sources) names.push_back(s.name);
                     return names;
                   })
      .def("fingerprint", &Config::Fingerprint)
      .def("with_dp",
           [](const Config& c, int64_t dp) {
             Config copy = c;
             ThrowIfError(SetDataParallel(&copy, dp));
             return copy;
           },
           nb::arg("dp"), "A copy with topology.dp overridden (the CLI's --dp).")
      .def_prop_ro("runtime",
                   [](const Config& c) {
                     const RuntimeConfig& r = c.runtime;
                     nb::dict d;
                     d["kind"] = r.kind == RuntimeConfig::Kind::kRay ? "ray" : "local";
                     d["address"] = r.address;
                     d["namespace"] = r.ray_namespace;
                     d["job"] = r.job;
                     d["source_actors"] = r.source_actors;
                     d["steps_in_flight"] = r.steps_in_flight;
                     d["timeout_s"] = r.timeout_s;
                     nb::dict resources;
                     for (const auto& [name, amount] : r.actor_resources) {
                       resources[name.c_str()] = amount;
                     }
                     d["actor_resources"] = resources;
                     d["shadow"] = r.shadow;
                     d["delivery"] = r.delivery == RuntimeConfig::Delivery::kNode
                                         ? "node"
                                         : "object_store";
                     d["memory_bytes"] = MemoryBudgetBytes(c);
                     d["threads"] = ReadThreads(c);
                     return d;
                   },
                   "The runtime keys (docs/config.md), defaults filled in.")
      .def("with_runtime_kind",
           [](const Config& c, const std::string& kind) {
             Config copy = c;
             if (kind == "ray") {
               copy.runtime.kind = RuntimeConfig::Kind::kRay;
             } else if (kind == "local") {
               copy.runtime.kind = RuntimeConfig::Kind::kLocal;
             } else {
               ThrowStatus(ConfigError("--runtime", "must be local or ray"));
             }
             ThrowIfError(ValidateConfig(copy));
             return copy;
           },
           nb::arg("kind"), "A copy with runtime.kind overridden (the CLI's --runtime).")
      // Pickled as the text it was parsed from (re-parsed, so re-validated), for the
      // Ray runtime's actors; overrides (dp, runtime kind) travel beside it.
      .def("__getstate__",
           [](const Config& c) {
             // base_dir as it was (relative paths are in the fingerprint): a process
             // that opens the files works in the same folder (the Ray actors chdir).
             return nb::make_tuple(c.source_text, c.base_dir, c.topology.dp,
                                   c.runtime.kind == RuntimeConfig::Kind::kRay);
           })
      .def("__setstate__",
           [](Config& c, const nb::tuple& state) {
             Config parsed = ValueOrThrow(ParseConfig(nb::cast<std::string>(state[0]),
                                                      nb::cast<std::string>(state[1])));
             const int64_t dp = nb::cast<int64_t>(state[2]);
             if (dp != parsed.topology.dp) ThrowIfError(SetDataParallel(&parsed, dp));
             parsed.runtime.kind = nb::cast<bool>(state[3]) ? RuntimeConfig::Kind::kRay
                                                          : RuntimeConfig::Kind::kLocal;
             new (&c) Config(std::move(parsed));
           });

  m.def("load_config",
        [](const std::string& path) { return ValueOrThrow(LoadConfigFile(path)); },
        nb::arg("path"), "Reads and validates a YAML/JSON config file.");
  m.def("parse_config",
        [](const std::string& text, const std::string& base_dir) {
          return ValueOrThrow(ParseConfig(text, base_dir));
        },
        nb::arg("text"), nb::arg("base_dir"),
        "Parses YAML/JSON text; relative paths resolve against base_dir.");
  m.def("rank_coords",
        [](const Config& c, int64_t rank, int64_t world_size) {
          if (world_size != c.topology.world_size()) {
            ThrowStatus(ConfigError(
                "world_size", std::to_string(world_size) +
                                  " does not match the topology (dp*tp*pp*cp = " +
                                  std::to_string(c.topology.world_size()) + ")"));
          }
          const RankCoords rc = ValueOrThrow(CoordsOf(c.topology, rank));
          return std::make_tuple(rc.dp, rc.tp, rc.pp, rc.cp);
        },
        nb::arg("config"), nb::arg("rank"), nb::arg("world_size"),
        "(dp, tp, pp, cp) of a trainer rank, in topology.order (default Megatron's).");
  m.def("rank_bucket",
        [](const Config& c, int64_t rank) {
          const RankCoords rc = ValueOrThrow(CoordsOf(c.topology, rank));
          return BucketOf(c.topology, rc);
        },
        nb::arg("config"), nb::arg("rank"),
        "The bucket (the DP rank, by default) whose micro-batches a trainer rank receives "
        "(topology.distribute).");
}

}  // namespace braid::python
