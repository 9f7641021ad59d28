// Config and topology: parse, override, inspect.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "braid/client/topology.h"
#include "braid/config/config.h"
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
           nb::arg("dp"), "A copy with topology.dp overridden (the CLI's --dp).");

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
