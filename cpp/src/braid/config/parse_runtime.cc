// The parser of the root `runtime` (config_internal.h): the embedded runtime's knobs, the
// distributed runtime's (runtime.kind: ray; docs/distributed.md), and the caches every
// source copies: runtime.cache, a local copy of remote files, and runtime.length_cache,
// the token counts of tokenized sources (io/file_cache.h, io/length_cache.h).
//
// Thread-safe: pure functions of the YAML they read.
#include <string>
#include <utility>

#include "braid/config/config.h"
#include "braid/config/config_internal.h"
#include "braid/config/limits_internal.h"

namespace braid::internal {
namespace {

// runtime.actor_resources: Ray resource names to amounts, in config order.
Status ParseActorResources(const YAML::Node& res, RuntimeConfig* runtime) {
  if (!res.IsMap()) {
    return ConfigError("runtime.actor_resources", "must map Ray resource names to amounts");
  }
  ARROW_RETURN_NOT_OK(Visit(res.size(), "runtime.actor_resources"));
  for (const auto& kv : res) {
    if (!kv.first.IsScalar() || kv.first.Scalar().empty()) {
      return ConfigError("runtime.actor_resources",
                         "keys must be resource names" + Position(kv.first.Mark()));
    }
    const std::string key = Join("runtime.actor_resources", kv.first.Scalar());
    ARROW_ASSIGN_OR_RAISE(double amount, Scalar<double>(kv.second, key, "a number"));
    if (!(amount > 0) || amount > 1e9) return ConfigError(key, "must be > 0");
    runtime->actor_resources.emplace_back(kv.first.Scalar(), amount);
  }
  return Status::OK();
}

// The distributed runtime's keys: kind, the Ray cluster and the job's actors.
Status ParseRayRuntime(const YAML::Node& rt, RuntimeConfig* runtime) {
  if (rt["kind"]) {
    ARROW_ASSIGN_OR_RAISE(std::string kind,
                          Scalar<std::string>(rt["kind"], "runtime.kind", "a string"));
    if (kind == "ray") {
      runtime->kind = RuntimeConfig::Kind::kRay;
    } else if (kind != "local") {
      return ConfigError("runtime.kind", "must be one of local | ray, got '" +
                                             EscapeForMessage(kind) + "'");
    }
  }
  const std::pair<const char*, std::string*> names[] = {
      {"address", &runtime->address},
      {"namespace", &runtime->ray_namespace},
      {"job", &runtime->job}};
  for (const auto& [key, out] : names) {
    if (!rt[key]) continue;
    ARROW_ASSIGN_OR_RAISE(*out, Scalar<std::string>(rt[key], Join("runtime", key),
                                                    "a string"));
    if (out->empty() && std::string(key) != "job") {
      return ConfigError(Join("runtime", key), "must not be empty");
    }
  }
  if (rt["source_actors"]) {
    ARROW_ASSIGN_OR_RAISE(runtime->source_actors,
                          Scalar<int64_t>(rt["source_actors"], "runtime.source_actors",
                                          "an integer"));
    if (runtime->source_actors < 0) {
      return ConfigError("runtime.source_actors",
                         "must be >= 0 (0: the planner actor serves the payloads)");
    }
  }
  if (rt["delivery"]) {
    ARROW_ASSIGN_OR_RAISE(
        runtime->delivery,
        Enum<RuntimeConfig::Delivery>(
            rt["delivery"], "runtime.delivery",
            {{"node", RuntimeConfig::Delivery::kNode},
             {"object_store", RuntimeConfig::Delivery::kObjectStore}}));
  }
  if (rt["steps_in_flight"]) {
    ARROW_ASSIGN_OR_RAISE(runtime->steps_in_flight,
                          PositiveInt(rt["steps_in_flight"], "runtime.steps_in_flight"));
  }
  if (const YAML::Node res = rt["actor_resources"]) {
    ARROW_RETURN_NOT_OK(ParseActorResources(res, runtime));
  }
  if (rt["shadow"]) {
    ARROW_ASSIGN_OR_RAISE(runtime->shadow,
                          Scalar<bool>(rt["shadow"], "runtime.shadow", "true or false"));
    if (runtime->shadow && runtime->source_actors == 0) {
      return ConfigError("runtime.shadow",
                         "needs source actors (runtime.source_actors >= 1) to shadow");
    }
  }
  if (rt["timeout_s"]) {
    ARROW_ASSIGN_OR_RAISE(runtime->timeout_s,
                          Scalar<double>(rt["timeout_s"], "runtime.timeout_s", "seconds"));
    if (!(runtime->timeout_s > 0) || runtime->timeout_s > 86400) {
      return ConfigError("runtime.timeout_s", "must be in (0, 86400] seconds");
    }
  }
  return Status::OK();
}

}  // namespace

Status ParseRuntime(const YAML::Node& rt, RuntimeConfig* runtime) {
  ARROW_RETURN_NOT_OK(CheckMap(
      rt, "runtime",
      {"kind", "read_ahead_bytes", "prefetch_steps", "cache", "length_cache", "threads",
       "memory_bytes", "address", "namespace", "job", "source_actors", "steps_in_flight",
       "timeout_s", "actor_resources", "shadow", "delivery", "autoscale"}));
  ARROW_RETURN_NOT_OK(ParseRayRuntime(rt, runtime));
  if (rt["autoscale"]) {
    ARROW_ASSIGN_OR_RAISE(
        runtime->autoscale,
        Scalar<bool>(rt["autoscale"], "runtime.autoscale", "true or false"));
  }
  if (rt["read_ahead_bytes"]) {
    ARROW_ASSIGN_OR_RAISE(runtime->read_ahead_bytes,
                          PositiveInt(rt["read_ahead_bytes"], "runtime.read_ahead_bytes"));
  }
  if (rt["prefetch_steps"]) {
    ARROW_ASSIGN_OR_RAISE(runtime->prefetch_steps,
                          PositiveInt(rt["prefetch_steps"], "runtime.prefetch_steps"));
  }
  if (rt["threads"]) {
    ARROW_ASSIGN_OR_RAISE(runtime->threads, PositiveInt(rt["threads"], "runtime.threads"));
  }
  if (rt["memory_bytes"]) {
    ARROW_ASSIGN_OR_RAISE(runtime->memory_bytes,
                          PositiveInt(rt["memory_bytes"], "runtime.memory_bytes"));
  }
  return Status::OK();
}

Result<RuntimeCaches> ParseRuntimeCaches(const YAML::Node& runtime,
                                         const std::string& base_dir) {
  RuntimeCaches out;
  if (runtime && runtime["cache"]) {
    const YAML::Node cache = runtime["cache"];
    ARROW_RETURN_NOT_OK(CheckMap(cache, "runtime.cache", {"dir", "max_bytes"}));
    for (const char* required : {"dir", "max_bytes"}) {
      if (!cache[required]) {
        return ConfigError(Join("runtime.cache", required), "is required");
      }
    }
    ARROW_ASSIGN_OR_RAISE(out.cache_dir,
                          Scalar<std::string>(cache["dir"], "runtime.cache.dir",
                                              "a folder path"));
    if (out.cache_dir.empty()) {
      return ConfigError("runtime.cache.dir", "must not be empty");
    }
    out.cache_dir = ResolvePath(out.cache_dir, base_dir);
    ARROW_ASSIGN_OR_RAISE(out.cache_max_bytes,
                          PositiveInt(cache["max_bytes"], "runtime.cache.max_bytes"));
  }
  if (runtime && runtime["length_cache"]) {
    ARROW_ASSIGN_OR_RAISE(out.length_cache_dir,
                          Scalar<std::string>(runtime["length_cache"],
                                              "runtime.length_cache", "a folder path"));
    if (out.length_cache_dir.empty()) {
      return ConfigError("runtime.length_cache", "must not be empty");
    }
    out.length_cache_dir = ResolvePath(out.length_cache_dir, base_dir);
  }
  return out;
}

}  // namespace braid::internal
