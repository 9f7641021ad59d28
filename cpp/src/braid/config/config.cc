#include "braid/config/config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "braid/util/rng_internal.h"

namespace braid {
namespace {

std::string Join(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

std::string Index(const std::string& parent, size_t i) {
  return parent + "[" + std::to_string(i) + "]";
}

// Checks that `node` is a map with no keys outside `known`.
Status CheckMap(const YAML::Node& node, const std::string& path,
                const std::set<std::string>& known) {
  if (!node.IsMap()) {
    return ConfigError(path.empty() ? "<root>" : path, "must be a mapping");
  }
  for (const auto& kv : node) {
    const std::string key = kv.first.Scalar();
    if (!known.count(key)) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      return ConfigError(Join(path, key), "unknown key (known: " + list + ")");
    }
  }
  return Status::OK();
}

template <typename T>
Result<T> Scalar(const YAML::Node& node, const std::string& path, const char* what) {
  if (!node.IsScalar()) return ConfigError(path, std::string("must be ") + what);
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    return ConfigError(path, std::string("must be ") + what + ", got '" + node.Scalar() +
                                 "'");
  }
}

Result<int64_t> PositiveInt(const YAML::Node& node, const std::string& path) {
  ARROW_ASSIGN_OR_RAISE(int64_t v, Scalar<int64_t>(node, path, "an integer"));
  if (v <= 0) return ConfigError(path, "must be > 0, got " + std::to_string(v));
  return v;
}

Result<double> Weight(const YAML::Node& node, const std::string& path) {
  ARROW_ASSIGN_OR_RAISE(double w, Scalar<double>(node, path, "a number"));
  if (!std::isfinite(w) || w < 0) {
    return ConfigError(path, "must be a finite number >= 0, got " + node.Scalar());
  }
  return w;
}

template <typename E>
Result<E> Enum(const YAML::Node& node, const std::string& path,
               const std::vector<std::pair<std::string, E>>& names) {
  ARROW_ASSIGN_OR_RAISE(std::string s, Scalar<std::string>(node, path, "a string"));
  std::string list;
  for (const auto& [name, value] : names) {
    if (s == name) return value;
    list += (list.empty() ? "" : " | ") + name;
  }
  return ConfigError(path, "must be one of " + list + ", got '" + s + "'");
}

Result<WeightSchedule> ParseWeight(const YAML::Node& node, const std::string& path) {
  WeightSchedule ws;
  if (node.IsScalar()) {
    ARROW_ASSIGN_OR_RAISE(double w, Weight(node, path));
    ws.points = {{0, w}};
    return ws;
  }
  ARROW_RETURN_NOT_OK(CheckMap(node, path, {"schedule", "steps"}));
  // Planner: {steps: ...} is piecewise constant, {schedule: ...} piecewise linear.
  if (node["schedule"] && node["steps"]) {
    return ConfigError(Join(path, "steps"), "give either schedule or steps, not both");
  }
  ws.stepwise = static_cast<bool>(node["steps"]);
  const std::string spath = Join(path, ws.stepwise ? "steps" : "schedule");
  const YAML::Node sched = node[ws.stepwise ? "steps" : "schedule"];
  if (!sched || !sched.IsSequence() || sched.size() == 0) {
    return ConfigError(spath, "must be a non-empty list of [step, weight] pairs");
  }
  ws.points.clear();
  for (size_t i = 0; i < sched.size(); ++i) {
    const std::string ipath = Index(spath, i);
    const YAML::Node pt = sched[i];
    if (!pt.IsSequence() || pt.size() != 2) {
      return ConfigError(ipath, "must be a [step, weight] pair");
    }
    ARROW_ASSIGN_OR_RAISE(int64_t step, Scalar<int64_t>(pt[0], Index(ipath, 0), "a step"));
    ARROW_ASSIGN_OR_RAISE(double w, Weight(pt[1], Index(ipath, 1)));
    if (step < 0 || (!ws.points.empty() && step <= ws.points.back().first)) {
      return ConfigError(Index(ipath, 0), "steps must be >= 0 and strictly increasing");
    }
    ws.points.emplace_back(step, w);
  }
  return ws;
}

// --- Planner: phases (docs/planner.md) ---
// REQUIRES: c.sources and c.batch parsed (weights name sources; seq_len defaults).
Result<std::vector<PhaseConfig>> ParsePhases(const YAML::Node& node, const Config& c) {
  if (!node.IsSequence()) {
    return ConfigError("phases", "must be a list of {until_step, seq_len, weights}");
  }
  std::vector<PhaseConfig> out;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string path = Index("phases", i);
    const YAML::Node ph = node[i];
    ARROW_RETURN_NOT_OK(CheckMap(ph, path, {"until_step", "seq_len", "weights"}));
    PhaseConfig phase;
    if (!ph["until_step"]) return ConfigError(Join(path, "until_step"), "is required");
    ARROW_ASSIGN_OR_RAISE(phase.until_step,
                          PositiveInt(ph["until_step"], Join(path, "until_step")));
    if (!out.empty() && phase.until_step <= out.back().until_step) {
      return ConfigError(Join(path, "until_step"),
                         "must be greater than the previous phase's (" +
                             std::to_string(out.back().until_step) + ")");
    }
    phase.seq_len = c.batch.seq_len;
    if (ph["seq_len"]) {
      ARROW_ASSIGN_OR_RAISE(phase.seq_len, PositiveInt(ph["seq_len"], Join(path, "seq_len")));
    }
    phase.weights.resize(c.sources.size());
    if (const YAML::Node w = ph["weights"]) {
      const std::string wpath = Join(path, "weights");
      if (!w.IsMap()) return ConfigError(wpath, "must map source names to weights");
      for (const auto& kv : w) {
        const std::string name = kv.first.Scalar();
        size_t k = 0;
        while (k < c.sources.size() && c.sources[k].name != name) ++k;
        if (k == c.sources.size()) {
          return ConfigError(Join(wpath, name), "is not a source name");
        }
        ARROW_ASSIGN_OR_RAISE(phase.weights[k], ParseWeight(kv.second, Join(wpath, name)));
      }
    }
    out.push_back(std::move(phase));
  }
  return out;
}
// --- end planner: phases ---

std::string ResolvePath(const std::string& path, const std::string& base_dir) {
  if (path.find("://") != std::string::npos) return path;
  std::filesystem::path p(path);
  if (!p.is_absolute()) {
    std::error_code ec;
    const auto base = std::filesystem::absolute(
        base_dir.empty() ? std::filesystem::path(".") : std::filesystem::path(base_dir), ec);
    p = (ec ? std::filesystem::path(base_dir) : base) / p;
  }
  return p.lexically_normal().string();
}

// --- Transforms (docs/sources.md): tokens_column | text_column | chat, workers ---
Status ParseSourceTransform(const YAML::Node& node, const std::string& path,
                            SourceConfig* src) {
  const int given = (node["tokens_column"] ? 1 : 0) + (node["text_column"] ? 1 : 0) +
                    (node["chat"] ? 1 : 0) + (node["transform"] ? 1 : 0);
  if (given == 0) {
    return ConfigError(Join(path, "tokens_column"),
                       "is required (or give text_column, chat or transform)");
  }
  if (given > 1) {
    return ConfigError(path,
                       "give exactly one of tokens_column, text_column, chat, transform");
  }
  auto non_empty = [](const YAML::Node& n, const std::string& key) -> Result<std::string> {
    ARROW_ASSIGN_OR_RAISE(auto v, Scalar<std::string>(n, key, "a string"));
    if (v.empty()) return ConfigError(key, "must not be empty");
    return v;
  };
  if (node["tokens_column"]) {
    ARROW_ASSIGN_OR_RAISE(src->tokens_column,
                          Scalar<std::string>(node["tokens_column"],
                                              Join(path, "tokens_column"), "a string"));
  }
  if (node["text_column"]) {
    ARROW_ASSIGN_OR_RAISE(src->text_column,
                          non_empty(node["text_column"], Join(path, "text_column")));
  }
  if (const YAML::Node chat = node["chat"]) {
    const std::string key = Join(path, "chat");
    ARROW_RETURN_NOT_OK(
        CheckMap(chat, key, {"prompt_column", "response_column", "messages_column"}));
    if (chat["messages_column"]) {
      if (chat["prompt_column"] || chat["response_column"]) {
        return ConfigError(key, "give messages_column or prompt_column + response_column");
      }
      ARROW_ASSIGN_OR_RAISE(src->chat.messages_column,
                            non_empty(chat["messages_column"], Join(key, "messages_column")));
    } else {
      for (const char* k : {"prompt_column", "response_column"}) {
        if (!chat[k]) {
          return ConfigError(Join(key, k), "is required (or give messages_column)");
        }
      }
      ARROW_ASSIGN_OR_RAISE(src->chat.prompt_column,
                            non_empty(chat["prompt_column"], Join(key, "prompt_column")));
      ARROW_ASSIGN_OR_RAISE(
          src->chat.response_column,
          non_empty(chat["response_column"], Join(key, "response_column")));
    }
  }
  if (node["workers"]) {
    ARROW_ASSIGN_OR_RAISE(src->workers, PositiveInt(node["workers"], Join(path, "workers")));
  }
  // --- User transform and sharding (docs/sources.md) ---
  if (const YAML::Node t = node["transform"]) {
    const std::string key = Join(path, "transform");
    ARROW_RETURN_NOT_OK(CheckMap(t, key, {"python", "columns"}));
    if (!t["python"]) return ConfigError(Join(key, "python"), "is required");
    ARROW_ASSIGN_OR_RAISE(src->user_transform.python,
                          non_empty(t["python"], Join(key, "python")));
    const std::string ckey = Join(key, "columns");
    const YAML::Node cols = t["columns"];
    if (!cols) return ConfigError(ckey, "is required (the columns the function reads)");
    if (!cols.IsSequence() || cols.size() == 0) {
      return ConfigError(ckey, "must be a non-empty list of column names");
    }
    for (size_t i = 0; i < cols.size(); ++i) {
      ARROW_ASSIGN_OR_RAISE(auto name, non_empty(cols[i], Index(ckey, i)));
      src->user_transform.columns.push_back(std::move(name));
    }
  }
  if (node["loaders"]) {
    ARROW_ASSIGN_OR_RAISE(src->loaders, PositiveInt(node["loaders"], Join(path, "loaders")));
  }
  // --- end user transform and sharding ---
  return Status::OK();
}

Result<TokenizerConfig> ParseTokenizer(const YAML::Node& node, const std::string& base_dir) {
  ARROW_RETURN_NOT_OK(CheckMap(node, "tokenizer", {"type", "model", "bos", "eos"}));
  TokenizerConfig t;
  if (node["type"]) {
    ARROW_ASSIGN_OR_RAISE(t.type,
                          Scalar<std::string>(node["type"], "tokenizer.type", "a string"));
    if (t.type != "sentencepiece") {
      return ConfigError("tokenizer.type", "must be sentencepiece, got '" + t.type + "'");
    }
  }
  if (!node["model"]) return ConfigError("tokenizer.model", "is required");
  ARROW_ASSIGN_OR_RAISE(std::string model, Scalar<std::string>(node["model"],
                                                               "tokenizer.model", "a string"));
  if (model.empty()) return ConfigError("tokenizer.model", "must not be empty");
  t.model = ResolvePath(model, base_dir);
  if (node["bos"]) {
    ARROW_ASSIGN_OR_RAISE(t.bos, Scalar<bool>(node["bos"], "tokenizer.bos", "a boolean"));
  }
  if (node["eos"]) {
    ARROW_ASSIGN_OR_RAISE(t.eos, Scalar<bool>(node["eos"], "tokenizer.eos", "a boolean"));
  }
  return t;
}
// --- end transforms ---

// --- Images (docs/sources.md): image_column + image: {patch_size, max_pixels,
// image_token_id}, only together with text_column (the caption) ---
Status ParseSourceImage(const YAML::Node& node, const std::string& path,
                        SourceConfig* src) {
  if (!node["image_column"]) {
    if (node["image"]) return ConfigError(Join(path, "image"), "needs image_column");
    return Status::OK();
  }
  const std::string col_key = Join(path, "image_column");
  ARROW_ASSIGN_OR_RAISE(src->image_column,
                        Scalar<std::string>(node["image_column"], col_key, "a string"));
  if (src->image_column.empty()) return ConfigError(col_key, "must not be empty");
  if (src->text_column.empty()) {
    return ConfigError(col_key, "needs text_column (the caption)");
  }
  const std::string key = Join(path, "image");
  const YAML::Node image = node["image"];
  if (!image) return ConfigError(Join(key, "image_token_id"), "is required");
  ARROW_RETURN_NOT_OK(CheckMap(image, key, {"patch_size", "max_pixels", "image_token_id"}));
  if (image["patch_size"]) {
    ARROW_ASSIGN_OR_RAISE(src->image_patch_size,
                          PositiveInt(image["patch_size"], Join(key, "patch_size")));
  }
  if (image["max_pixels"]) {
    ARROW_ASSIGN_OR_RAISE(src->image_max_pixels,
                          PositiveInt(image["max_pixels"], Join(key, "max_pixels")));
  }
  if (src->image_max_pixels < src->image_patch_size * src->image_patch_size) {
    return ConfigError(Join(key, "max_pixels"), "must be at least patch_size^2");
  }
  if (!image["image_token_id"]) {
    return ConfigError(Join(key, "image_token_id"), "is required");
  }
  ARROW_ASSIGN_OR_RAISE(src->image_token_id,
                        Scalar<int64_t>(image["image_token_id"],
                                        Join(key, "image_token_id"), "an integer"));
  if (src->image_token_id < 0 || src->image_token_id > 2147483647) {
    return ConfigError(Join(key, "image_token_id"), "must be an int32 >= 0");
  }
  return Status::OK();
}
// --- end images ---

Result<SourceConfig> ParseSource(const YAML::Node& node, const std::string& path,
                                 const std::string& base_dir) {
  ARROW_RETURN_NOT_OK(CheckMap(node, path,
                               {"name", "path", "tokens_column", "text_column",
                                "image_column", "weight", "oversize", "on_error",
                                "storage", "image",
                                "shuffle_window", "shuffle_window_bytes", "chat", "workers",
                                "transform", "loaders"}));
  SourceConfig src;
  for (const char* required : {"name", "path"}) {
    if (!node[required]) return ConfigError(Join(path, required), "is required");
  }
  ARROW_ASSIGN_OR_RAISE(src.name,
                        Scalar<std::string>(node["name"], Join(path, "name"), "a string"));
  if (src.name.empty()) return ConfigError(Join(path, "name"), "must not be empty");
  ARROW_ASSIGN_OR_RAISE(std::string p,
                        Scalar<std::string>(node["path"], Join(path, "path"), "a string"));
  if (p.empty()) return ConfigError(Join(path, "path"), "must not be empty");
  src.path = ResolvePath(p, base_dir);
  if (node["image_column"] && !node["text_column"]) {  // images
    return ConfigError(Join(path, "image_column"), "needs text_column (the caption)");
  }
  ARROW_RETURN_NOT_OK(ParseSourceTransform(node, path, &src));
  ARROW_RETURN_NOT_OK(ParseSourceImage(node, path, &src));  // images
  if (node["weight"]) {
    ARROW_ASSIGN_OR_RAISE(src.weight, ParseWeight(node["weight"], Join(path, "weight")));
  }
  if (node["oversize"]) {
    ARROW_ASSIGN_OR_RAISE(src.oversize,
                          Enum<Oversize>(node["oversize"], Join(path, "oversize"),
                                         {{"split", Oversize::kSplit},
                                          {"truncate", Oversize::kTruncate},
                                          {"skip", Oversize::kSkip}}));
  }
  if (node["on_error"]) {
    ARROW_ASSIGN_OR_RAISE(
        src.on_error, Enum<OnError>(node["on_error"], Join(path, "on_error"),
                                    {{"fail", OnError::kFail}, {"skip", OnError::kSkip}}));
  }
  if (const YAML::Node storage = node["storage"]) {  // --- Storage ---
    const std::string key = Join(path, "storage");
    ARROW_RETURN_NOT_OK(CheckMap(storage, key, {"endpoint", "region", "anonymous"}));
    if (storage["anonymous"]) {
      ARROW_ASSIGN_OR_RAISE(src.storage_anonymous,
                            Scalar<bool>(storage["anonymous"], Join(key, "anonymous"),
                                         "true or false"));
    }
    if (storage["endpoint"]) {
      ARROW_ASSIGN_OR_RAISE(src.storage_endpoint,
                            Scalar<std::string>(storage["endpoint"], Join(key, "endpoint"),
                                                "a URL such as http://127.0.0.1:9000"));
    }
    if (storage["region"]) {
      ARROW_ASSIGN_OR_RAISE(src.storage_region,
                            Scalar<std::string>(storage["region"], Join(key, "region"),
                                                "a string"));
    }
    if (src.path.find("://") == std::string::npos) {
      return ConfigError(key, "applies to s3:// and gs:// paths only");
    }
    if (src.storage_anonymous && src.path.rfind("gs://", 0) != 0) {
      return ConfigError(Join(key, "anonymous"),
                         "applies to gs:// paths only (S3 credentials come from the "
                         "environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)");
    }
  }
  if (node["shuffle_window"]) {
    ARROW_ASSIGN_OR_RAISE(src.shuffle_window_rows,
                          PositiveInt(node["shuffle_window"], Join(path, "shuffle_window")));
  }
  if (node["shuffle_window_bytes"]) {
    const std::string key = Join(path, "shuffle_window_bytes");
    ARROW_ASSIGN_OR_RAISE(src.shuffle_window_bytes,
                          Scalar<int64_t>(node["shuffle_window_bytes"], key, "an integer"));
    if (src.shuffle_window_bytes < 0) {
      return ConfigError(key, "must be >= 0 (0: no byte bound), got " +
                                  std::to_string(src.shuffle_window_bytes));
    }
  }
  return src;
}

// --- Topology tree: rank order, distribute, broadcast_at (docs/parallelism.md) ---
Result<Dim> ParseDim(const YAML::Node& node, const std::string& path) {
  return Enum<Dim>(node, path,
                   {{"dp", Dim::kDp}, {"tp", Dim::kTp}, {"pp", Dim::kPp}, {"cp", Dim::kCp}});
}

Result<Topology> ParseTopology(const YAML::Node& t) {
  ARROW_RETURN_NOT_OK(CheckMap(t, "topology", {"dp", "tp", "pp", "cp", "order",
                                               "distribute", "broadcast_at"}));
  Topology topo;
  int64_t* dims[] = {&topo.dp, &topo.tp, &topo.pp, &topo.cp};
  const char* names[] = {"dp", "tp", "pp", "cp"};
  for (int i = 0; i < 4; ++i) {
    if (t[names[i]]) {
      ARROW_ASSIGN_OR_RAISE(*dims[i], PositiveInt(t[names[i]], Join("topology", names[i])));
    }
  }
  if (const YAML::Node o = t["order"]) {
    if (!o.IsSequence() || o.size() != 4) {
      return ConfigError("topology.order",
                         "must be a list of the four dimensions, fastest-varying first "
                         "(e.g. [tp, cp, dp, pp])");
    }
    for (size_t i = 0; i < 4; ++i) {
      ARROW_ASSIGN_OR_RAISE(topo.order[i], ParseDim(o[i], Index("topology.order", i)));
    }
  }
  if (const YAML::Node d = t["distribute"]) {
    // (yaml-cpp: assigning to a Node rebinds the node it refers to, so no reassignment.)
    const bool is_map = d.IsMap();
    const YAML::Node axis = is_map ? d["axis"] : d;
    const std::string axis_path = is_map ? "topology.distribute.axis" : "topology.distribute";
    if (is_map) {
      ARROW_RETURN_NOT_OK(CheckMap(d, "topology.distribute", {"axis", "group"}));
      if (!axis) return ConfigError(axis_path, "is required");
      if (d["group"]) {
        ARROW_ASSIGN_OR_RAISE(topo.group,
                              PositiveInt(d["group"], "topology.distribute.group"));
      }
    }
    ARROW_ASSIGN_OR_RAISE(topo.distribute,
                          Enum<Topology::Axis>(axis, axis_path,
                                               {{"dp", Topology::Axis::kDp},
                                                {"cp", Topology::Axis::kCp},
                                                {"world", Topology::Axis::kWorld}}));
  }
  if (topo.distribute == Topology::Axis::kWorld) {
    topo.broadcast_tp = topo.broadcast_pp = false;
  }
  if (const YAML::Node bc = t["broadcast_at"]) {
    if (!bc.IsSequence()) {
      return ConfigError("topology.broadcast_at", "must be a list of tp | pp");
    }
    bool tp = false, pp = false;
    for (size_t i = 0; i < bc.size(); ++i) {
      const std::string path = Index("topology.broadcast_at", i);
      ARROW_ASSIGN_OR_RAISE(Dim dim, ParseDim(bc[i], path));
      if (dim == Dim::kDp || dim == Dim::kCp) {
        return ConfigError(path, std::string("'") + ToString(dim) +
                                     "' ranks receive different buckets or slices, not "
                                     "copies (broadcast at tp or pp)");
      }
      (dim == Dim::kTp ? tp : pp) = true;
    }
    if (topo.distribute == Topology::Axis::kWorld) {
      topo.broadcast_tp = tp;
      topo.broadcast_pp = pp;
    }
    // With distribute dp or cp, TP and PP ranks always receive their group's micro-batches;
    // listing them (or one of them) says so and changes nothing.
  }
  return topo;
}
// --- end topology tree ---

Result<Config> ParseRoot(const YAML::Node& root, const std::string& base_dir) {
  ARROW_RETURN_NOT_OK(CheckMap(root, "",
                               {"seed", "topology", "batch", "balance", "sources",
                                "runtime", "tokenizer", "phases"}));
  Config c;
  c.base_dir = base_dir;
  if (root["seed"]) {
    ARROW_ASSIGN_OR_RAISE(c.seed, Scalar<uint64_t>(root["seed"], "seed",
                                                   "a non-negative integer"));
  }
  if (root["tokenizer"]) {
    ARROW_ASSIGN_OR_RAISE(c.tokenizer, ParseTokenizer(root["tokenizer"], base_dir));
  }
  if (const YAML::Node t = root["topology"]) {
    ARROW_ASSIGN_OR_RAISE(c.topology, ParseTopology(t));
  }
  const YAML::Node b = root["batch"];
  if (!b) return ConfigError("batch", "is required");
  ARROW_RETURN_NOT_OK(CheckMap(
      b, "batch", {"global_tokens", "seq_len", "micro_batch_size", "packing"}));
  for (const char* required : {"global_tokens", "seq_len"}) {
    if (!b[required]) return ConfigError(Join("batch", required), "is required");
  }
  ARROW_ASSIGN_OR_RAISE(c.batch.global_tokens,
                        PositiveInt(b["global_tokens"], "batch.global_tokens"));
  ARROW_ASSIGN_OR_RAISE(c.batch.seq_len, PositiveInt(b["seq_len"], "batch.seq_len"));
  if (b["micro_batch_size"]) {
    ARROW_ASSIGN_OR_RAISE(c.batch.micro_batch_size,
                          PositiveInt(b["micro_batch_size"], "batch.micro_batch_size"));
  }
  if (b["packing"]) {
    ARROW_ASSIGN_OR_RAISE(c.batch.packing,
                          Scalar<bool>(b["packing"], "batch.packing", "true or false"));
    if (!c.batch.packing) {
      return ConfigError("batch.packing",
                         "false is not supported in this version (documents are packed)");
    }
  }
  if (const YAML::Node bal = root["balance"]) {
    ARROW_RETURN_NOT_OK(
        CheckMap(bal, "balance", {"cost", "algorithm", "split", "max_piece", "slack"}));
    // --- Planner: splitting levers (docs/planner.md) ---
    if (bal["split"]) {
      ARROW_ASSIGN_OR_RAISE(c.balance.split,
                            Enum<BalanceConfig::Split>(
                                bal["split"], "balance.split",
                                {{"boundary", BalanceConfig::Split::kBoundary},
                                 {"even", BalanceConfig::Split::kEven}}));
    }
    if (bal["max_piece"]) {
      ARROW_ASSIGN_OR_RAISE(c.balance.max_piece,
                            PositiveInt(bal["max_piece"], "balance.max_piece"));
    }
    if (bal["slack"]) {
      ARROW_ASSIGN_OR_RAISE(c.balance.slack,
                            Scalar<double>(bal["slack"], "balance.slack", "a number"));
      if (!(c.balance.slack >= 0 && c.balance.slack < 0.5)) {
        return ConfigError("balance.slack", "must be a number in [0, 0.5), got " +
                                                bal["slack"].Scalar());
      }
    }
    // --- end planner ---
    if (const YAML::Node cost = bal["cost"]) {
      ARROW_RETURN_NOT_OK(
          CheckMap(cost, "balance.cost", {"attn", "linear", "vision", "mode"}));
      // --- Planner: vision cost term (docs/planner.md) ---
      if (cost["vision"]) {
        ARROW_ASSIGN_OR_RAISE(c.balance.vision,
                              Weight(cost["vision"], "balance.cost.vision"));
      }
      if (cost["mode"]) {
        ARROW_ASSIGN_OR_RAISE(c.balance.cost_mode,
                              Enum<BalanceConfig::CostMode>(
                                  cost["mode"], "balance.cost.mode",
                                  {{"backbone", BalanceConfig::CostMode::kBackbone},
                                   {"hybrid", BalanceConfig::CostMode::kHybrid}}));
      }
      // --- end planner: vision cost term ---
      if (cost["attn"]) {
        ARROW_ASSIGN_OR_RAISE(c.balance.attn, Weight(cost["attn"], "balance.cost.attn"));
      }
      if (cost["linear"]) {
        ARROW_ASSIGN_OR_RAISE(c.balance.linear,
                              Weight(cost["linear"], "balance.cost.linear"));
      }
    }
    if (bal["algorithm"]) {
      ARROW_ASSIGN_OR_RAISE(
          c.balance.algorithm,
          Enum<BalanceAlgorithm>(bal["algorithm"], "balance.algorithm",
                                 {{"karmarkar_karp", BalanceAlgorithm::kKarmarkarKarp},
                                  {"greedy", BalanceAlgorithm::kGreedy},
                                  {"none", BalanceAlgorithm::kNone}}));
    }
  }
  if (const YAML::Node rt = root["runtime"]) {
    ARROW_RETURN_NOT_OK(
        CheckMap(rt, "runtime", {"kind", "read_ahead_bytes", "prefetch_steps", "cache",
                                 "threads", "memory_bytes"}));
    if (rt["kind"]) {
      ARROW_ASSIGN_OR_RAISE(std::string kind,
                            Scalar<std::string>(rt["kind"], "runtime.kind", "a string"));
      if (kind == "ray") {
        return ConfigError("runtime.kind", "'ray' is not supported in this version");
      }
      if (kind != "local") {
        return ConfigError("runtime.kind", "must be one of local | ray, got '" + kind + "'");
      }
    }
    if (rt["read_ahead_bytes"]) {
      ARROW_ASSIGN_OR_RAISE(c.runtime.read_ahead_bytes,
                            PositiveInt(rt["read_ahead_bytes"], "runtime.read_ahead_bytes"));
    }
    if (rt["prefetch_steps"]) {
      ARROW_ASSIGN_OR_RAISE(c.runtime.prefetch_steps,
                            PositiveInt(rt["prefetch_steps"], "runtime.prefetch_steps"));
    }
    if (rt["threads"]) {
      ARROW_ASSIGN_OR_RAISE(c.runtime.threads,
                            PositiveInt(rt["threads"], "runtime.threads"));
    }
    if (rt["memory_bytes"]) {
      ARROW_ASSIGN_OR_RAISE(c.runtime.memory_bytes,
                            PositiveInt(rt["memory_bytes"], "runtime.memory_bytes"));
    }
  }
  // --- Storage: a local cache of remote files, shared by every source ---
  std::string cache_dir;
  int64_t cache_max_bytes = 0;
  if (root["runtime"] && root["runtime"]["cache"]) {
    const YAML::Node cache = root["runtime"]["cache"];
    ARROW_RETURN_NOT_OK(CheckMap(cache, "runtime.cache", {"dir", "max_bytes"}));
    for (const char* required : {"dir", "max_bytes"}) {
      if (!cache[required]) return ConfigError(Join("runtime.cache", required), "is required");
    }
    ARROW_ASSIGN_OR_RAISE(cache_dir, Scalar<std::string>(cache["dir"], "runtime.cache.dir",
                                                         "a folder path"));
    if (cache_dir.empty()) return ConfigError("runtime.cache.dir", "must not be empty");
    cache_dir = ResolvePath(cache_dir, base_dir);
    ARROW_ASSIGN_OR_RAISE(cache_max_bytes,
                          PositiveInt(cache["max_bytes"], "runtime.cache.max_bytes"));
  }
  const YAML::Node sources = root["sources"];
  if (!sources) return ConfigError("sources", "is required");
  if (!sources.IsSequence() || sources.size() == 0) {
    return ConfigError("sources", "must be a non-empty list");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < sources.size(); ++i) {
    ARROW_ASSIGN_OR_RAISE(SourceConfig src,
                          ParseSource(sources[i], Index("sources", i), base_dir));
    if (!names.insert(src.name).second) {
      return ConfigError(Join(Index("sources", i), "name"),
                         "duplicate source name '" + src.name + "'");
    }
    if ((!src.text_column.empty() || src.chat.enabled()) && c.tokenizer.model.empty()) {
      return ConfigError(Index("sources", i),
                         "text_column and chat need a root-level tokenizer: {type: "
                         "sentencepiece, model: PATH}");
    }
    src.cache_dir = cache_dir;
    src.cache_max_bytes = cache_max_bytes;
    c.sources.push_back(std::move(src));
  }
  // --- Planner: phases (docs/planner.md) ---
  if (const YAML::Node phases = root["phases"]) {
    ARROW_ASSIGN_OR_RAISE(c.phases, ParsePhases(phases, c));
  }
  // --- end planner: phases ---
  ARROW_RETURN_NOT_OK(ValidateConfig(c));
  return c;
}

}  // namespace

const char* ToString(Oversize v) {
  switch (v) {
    case Oversize::kSplit: return "split";
    case Oversize::kTruncate: return "truncate";
    case Oversize::kSkip: return "skip";
  }
  return "?";
}

const char* ToString(OnError v) { return v == OnError::kFail ? "fail" : "skip"; }

const char* ToString(Dim d) {
  switch (d) {
    case Dim::kDp: return "dp";
    case Dim::kTp: return "tp";
    case Dim::kPp: return "pp";
    case Dim::kCp: return "cp";
  }
  return "?";
}

const char* ToString(BalanceAlgorithm v) {
  switch (v) {
    case BalanceAlgorithm::kKarmarkarKarp: return "karmarkar_karp";
    case BalanceAlgorithm::kGreedy: return "greedy";
    case BalanceAlgorithm::kNone: return "none";
  }
  return "?";
}

double WeightSchedule::At(int64_t step) const {
  if (step <= points.front().first) return points.front().second;
  if (stepwise) {  // planner: piecewise constant, the last point at or before `step`
    size_t i = 0;
    while (i + 1 < points.size() && points[i + 1].first <= step) ++i;
    return points[i].second;
  }
  for (size_t i = 1; i < points.size(); ++i) {
    if (step <= points[i].first) {
      const auto& [s0, w0] = points[i - 1];
      const auto& [s1, w1] = points[i];
      const double t = static_cast<double>(step - s0) / static_cast<double>(s1 - s0);
      return w0 + t * (w1 - w0);
    }
  }
  return points.back().second;
}

// --- Planner: per-step shape and weights (docs/planner.md) ---
const PhaseConfig* Config::PhaseAt(int64_t step) const {
  for (const PhaseConfig& p : phases) {
    if (step < p.until_step) return &p;
  }
  return nullptr;
}

int64_t Config::SeqLenAt(int64_t step) const {
  const PhaseConfig* p = PhaseAt(step);
  return p ? p->seq_len : batch.seq_len;
}

double Config::WeightAt(size_t source, int64_t step) const {
  const PhaseConfig* p = PhaseAt(step);
  if (p && source < p->weights.size() && p->weights[source]) {
    return p->weights[source]->At(step);
  }
  return sources[source].weight.At(step);
}
// --- end planner ---

std::string Config::Fingerprint() const {
  std::ostringstream os;
  os << seed << '|' << batch.global_tokens << '|' << batch.seq_len << '|'
     << batch.micro_batch_size;
  for (const auto& s : sources) {
    os << '|' << s.name << ':' << s.path << ':' << s.tokens_column << ':'
       << ToString(s.oversize) << ':' << s.shuffle_window_rows;
    // The byte bound changes the order (windows, blocks); 0 keeps the rows-only order
    // and its fingerprint, so states saved before the bound existed resume under it.
    if (s.shuffle_window_bytes != 0) os << ":wb=" << s.shuffle_window_bytes;
    // Transforms change the tokens; worker count does not change the stream.
    if (!s.text_column.empty() || s.chat.enabled()) {
      os << ":text=" << s.text_column << ":chat=" << s.chat.prompt_column << ','
         << s.chat.response_column << ',' << s.chat.messages_column;
    }
    if (s.user_transform.enabled()) {  // user transform: the function's name and input
      os << ":transform=" << s.user_transform.python;
      for (const auto& c : s.user_transform.columns) os << ',' << c;
    }
    if (!s.image_column.empty()) {  // images
      os << ":image=" << s.image_column << ',' << s.image_patch_size << ','
         << s.image_max_pixels << ',' << s.image_token_id;
    }
  }
  if (!tokenizer.model.empty()) {
    os << "|tok:" << tokenizer.model << ':' << tokenizer.bos << tokenizer.eos;
  }
  const std::string text = os.str();
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, then mixed
  for (unsigned char ch : text) h = (h ^ ch) * 0x100000001b3ULL;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(internal::Mix64(h)));
  return buf;
}

Status CheckTopology(const Topology& t) {
  bool seen[4] = {false, false, false, false};
  for (size_t i = 0; i < t.order.size(); ++i) {
    const int d = static_cast<int>(t.order[i]);
    if (seen[d]) {
      return ConfigError(Index("topology.order", i),
                         std::string("'") + ToString(t.order[i]) +
                             "' appears twice (the order lists dp, tp, pp and cp once each)");
    }
    seen[d] = true;
  }
  int64_t slots = 1;
  for (Dim d : t.order) slots *= t.distributed(d) ? t.size(d) : 1;
  if (t.group <= 0 || slots % t.group != 0) {
    return ConfigError("topology.distribute.group",
                       "must divide the ranks that receive different buckets (" +
                           std::to_string(slots) + "), got " + std::to_string(t.group));
  }
  return Status::OK();
}

Status ValidateConfig(const Config& c) {
  const auto& b = c.batch;
  if (b.global_tokens % b.seq_len != 0) {
    return ConfigError("batch.global_tokens",
                       "must be a multiple of batch.seq_len (" + std::to_string(b.seq_len) +
                           "), got " + std::to_string(b.global_tokens));
  }
  ARROW_RETURN_NOT_OK(CheckTopology(c.topology));
  const int64_t per_step = b.global_tokens / b.seq_len;
  const int64_t group = c.topology.buckets() * b.micro_batch_size;
  // Named as the user knows it: topology.dp unless distribute makes other buckets.
  const std::string buckets =
      c.topology.distribute == Topology::Axis::kDp && c.topology.group == 1
          ? "topology.dp"
          : "the buckets of topology.distribute (" + std::to_string(c.topology.buckets()) +
                ")";
  if (per_step % group != 0) {
    return ConfigError("batch.global_tokens",
                       "must be a multiple of " + buckets +
                           " * batch.micro_batch_size * batch.seq_len (" +
                           std::to_string(group * b.seq_len) + "), got " +
                           std::to_string(b.global_tokens));
  }
  // --- Planner: phases (docs/planner.md) ---
  for (size_t i = 0; i < c.phases.size(); ++i) {
    const std::string path = "phases[" + std::to_string(i) + "].seq_len";
    const int64_t L = c.phases[i].seq_len;
    if (b.global_tokens % L != 0 || (b.global_tokens / L) % group != 0) {
      return ConfigError(path, "batch.global_tokens (" + std::to_string(b.global_tokens) +
                                   ") must be a multiple of " + buckets +
                                   " * batch.micro_batch_size * seq_len (" +
                                   std::to_string(group * L) + ")");
    }
  }
  // --- end planner: phases ---
  // --- Views: context parallelism (construct/views.h, docs/parallelism.md) ---
  // Every sequence splits into 2*cp equal chunks, in every phase.
  if (c.topology.slices_context()) {
    const int64_t parts = 2 * c.topology.cp;
    for (size_t i = 0; i <= c.phases.size(); ++i) {
      const bool base = i == c.phases.size();
      const int64_t L = base ? b.seq_len : c.phases[i].seq_len;
      if (L % parts != 0) {
        const std::string key =
            base ? "batch.seq_len" : "phases[" + std::to_string(i) + "].seq_len";
        return ConfigError(key, "must be a multiple of 2 * topology.cp (" +
                                    std::to_string(parts) +
                                    ") to split sequences for context parallelism, got " +
                                    std::to_string(L));
      }
    }
  }
  // --- end views ---
  // Weights may be 0 for a while, but some source must have weight at every step.
  std::vector<int64_t> steps{0};
  for (const auto& s : c.sources) {
    for (const auto& [step, w] : s.weight.points) steps.push_back(step);
  }
  for (const auto& p : c.phases) {  // planner: phase boundaries and override points
    steps.push_back(p.until_step);
    if (p.until_step > 0) steps.push_back(p.until_step - 1);
    for (const auto& w : p.weights) {
      if (!w) continue;
      for (const auto& [step, v] : w->points) steps.push_back(step);
    }
  }
  for (int64_t step : steps) {
    double total = 0;
    for (size_t k = 0; k < c.sources.size(); ++k) total += c.WeightAt(k, step);
    if (total <= 0) {
      return ConfigError(c.PhaseAt(step) ? "phases" : "sources",
                         "all weights are 0 at step " + std::to_string(step));
    }
  }
  return Status::OK();
}

Result<Config> ParseConfig(const std::string& text, const std::string& base_dir) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return ConfigError("<config>", std::string("not valid YAML: ") + e.what());
  }
  try {
    return ParseRoot(root, base_dir);
  } catch (const YAML::Exception& e) {
    return ConfigError("<config>", e.what());
  }
}

Result<Config> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return ConfigError(path, "cannot open config file");
  std::stringstream ss;
  ss << in.rdbuf();
  std::filesystem::path p(path);
  std::string base = p.has_parent_path() ? p.parent_path().string() : ".";
  auto result = ParseConfig(ss.str(), base);
  if (!result.ok()) {
    // Prefix the file so the user knows which config is meant.
    const auto* detail = GetErrorDetail(result.status());
    return result.status().WithMessage(path + ": " + result.status().message())
        .WithDetail(std::make_shared<ErrorDetail>(
            ErrorKind::kConfig, detail ? detail->where() : std::string("<config>")));
  }
  return result;
}

Status SetDataParallel(Config* config, int64_t dp) {
  if (dp <= 0) return ConfigError("--dp", "must be > 0");
  config->topology.dp = dp;
  return ValidateConfig(*config);
}

}  // namespace braid
