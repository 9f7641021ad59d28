// `braid inspect`: the inspection of a path, as a dict.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "braid/io/inspect.h"
#include "status_caster.h"

namespace nb = nanobind;

namespace braid::python {

void RegisterInspect(nb::module_& m) {
  m.def("inspect",
        [](const std::string& path, const std::string& column) {
          Result<Inspection> result;
          {
            nb::gil_scoped_release release;
            result = Inspect(path, column);
          }
          const Inspection in = ValueOrThrow(std::move(result));
          nb::dict d;
          d["schema"] = in.schema;
          nb::list files;
          for (const auto& f : in.files) {
            nb::dict fd;
            fd["path"] = f.path;
            fd["rows"] = f.rows;
            fd["row_groups"] = f.row_groups;
            fd["bytes"] = f.bytes;
            files.append(fd);
          }
          d["files"] = files;
          d["rows"] = in.rows;
          d["column"] = in.column;
          d["buckets"] = in.buckets;
          d["empty"] = in.empty;
          d["nulls"] = in.nulls;
          d["tokens"] = in.tokens;
          d["min_tokens"] = in.min_tokens;
          d["max_tokens"] = in.max_tokens;
          d["p50_tokens"] = in.p50_tokens;
          d["p99_tokens"] = in.p99_tokens;
          return d;
        },
        nb::arg("path"), nb::arg("column") = "",
        "Schema, files, rows and the token-length histogram of a path.");
}

}  // namespace braid::python
