#include "braid/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <unordered_map>

#include "braid/util/hash_internal.h"
#include "braid/util/rng_internal.h"

namespace braid {
namespace {

// --- Hardening (docs/config.md, "Errors and limits"): key segments, UTF-8, depth and
// alias budgets ---
// The length of the well-formed UTF-8 sequence of 2-4 bytes at text[i] (no overlong
// forms, surrogates or values above U+10FFFF), or 0.
size_t Utf8Length(std::string_view text, size_t i) {
  const auto ch = static_cast<unsigned char>(text[i]);
  size_t len = 0;
  uint32_t min = 0, cp = 0;
  if ((ch & 0xE0) == 0xC0) {
    len = 2, min = 0x80, cp = ch & 0x1F;
  } else if ((ch & 0xF0) == 0xE0) {
    len = 3, min = 0x800, cp = ch & 0x0F;
  } else if ((ch & 0xF8) == 0xF0) {
    len = 4, min = 0x10000, cp = ch & 0x07;
  }
  if (len == 0 || i + len > text.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto cont = static_cast<unsigned char>(text[i + k]);
    if ((cont & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cont & 0x3F);
  }
  return cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF) ? len : 0;
}

bool IsIdentifier(const std::string& key) {
  if (key.empty() || key.size() > 64) return false;  // a long key is quoted and cut
  for (unsigned char ch : key) {
    if (!std::isalnum(ch) && ch != '_' && ch != '-') return false;
  }
  return true;
}

// `parent.key`, or `parent["key"]` (escaped, cut) for a key that is not an identifier, so
// a user's odd key never makes the path ambiguous or the message more than one line.
std::string Join(const std::string& parent, const std::string& key) {
  if (IsIdentifier(key)) return parent.empty() ? key : parent + "." + key;
  std::string quoted;
  for (char ch : key.substr(0, 64)) {
    if (ch == '"' || ch == '\\') quoted += '\\';
    quoted += ch;
  }
  return parent + "[\"" + EscapeForMessage(quoted, 80) +
         (key.size() > 64 ? "...\"]" : "\"]");
}

std::string Position(const YAML::Mark& mark) {
  if (mark.is_null()) return "";
  return " at line " + std::to_string(mark.line + 1) + ", column " +
         std::to_string(mark.column + 1);
}

// Rejects containers nested deeper than kMaxConfigDepth before yaml-cpp sees the text:
// its parser recurses once per level (up to 2000, then throws), which a small thread
// stack or a sanitizer's larger frames may not hold. The depth is estimated from the
// text: block indentation levels and compact "- " / "? " entries, plus flow brackets
// outside quotes and comments. It never under-counts a document yaml-cpp would parse.
Status CheckNestingDepth(const std::string& text) {
  std::vector<size_t> indents;  // columns of the open block levels
  size_t block = 0;             // block levels of the current line
  int64_t flow = 0;
  size_t line = 1, line_begin = 0;
  char quote = 0;  // '"' or '\'' inside a quoted scalar
  bool line_start = true;
  auto too_deep = [&](size_t at) {
    return ConfigError("config", "nested deeper than " + std::to_string(kMaxConfigDepth) +
                                     " levels at line " + std::to_string(line) +
                                     ", column " + std::to_string(at - line_begin + 1) +
                                     " (the limit on nesting; a config needs 8)");
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '\n') {
      ++line;
      line_begin = i + 1;
      line_start = true;
      continue;
    }
    if (quote != 0) {
      if (quote == '"' && ch == '\\') {
        if (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      } else if (ch == quote) {
        if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
          ++i;  // '' inside a single-quoted scalar
        } else {
          quote = 0;
        }
      }
      continue;
    }
    if (line_start && flow == 0) {
      line_start = false;
      size_t j = i;
      while (j < text.size() && text[j] == ' ') ++j;
      if (j == text.size() || text[j] == '\n' || text[j] == '\r' || text[j] == '#') {
        i = j - 1;  // blank or comment-only line: no level
        continue;
      }
      while (!indents.empty() && indents.back() >= j - line_begin) indents.pop_back();
      indents.push_back(j - line_begin);
      // Compact nested entries on one line: "- - - x", "- ? x".
      while (j + 1 < text.size() && (text[j] == '-' || text[j] == '?') &&
             (text[j + 1] == ' ' || text[j + 1] == '\t')) {
        j += 2;
        while (j < text.size() && text[j] == ' ') ++j;
        indents.push_back(j - line_begin);
      }
      block = indents.size();
      if (block > size_t{kMaxConfigDepth}) return too_deep(j);
      i = j - 1;
      continue;
    }
    line_start = false;
    const char prev = i == line_begin ? ' ' : text[i - 1];
    const bool after_space = prev == ' ' || prev == '\t' || prev == '\r';
    const bool token_start =
        after_space || (flow > 0 && (prev == '[' || prev == '{' || prev == ',' ||
                                     prev == ':'));
    if (ch == '#' && after_space) {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
    } else if ((ch == '"' || ch == '\'') && token_start) {
      quote = ch;
    } else if ((ch == '[' || ch == '{') && (flow > 0 || token_start)) {
      ++flow;
      if (static_cast<int64_t>(block) + flow > kMaxConfigDepth) return too_deep(i);
    } else if ((ch == ']' || ch == '}') && flow > 0) {
      --flow;
    }
  }
  return Status::OK();
}

// YAML is Unicode text, and every name and path of a config reaches JSON (plans, states,
// reports), whose writer throws on invalid UTF-8: reject it up front, with its position.
Status CheckUtf8(const std::string& text) {
  size_t line = 1, line_begin = 0;
  for (size_t i = 0; i < text.size();) {
    const auto ch = static_cast<unsigned char>(text[i]);
    if (ch < 0x80) {
      if (ch == '\n') line_begin = i + 1, ++line;
      ++i;
      continue;
    }
    const size_t len = Utf8Length(text, i);
    if (len == 0) {
      return ConfigError("config", "not valid UTF-8 at line " + std::to_string(line) +
                                       ", column " + std::to_string(i - line_begin + 1) +
                                       " (byte " + EscapeForMessage(text.substr(i, 1)) +
                                       ")");
    }
    i += len;
  }
  return Status::OK();
}

// Values the parser may still visit in this thread's ParseConfig: every element of a
// list or mapping that it walks costs one. A document without aliases costs less than
// its size in bytes; a `*alias` stands for a whole anchored node, so only aliases can
// exceed it (an alias bomb: lists of aliases of lists of aliases ...).
thread_local int64_t t_visit_budget = 0;

Status Visit(size_t elements, const std::string& path) {
  t_visit_budget -= static_cast<int64_t>(elements);
  if (t_visit_budget < 0) {
    return ConfigError(path.empty() ? "config" : path,
                       "aliases expand the document to more values than it has bytes; "
                       "write the repeated values out");
  }
  return Status::OK();
}

// Overflow-checked product of positive sizes; nullopt when it exceeds int64.
std::optional<int64_t> Product(std::initializer_list<int64_t> factors) {
  int64_t out = 1;
  for (int64_t f : factors) {
    if (__builtin_mul_overflow(out, f, &out)) return std::nullopt;
  }
  return out;
}
// --- end hardening ---

std::string Index(const std::string& parent, size_t i) {
  return parent + "[" + std::to_string(i) + "]";
}

// Checks that `node` is a map with no keys outside `known`.
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
  ARROW_RETURN_NOT_OK(Visit(sched.size(), spath));
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
  ARROW_RETURN_NOT_OK(Visit(node.size(), "phases"));
  std::unordered_map<std::string, size_t> index;  // source name -> config order
  for (size_t k = 0; k < c.sources.size(); ++k) index.emplace(c.sources[k].name, k);
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
      ARROW_RETURN_NOT_OK(Visit(w.size(), wpath));
      std::vector<bool> given(c.sources.size(), false);
      for (const auto& kv : w) {
        if (!kv.first.IsScalar()) {
          return ConfigError(wpath,
                             "keys must be source names" + Position(kv.first.Mark()));
        }
        const std::string name = kv.first.Scalar();
        const auto it = index.find(name);
        if (it == index.end()) {
          return ConfigError(Join(wpath, name), "is not a source name");
        }
        const size_t k = it->second;
        if (given[k]) return ConfigError(Join(wpath, name), "appears twice");
        given[k] = true;
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
    ARROW_RETURN_NOT_OK(CheckMap(t, key, {"python", "columns", "batched"}));
    if (!t["python"]) return ConfigError(Join(key, "python"), "is required");
    ARROW_ASSIGN_OR_RAISE(src->user_transform.python,
                          non_empty(t["python"], Join(key, "python")));
    const std::string ckey = Join(key, "columns");
    const YAML::Node cols = t["columns"];
    if (!cols) return ConfigError(ckey, "is required (the columns the function reads)");
    if (!cols.IsSequence() || cols.size() == 0) {
      return ConfigError(ckey, "must be a non-empty list of column names");
    }
    ARROW_RETURN_NOT_OK(Visit(cols.size(), ckey));
    for (size_t i = 0; i < cols.size(); ++i) {
      ARROW_ASSIGN_OR_RAISE(auto name, non_empty(cols[i], Index(ckey, i)));
      src->user_transform.columns.push_back(std::move(name));
    }
    if (t["batched"]) {
      ARROW_ASSIGN_OR_RAISE(src->user_transform.batched,
                            Scalar<bool>(t["batched"], Join(key, "batched"), "a boolean"));
    }
  }
  if (node["loaders"]) {
    ARROW_ASSIGN_OR_RAISE(src->loaders, PositiveInt(node["loaders"], Join(path, "loaders")));
  }
  // --- end user transform and sharding ---
  return Status::OK();
}

Result<TokenizerConfig> ParseTokenizer(const YAML::Node& node, const std::string& key,
                                       const std::string& base_dir) {
  TokenizerConfig t;
  t.key = key;
  if (!node.IsMap()) {
    return ConfigError(key, "must be a map: {type: sentencepiece, model: PATH} or "
                            "{type: huggingface, file: PATH}");
  }
  if (node["type"]) {
    ARROW_ASSIGN_OR_RAISE(t.type,
                          Scalar<std::string>(node["type"], Join(key, "type"), "a string"));
    if (t.type != "sentencepiece" && t.type != "huggingface") {
      return ConfigError(Join(key, "type"),
                         "must be sentencepiece or huggingface, got '" + EscapeForMessage(t.type) + "'");
    }
  }
  // The path key: `model` (a SentencePiece .model) or `file` (a tokenizer.json).
  const char* path_key = t.huggingface() ? "file" : "model";
  if (t.huggingface()) {
    ARROW_RETURN_NOT_OK(CheckMap(node, key, {"type", "file", "add_special_tokens",
                                             "bos_token", "eos_token", "chat_template"}));
  } else {
    ARROW_RETURN_NOT_OK(CheckMap(node, key, {"type", "model", "bos", "eos"}));
  }
  if (!node[path_key]) return ConfigError(Join(key, path_key), "is required");
  ARROW_ASSIGN_OR_RAISE(std::string model,
                        Scalar<std::string>(node[path_key], Join(key, path_key),
                                            "a string"));
  if (model.empty()) return ConfigError(Join(key, path_key), "must not be empty");
  t.model = ResolvePath(model, base_dir);
  if (node["bos"]) {
    ARROW_ASSIGN_OR_RAISE(t.bos, Scalar<bool>(node["bos"], Join(key, "bos"), "a boolean"));
  }
  if (node["eos"]) {
    ARROW_ASSIGN_OR_RAISE(t.eos, Scalar<bool>(node["eos"], Join(key, "eos"), "a boolean"));
  }
  if (node["add_special_tokens"]) {
    ARROW_ASSIGN_OR_RAISE(t.add_special_tokens,
                          Scalar<bool>(node["add_special_tokens"],
                                       Join(key, "add_special_tokens"), "a boolean"));
  }
  if (node["chat_template"]) {
    ARROW_ASSIGN_OR_RAISE(
        t.chat_template,
        Enum<bool>(node["chat_template"], Join(key, "chat_template"),
                   {{"auto", true}, {"plain", false}}));
  }
  for (auto [name, out] : {std::pair{"bos_token", &t.bos_token},
                           std::pair{"eos_token", &t.eos_token}}) {
    if (!node[name]) continue;
    ARROW_ASSIGN_OR_RAISE(*out,
                          Scalar<std::string>(node[name], Join(key, name), "a string"));
    if (out->empty()) return ConfigError(Join(key, name), "must not be empty");
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
  if (src->image_patch_size > src->image_max_pixels / src->image_patch_size) {
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
                                "transform", "loaders", "tokenizer", "length_column"}));
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
  if (node["length_column"]) {
    const std::string key = Join(path, "length_column");
    ARROW_ASSIGN_OR_RAISE(src.length_column,
                          Scalar<std::string>(node["length_column"], key, "a string"));
    if (src.length_column.empty()) return ConfigError(key, "must not be empty");
    if (src.tokens_column.empty()) {
      return ConfigError(key,
                         "applies to tokens_column sources only (a text, chat, image or "
                         "transform source has no token count before it is tokenized)");
    }
    if (src.length_column == src.tokens_column) {
      return ConfigError(key, "must name another column than tokens_column");
    }
  }
  if (node["tokenizer"]) {
    ARROW_ASSIGN_OR_RAISE(src.tokenizer,
                          ParseTokenizer(node["tokenizer"], Join(path, "tokenizer"),
                                         base_dir));
  }
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
// --- end topology tree ---

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
                                 {"aligned", BalanceConfig::Split::kAligned},
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
                                                EscapeForMessage(bal["slack"].Scalar()));
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
  // --- Planner: mix accounting (docs/planner.md) ---
  if (const YAML::Node mix = root["mix"]) {
    ARROW_RETURN_NOT_OK(CheckMap(mix, "mix", {"exact"}));
    if (mix["exact"]) {
      ARROW_ASSIGN_OR_RAISE(c.mix.exact,
                            Enum<MixConfig::Exact>(mix["exact"], "mix.exact",
                                                   {{"time", MixConfig::Exact::kTime},
                                                    {"step", MixConfig::Exact::kStep}}));
    }
  }
  // --- end planner ---
  if (const YAML::Node rt = root["runtime"]) {
    ARROW_RETURN_NOT_OK(
        CheckMap(rt, "runtime", {"kind", "read_ahead_bytes", "prefetch_steps", "cache",
                                 "length_cache",
                                 "threads", "memory_bytes", "address", "namespace", "job",
                                 "source_actors", "steps_in_flight", "timeout_s",
                                 "actor_resources", "shadow", "delivery"}));
    if (rt["kind"]) {
      ARROW_ASSIGN_OR_RAISE(std::string kind,
                            Scalar<std::string>(rt["kind"], "runtime.kind", "a string"));
      if (kind == "ray") {
        c.runtime.kind = RuntimeConfig::Kind::kRay;
      } else if (kind != "local") {
        return ConfigError("runtime.kind", "must be one of local | ray, got '" +
                                               EscapeForMessage(kind) + "'");
      }
    }
    const std::pair<const char*, std::string*> names[] = {
        {"address", &c.runtime.address},
        {"namespace", &c.runtime.ray_namespace},
        {"job", &c.runtime.job}};
    for (const auto& [key, out] : names) {
      if (!rt[key]) continue;
      ARROW_ASSIGN_OR_RAISE(*out, Scalar<std::string>(rt[key], Join("runtime", key),
                                                      "a string"));
      if (out->empty() && std::string(key) != "job") {
        return ConfigError(Join("runtime", key), "must not be empty");
      }
    }
    if (rt["source_actors"]) {
      ARROW_ASSIGN_OR_RAISE(c.runtime.source_actors,
                            Scalar<int64_t>(rt["source_actors"], "runtime.source_actors",
                                            "an integer"));
      if (c.runtime.source_actors < 0) {
        return ConfigError("runtime.source_actors",
                           "must be >= 0 (0: the planner actor serves the payloads)");
      }
    }
    if (rt["delivery"]) {
      ARROW_ASSIGN_OR_RAISE(
          c.runtime.delivery,
          Enum<RuntimeConfig::Delivery>(
              rt["delivery"], "runtime.delivery",
              {{"node", RuntimeConfig::Delivery::kNode},
               {"object_store", RuntimeConfig::Delivery::kObjectStore}}));
    }
    if (rt["steps_in_flight"]) {
      ARROW_ASSIGN_OR_RAISE(c.runtime.steps_in_flight,
                            PositiveInt(rt["steps_in_flight"], "runtime.steps_in_flight"));
    }
    if (const YAML::Node res = rt["actor_resources"]) {
      if (!res.IsMap()) {
        return ConfigError("runtime.actor_resources",
                           "must map Ray resource names to amounts");
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
        c.runtime.actor_resources.emplace_back(kv.first.Scalar(), amount);
      }
    }
    if (rt["shadow"]) {
      ARROW_ASSIGN_OR_RAISE(c.runtime.shadow,
                            Scalar<bool>(rt["shadow"], "runtime.shadow", "true or false"));
      if (c.runtime.shadow && c.runtime.source_actors == 0) {
        return ConfigError("runtime.shadow",
                           "needs source actors (runtime.source_actors >= 1) to shadow");
      }
    }
    if (rt["timeout_s"]) {
      ARROW_ASSIGN_OR_RAISE(c.runtime.timeout_s,
                            Scalar<double>(rt["timeout_s"], "runtime.timeout_s", "seconds"));
      if (!(c.runtime.timeout_s > 0) || c.runtime.timeout_s > 86400) {
        return ConfigError("runtime.timeout_s", "must be in (0, 86400] seconds");
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
  // --- Planning: cached token counts of tokenized sources (io/length_cache.h) ---
  std::string length_cache_dir;
  if (root["runtime"] && root["runtime"]["length_cache"]) {
    ARROW_ASSIGN_OR_RAISE(length_cache_dir,
                          Scalar<std::string>(root["runtime"]["length_cache"],
                                              "runtime.length_cache", "a folder path"));
    if (length_cache_dir.empty()) {
      return ConfigError("runtime.length_cache", "must not be empty");
    }
    length_cache_dir = ResolvePath(length_cache_dir, base_dir);
  }
  const YAML::Node sources = root["sources"];
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
    if (tokenized && c.tokenizer.model.empty() && src.tokenizer.model.empty()) {
      return ConfigError(Index("sources", i),
                         "text_column and chat need a tokenizer (root-level or the "
                         "source's own): {type: sentencepiece, model: PATH} or "
                         "{type: huggingface, file: PATH}");
    }
    if (!tokenized && !src.tokenizer.model.empty()) {
      return ConfigError(Join(Index("sources", i), "tokenizer"),
                         "only text_column and chat sources are tokenized");
    }
    src.cache_dir = cache_dir;
    src.cache_max_bytes = cache_max_bytes;
    src.length_cache_dir = length_cache_dir;
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
  // Binary searches (points sorted by step): a schedule may have many points.
  const auto by_step = [](const std::pair<int64_t, double>& p, int64_t s) {
    return p.first < s;
  };
  if (stepwise) {  // planner: piecewise constant, the last point at or before `step`
    const auto after = std::upper_bound(
        points.begin(), points.end(), step,
        [](int64_t s, const std::pair<int64_t, double>& p) { return s < p.first; });
    return std::prev(after)->second;
  }
  // The first point at or after `step` (not the first point: step > its step).
  const auto it = std::lower_bound(points.begin(), points.end(), step, by_step);
  if (it == points.end()) return points.back().second;
  const auto& [s0, w0] = *std::prev(it);
  const auto& [s1, w1] = *it;
  const double t = static_cast<double>(step - s0) / static_cast<double>(s1 - s0);
  return w0 + t * (w1 - w0);
}

// --- Planner: per-step shape and weights (docs/planner.md) ---
const PhaseConfig* Config::PhaseAt(int64_t step) const {
  // The first phase with step < until_step (until_step strictly increasing).
  const auto it = std::upper_bound(
      phases.begin(), phases.end(), step,
      [](int64_t s, const PhaseConfig& p) { return s < p.until_step; });
  return it == phases.end() ? nullptr : &*it;
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
    // Transforms change the tokens; worker count does not change the stream, nor does
    // length_column (a length that disagrees with its token list is an error).
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
  // A tokenizer's identity: SentencePiece as it always was, Hugging Face with its options.
  auto tok = [&os](const TokenizerConfig& t) {
    if (t.huggingface()) {
      os << "hf:" << t.model << ':' << t.add_special_tokens << ':' << t.bos_token << ':'
         << t.eos_token << (t.chat_template ? "" : ":plain");
    } else {
      os << t.model << ':' << t.bos << t.eos;
    }
  };
  if (!tokenizer.model.empty()) {
    os << "|tok:";
    tok(tokenizer);
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].tokenizer.model.empty()) continue;
    os << "|tok" << i << ':';
    tok(sources[i].tokenizer);
  }
  const std::string text = os.str();
  const uint64_t h = internal::Fnv1a(text);  // then mixed
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(internal::Mix64(h)));
  return buf;
}

Status CheckTopology(const Topology& t) {
  if (!Product({t.dp, t.tp, t.pp, t.cp})) {
    return ConfigError("topology", "dp * tp * pp * cp must be at most 2^63 - 1");
  }
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
  // CheckTopology bounds the buckets; products beyond int64 cannot divide global_tokens.
  const std::optional<int64_t> group_or =
      Product({c.topology.buckets(), b.micro_batch_size});
  auto group_tokens = [&](int64_t seq_len) {
    const auto v = group_or ? Product({*group_or, seq_len}) : std::nullopt;
    return v ? std::to_string(*v) : std::string("more than 2^63 - 1");
  };
  const int64_t group = group_or.value_or(std::numeric_limits<int64_t>::max());
  // Named as the user knows it: topology.dp unless distribute makes other buckets.
  const std::string buckets =
      c.topology.distribute == Topology::Axis::kDp && c.topology.group == 1
          ? "topology.dp"
          : "the buckets of topology.distribute (" + std::to_string(c.topology.buckets()) +
                ")";
  if (!group_or || per_step % group != 0) {
    return ConfigError("batch.global_tokens",
                       "must be a multiple of " + buckets +
                           " * batch.micro_batch_size * batch.seq_len (" +
                           group_tokens(b.seq_len) + "), got " +
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
                                   group_tokens(L) + ")");
    }
  }
  // --- end planner: phases ---
  // --- Views: context parallelism (construct/views.h, docs/parallelism.md) ---
  // Every sequence splits into 2*cp equal chunks, in every phase.
  if (c.topology.slices_context()) {
    // cp <= 2^62 would be needed for 2 * cp to fit; no sequence is that long anyway.
    const int64_t parts = c.topology.cp > (int64_t{1} << 62) ? 0 : 2 * c.topology.cp;
    for (size_t i = 0; i <= c.phases.size(); ++i) {
      const bool base = i == c.phases.size();
      const int64_t L = base ? b.seq_len : c.phases[i].seq_len;
      if (parts == 0 || L % parts != 0) {
        const std::string key =
            base ? "batch.seq_len" : "phases[" + std::to_string(i) + "].seq_len";
        return ConfigError(key, "must be a multiple of 2 * topology.cp (" +
                                    (parts == 0 ? std::string("more than 2^63 - 1")
                                                : std::to_string(parts)) +
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
  // Each step once, smallest first; a step is fine as soon as one source has weight.
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  for (int64_t step : steps) {
    bool any = false;
    for (size_t k = 0; k < c.sources.size() && !any; ++k) any = c.WeightAt(k, step) > 0;
    if (!any) {
      return ConfigError(c.PhaseAt(step) ? "phases" : "sources",
                         "all weights are 0 at step " + std::to_string(step));
    }
  }
  return Status::OK();
}

Result<Config> ParseConfig(const std::string& text, const std::string& base_dir) {
  ARROW_RETURN_NOT_OK(CheckUtf8(text));
  ARROW_RETURN_NOT_OK(CheckNestingDepth(text));
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return ConfigError("config", "not valid YAML" + Position(e.mark) + ": " +
                                     EscapeForMessage(e.msg, 200));
  } catch (const std::exception& e) {  // e.g. std::bad_alloc
    return ConfigError("config", std::string("cannot be parsed: ") + e.what());
  }
  // Aliases are shared nodes, not copies; the budget bounds how often they are walked.
  t_visit_budget = static_cast<int64_t>(text.size()) + 64;
  try {
    ARROW_ASSIGN_OR_RAISE(Config config, ParseRoot(root, base_dir));
    config.source_text = text;
    return config;
  } catch (const YAML::Exception& e) {
    return ConfigError("config", "cannot be read" + Position(e.mark) + ": " +
                                     EscapeForMessage(e.msg, 200));
  }
}

std::string EscapeForMessage(std::string_view text, size_t max_bytes) {
  std::string out;
  size_t i = 0;
  auto hex = [&out](unsigned char ch) {
    static const char kDigits[] = "0123456789ABCDEF";
    out += "\\x";
    out += kDigits[ch >> 4];
    out += kDigits[ch & 15];
  };
  while (i < text.size() && out.size() < max_bytes) {
    const auto ch = static_cast<unsigned char>(text[i]);
    if (ch < 0x80) {
      if (ch < 0x20 || ch == 0x7f) {
        hex(ch);
      } else {
        out += static_cast<char>(ch);
      }
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence is copied; any other byte is written as \xNN.
    const size_t len = Utf8Length(text, i);
    if (len > 0) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      hex(ch);
      ++i;
    }
  }
  if (i < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
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

Status SetDataParallel(Config* config, int64_t dp) {
  if (dp <= 0) return ConfigError("--dp", "must be > 0");
  config->topology.dp = dp;
  return ValidateConfig(*config);
}

}  // namespace braid
