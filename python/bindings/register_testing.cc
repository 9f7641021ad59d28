// Data generators shared by the demo, the benchmarks and the tests.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "braid/testing/parquet_fixture.h"
#include "status_caster.h"

namespace nb = nanobind;

namespace braid::python {

void RegisterTesting(nb::module_& m) {
  m.def("make_demo_dataset",
        [](const std::string& dir, uint64_t seed, int64_t seq_len, int64_t dp,
           int64_t micro_batches, double scale) {
          Result<testing::DemoDataset> result;
          {
            nb::gil_scoped_release release;
            result = testing::MakeDemoDataset(dir, seed, seq_len, dp, micro_batches, scale);
          }
          auto demo = ValueOrThrow(std::move(result));
          nb::dict d;
          d["config_path"] = demo.config_path;
          d["source_names"] = demo.source_names;
          d["docs"] = demo.docs;
          d["tokens"] = demo.tokens;
          return d;
        },
        nb::arg("dir"), nb::arg("seed") = 1234, nb::arg("seq_len") = 4096,
        nb::arg("dp") = 8, nb::arg("micro_batches") = 4, nb::arg("scale") = 1.0,
        "Writes the three-source demo dataset and its config under dir.");
}

}  // namespace braid::python
