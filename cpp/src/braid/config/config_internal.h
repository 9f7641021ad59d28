// What the config parser's files share (parse.cc, parse_runtime.cc, parse_source.cc,
// schedule.cc, validate.cc): key paths, YAML scalars as typed values with their errors,
// and the section parsers that one file calls in another.
//
// Every function fails with a ConfigError whose key path is the `path` (or `key`) it is
// given, so that a message names what the user wrote. Nodes are taken as const:
// yaml-cpp's non-const operator[] may change the document it reads.
//
// Thread-safe: pure functions of their arguments (and of the calling thread's visit
// budget, limits_internal.h).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "braid/config/config.h"
#include "braid/status.h"

namespace braid::internal {

/// `parent[i]`.
std::string Index(const std::string& parent, size_t i);

/// " at line L, column C" of a mark; "" for a null mark.
std::string Position(const YAML::Mark& mark);

/// Whether a source is a Megatron indexed dataset as far as its config tells: `format:
/// megatron`, or format auto and a path naming an .idx / .bin file or (local paths) a
/// prefix P with a file P.idx. Such a source needs no transform key.
bool LooksLikeMegatron(const SourceConfig& src);

/// `path` made absolute against `base_dir` and lexically normalized; a URI as it is.
std::string ResolvePath(const std::string& path, const std::string& base_dir);

/// Checks that `node` is a map with no keys outside `known` and none twice (`path` "":
/// the document's top level).
Status CheckMap(const YAML::Node& node, const std::string& path,
                const std::set<std::string>& known);

/// A scalar as a T; `what` names the expected value in the error ("an integer").
template <typename T>
Result<T> Scalar(const YAML::Node& node, const std::string& path, const char* what) {
  if (!node.IsScalar()) return ConfigError(path, std::string("must be ") + what);
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    return ConfigError(path, std::string("must be ") + what + ", got '" +
                                 EscapeForMessage(node.Scalar()) + "'");
  }
}

/// An integer > 0.
Result<int64_t> PositiveInt(const YAML::Node& node, const std::string& path);

/// A finite number >= 0.
Result<double> Weight(const YAML::Node& node, const std::string& path);

/// One of the strings `names`, as its value.
template <typename E>
Result<E> Enum(const YAML::Node& node, const std::string& path,
               const std::vector<std::pair<std::string, E>>& names) {
  ARROW_ASSIGN_OR_RAISE(std::string s, Scalar<std::string>(node, path, "a string"));
  std::string list;
  for (const auto& [name, value] : names) {
    if (s == name) return value;
    list += (list.empty() ? "" : " | ") + name;
  }
  return ConfigError(path,
                     "must be one of " + list + ", got '" + EscapeForMessage(s) + "'");
}

/// A weight: a number, {schedule: [[step, weight], ...]} or {steps: ...} (schedule.cc).
Result<WeightSchedule> ParseWeight(const YAML::Node& node, const std::string& path);

/// The root `phases` (schedule.cc). REQUIRES: c.sources and c.batch parsed (weights name
/// sources; seq_len defaults).
Result<std::vector<PhaseConfig>> ParsePhases(const YAML::Node& node, const Config& c);

/// The root `runtime`, less its `cache` and `length_cache` (parse_runtime.cc).
Status ParseRuntime(const YAML::Node& rt, RuntimeConfig* runtime);

/// runtime.cache and runtime.length_cache, which every SourceConfig copies.
struct RuntimeCaches {
  std::string cache_dir;  ///< resolved; empty: no cache
  int64_t cache_max_bytes = 0;
  std::string length_cache_dir;  ///< resolved; empty: none
};

/// The caches of `runtime` (the root's, maybe undefined), folders resolved against
/// `base_dir` (parse_runtime.cc). REQUIRES: ParseRuntime accepted `runtime`.
Result<RuntimeCaches> ParseRuntimeCaches(const YAML::Node& runtime,
                                         const std::string& base_dir);

/// One entry of `sources` at key path `path` (parse_source.cc).
Result<SourceConfig> ParseSource(const YAML::Node& node, const std::string& path,
                                 const std::string& base_dir);

/// A `tokenizer` at key path `key`, the root's or a source's (parse_source.cc).
Result<TokenizerConfig> ParseTokenizer(const YAML::Node& node, const std::string& key,
                                       const std::string& base_dir);

}  // namespace braid::internal
