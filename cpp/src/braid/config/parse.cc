// The config parser (config.h): YAML (or JSON) text to a typed Config. ParseConfig checks
// the text (limits_internal.h), loads it with yaml-cpp, and ParseRoot reads it section by
// section: seed, tokenizer, topology, batch and balance here, runtime in parse_runtime.cc,
// each source in parse_source.cc, phases in schedule.cc; it ends with ValidateConfig
// (validate.cc). Errors are ConfigErrors naming the key path (docs/config.md).
//
// Thread-safe: ParseConfig and LoadConfigFile may run on several threads at once (the
// visit budget is per thread).
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

#include "braid/config/config.h"
#include "braid/config/config_internal.h"
#include "braid/config/limits_internal.h"

namespace braid {
namespace internal {

std::string Index(const std::string& parent, size_t i) {
  return parent + "[" + std::to_string(i) + "]";
}

std::string Position(const YAML::Mark& mark) {
  if (mark.is_null()) return "";
  return " at line " + std::to_string(mark.line + 1) + ", column " +
         std::to_string(mark.column + 1);
}

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

Status CheckMap(const YAML::Node& node, const std::string& path,
                const std::set<std::string>& known) {
  if (!node.IsMap()) {
    if (path.empty()) {
      return ConfigError("config", node.IsDefined() && !node.IsNull()
                                       ? "must be a mapping (the document's top level)"
                                       : "must be a mapping (the document is empty)");
    }
    return ConfigError(path, "must be a mapping");
  }
  ARROW_RETURN_NOT_OK(Visit(node.size(), path));
  std::set<std::string> seen;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) {
      return ConfigError(path.empty() ? "config" : path,
                         "keys must be strings" + Position(kv.first.Mark()));
    }
    const std::string key = kv.first.Scalar();
    if (!known.count(key)) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      return ConfigError(Join(path, key), "unknown key (known: " + list + ")");
    }
    if (!seen.insert(key).second) {
      return ConfigError(Join(path, key), "appears twice");
    }
  }
  return Status::OK();
}

Result<int64_t> PositiveInt(const YAML::Node& node, const std::string& path) {
  ARROW_ASSIGN_OR_RAISE(int64_t v, Scalar<int64_t>(node, path, "an integer"));
  if (v <= 0) return ConfigError(path, "must be > 0, got " + std::to_string(v));
  return v;
}

Result<double> Weight(const YAML::Node& node, const std::string& path) {
  ARROW_ASSIGN_OR_RAISE(double w, Scalar<double>(node, path, "a number"));
  if (!std::isfinite(w) || w < 0) {
    return ConfigError(path,
                       "must be a finite number >= 0, got " +
                           EscapeForMessage(node.Scalar()));
  }
  return w;
}

namespace {

// The topology tree: rank order, distribute, broadcast_at (docs/parallelism.md).
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
    ARROW_RETURN_NOT_OK(Visit(bc.size(), "topology.broadcast_at"));
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

// batch: the shape of every step.
Status ParseBatch(const YAML::Node& b, BatchConfig* batch) {
  ARROW_RETURN_NOT_OK(CheckMap(
      b, "batch",
      {"global_tokens", "seq_len", "micro_batch_size", "packing", "pad_to_multiple_of"}));
  for (const char* required : {"global_tokens", "seq_len"}) {
    if (!b[required]) return ConfigError(Join("batch", required), "is required");
  }
  ARROW_ASSIGN_OR_RAISE(batch->global_tokens,
                        PositiveInt(b["global_tokens"], "batch.global_tokens"));
  ARROW_ASSIGN_OR_RAISE(batch->seq_len, PositiveInt(b["seq_len"], "batch.seq_len"));
  if (b["micro_batch_size"]) {
    ARROW_ASSIGN_OR_RAISE(batch->micro_batch_size,
                          PositiveInt(b["micro_batch_size"], "batch.micro_batch_size"));
  }
  if (b["pad_to_multiple_of"]) {
    ARROW_ASSIGN_OR_RAISE(batch->pad_to_multiple_of,
                          PositiveInt(b["pad_to_multiple_of"], "batch.pad_to_multiple_of"));
  }
  if (b["packing"]) {
    ARROW_ASSIGN_OR_RAISE(batch->packing,
                          Scalar<bool>(b["packing"], "batch.packing", "true or false"));
    if (!batch->packing) {
      return ConfigError("batch.packing",
                         "false is not supported in this version (documents are packed)");
    }
  }
  return Status::OK();
}

// balance.cost: the coefficients of a sequence's cost (docs/planner.md).
Status ParseCost(const YAML::Node& cost, BalanceConfig* balance) {
  ARROW_RETURN_NOT_OK(CheckMap(cost, "balance.cost", {"attn", "linear", "vision", "mode"}));
  if (cost["vision"]) {
    ARROW_ASSIGN_OR_RAISE(balance->vision, Weight(cost["vision"], "balance.cost.vision"));
  }
  if (cost["mode"]) {
    ARROW_ASSIGN_OR_RAISE(balance->cost_mode,
                          Enum<BalanceConfig::CostMode>(
                              cost["mode"], "balance.cost.mode",
                              {{"backbone", BalanceConfig::CostMode::kBackbone},
                               {"hybrid", BalanceConfig::CostMode::kHybrid}}));
  }
  if (cost["attn"]) {
    ARROW_ASSIGN_OR_RAISE(balance->attn, Weight(cost["attn"], "balance.cost.attn"));
  }
  if (cost["linear"]) {
    ARROW_ASSIGN_OR_RAISE(balance->linear, Weight(cost["linear"], "balance.cost.linear"));
  }
  return Status::OK();
}

// balance: how each step's sequences are cut, costed and spread over the buckets.
Status ParseBalance(const YAML::Node& bal, BalanceConfig* balance) {
  ARROW_RETURN_NOT_OK(
      CheckMap(bal, "balance", {"cost", "algorithm", "split", "max_piece", "slack"}));
  if (bal["split"]) {
    ARROW_ASSIGN_OR_RAISE(balance->split,
                          Enum<BalanceConfig::Split>(
                              bal["split"], "balance.split",
                              {{"boundary", BalanceConfig::Split::kBoundary},
                               {"aligned", BalanceConfig::Split::kAligned},
                               {"even", BalanceConfig::Split::kEven}}));
  }
  if (bal["max_piece"]) {
    ARROW_ASSIGN_OR_RAISE(balance->max_piece,
                          PositiveInt(bal["max_piece"], "balance.max_piece"));
  }
  if (bal["slack"]) {
    ARROW_ASSIGN_OR_RAISE(balance->slack,
                          Scalar<double>(bal["slack"], "balance.slack", "a number"));
    if (!(balance->slack >= 0 && balance->slack < 0.5)) {
      return ConfigError("balance.slack", "must be a number in [0, 0.5), got " +
                                              EscapeForMessage(bal["slack"].Scalar()));
    }
  }
  if (const YAML::Node cost = bal["cost"]) {
    ARROW_RETURN_NOT_OK(ParseCost(cost, balance));
  }
  if (bal["algorithm"]) {
    ARROW_ASSIGN_OR_RAISE(
        balance->algorithm,
        Enum<BalanceAlgorithm>(bal["algorithm"], "balance.algorithm",
                               {{"karmarkar_karp", BalanceAlgorithm::kKarmarkarKarp},
                                {"greedy", BalanceAlgorithm::kGreedy},
                                {"none", BalanceAlgorithm::kNone}}));
  }
  return Status::OK();
}

// sources: the list, each entry parsed (parse_source.cc) and checked against the others
// and the root tokenizer, then given the runtime's caches. REQUIRES: c->tokenizer parsed.
Status ParseSources(const YAML::Node& sources, const std::string& base_dir,
                    const RuntimeCaches& caches, Config* c) {
  if (!sources) return ConfigError("sources", "is required");
  if (!sources.IsSequence() || sources.size() == 0) {
    return ConfigError("sources", "must be a non-empty list");
  }
  ARROW_RETURN_NOT_OK(Visit(sources.size(), "sources"));
  std::set<std::string> names;
  for (size_t i = 0; i < sources.size(); ++i) {
    ARROW_ASSIGN_OR_RAISE(SourceConfig src,
                          ParseSource(sources[i], Index("sources", i), base_dir));
    if (!names.insert(src.name).second) {
      return ConfigError(Join(Index("sources", i), "name"),
                         "duplicate source name '" + EscapeForMessage(src.name) + "'");
    }
    const bool tokenized = !src.text_column.empty() || src.chat.enabled();
    if (tokenized && c->tokenizer.model.empty() && src.tokenizer.model.empty()) {
      return ConfigError(Index("sources", i),
                         "text_column and chat need a tokenizer (root-level or the "
                         "source's own): {type: sentencepiece, model: PATH} or "
                         "{type: huggingface, file: PATH}");
    }
    if (!tokenized && !src.tokenizer.model.empty()) {
      return ConfigError(Join(Index("sources", i), "tokenizer"),
                         "only text_column and chat sources are tokenized");
    }
    src.cache_dir = caches.cache_dir;
    src.cache_max_bytes = caches.cache_max_bytes;
    src.length_cache_dir = caches.length_cache_dir;
    c->sources.push_back(std::move(src));
  }
  return Status::OK();
}

// The document, section by section in a fixed order (which error a config with several
// gets), then the cross-field checks.
Result<Config> ParseRoot(const YAML::Node& root, const std::string& base_dir) {
  ARROW_RETURN_NOT_OK(CheckMap(root, "",
                               {"seed", "topology", "batch", "balance", "mix",
                                "sources", "runtime", "tokenizer", "phases"}));
  Config c;
  c.base_dir = base_dir;
  if (root["seed"]) {
    ARROW_ASSIGN_OR_RAISE(c.seed, Scalar<uint64_t>(root["seed"], "seed",
                                                   "a non-negative integer"));
  }
  if (root["tokenizer"]) {
    ARROW_ASSIGN_OR_RAISE(c.tokenizer,
                          ParseTokenizer(root["tokenizer"], "tokenizer", base_dir));
  }
  if (const YAML::Node t = root["topology"]) {
    ARROW_ASSIGN_OR_RAISE(c.topology, ParseTopology(t));
  }
  const YAML::Node b = root["batch"];
  if (!b) return ConfigError("batch", "is required");
  ARROW_RETURN_NOT_OK(ParseBatch(b, &c.batch));
  if (const YAML::Node bal = root["balance"]) {
    ARROW_RETURN_NOT_OK(ParseBalance(bal, &c.balance));
  }
  if (const YAML::Node mix = root["mix"]) {
    ARROW_RETURN_NOT_OK(CheckMap(mix, "mix", {"exact"}));
    if (mix["exact"]) {
      ARROW_ASSIGN_OR_RAISE(c.mix.exact,
                            Enum<MixConfig::Exact>(mix["exact"], "mix.exact",
                                                   {{"time", MixConfig::Exact::kTime},
                                                    {"step", MixConfig::Exact::kStep}}));
    }
  }
  if (const YAML::Node rt = root["runtime"]) {
    ARROW_RETURN_NOT_OK(ParseRuntime(rt, &c.runtime));
  }
  ARROW_ASSIGN_OR_RAISE(RuntimeCaches caches,
                        ParseRuntimeCaches(root["runtime"], base_dir));
  ARROW_RETURN_NOT_OK(ParseSources(root["sources"], base_dir, caches, &c));
  if (const YAML::Node phases = root["phases"]) {
    ARROW_ASSIGN_OR_RAISE(c.phases, ParsePhases(phases, c));
  }
  ARROW_RETURN_NOT_OK(ValidateConfig(c));
  return c;
}

}  // namespace
}  // namespace internal

const char* ToString(Oversize v) {
  switch (v) {
    case Oversize::kSplit: return "split";
    case Oversize::kTruncate: return "truncate";
    case Oversize::kSkip: return "skip";
  }
  return "?";
}

const char* ToString(OnError v) { return v == OnError::kFail ? "fail" : "skip"; }

const char* ToString(SourceFormat v) {
  switch (v) {
    case SourceFormat::kAuto: return "auto";
    case SourceFormat::kParquet: return "parquet";
    case SourceFormat::kMegatron: return "megatron";
    case SourceFormat::kJsonl: return "jsonl";
    case SourceFormat::kHfArrow: return "hf_arrow";
    case SourceFormat::kWebDataset: return "webdataset";
  }
  return "auto";
}

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

Result<Config> ParseConfig(const std::string& text, const std::string& base_dir) {
  ARROW_RETURN_NOT_OK(internal::CheckUtf8(text));
  ARROW_RETURN_NOT_OK(internal::CheckNestingDepth(text));
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return ConfigError("config", "not valid YAML" + internal::Position(e.mark) + ": " +
                                     EscapeForMessage(e.msg, 200));
  } catch (const std::exception& e) {  // e.g. std::bad_alloc
    return ConfigError("config", std::string("cannot be parsed: ") + e.what());
  }
  // Aliases are shared nodes, not copies; the budget bounds how often they are walked.
  internal::SetVisitBudget(static_cast<int64_t>(text.size()) + 64);
  try {
    ARROW_ASSIGN_OR_RAISE(Config config, internal::ParseRoot(root, base_dir));
    config.source_text = text;
    return config;
  } catch (const YAML::Exception& e) {
    return ConfigError("config", "cannot be read" + internal::Position(e.mark) + ": " +
                                     EscapeForMessage(e.msg, 200));
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
            ErrorKind::kConfig, detail ? detail->where() : std::string("config")));
  }
  return result;
}

}  // namespace braid
