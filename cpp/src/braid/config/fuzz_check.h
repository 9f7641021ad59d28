// What every parse of arbitrary text must satisfy: the check shared by the seeded
// mutation harness (config_fuzz_test.cc) and the libFuzzer entry points
// (config_fuzzer.cc, state_fuzzer.cc). Header-only test code, not part of braid_core.
//
// A document either parses, and then the result keeps the invariants the rest of Braid
// relies on, or fails with an error that "names a key path" (docs/config.md, "Fuzzing"):
//  1. The status is Invalid with a braid ErrorDetail of kind kConfig, and its message is
//     "WHERE: WHAT" with WHERE == the detail's where() and WHAT non-empty. The message is
//     valid UTF-8, one line (no control characters) and at most kMaxMessageBytes long.
//  2. WHERE is ROOT followed by segments ".NAME", "[INDEX]" or "[\"QUOTED\"]", where NAME
//     is [A-Za-z0-9_-]+ and INDEX decimal digits. ROOT is "state" for a state; for a
//     config, "config" or a top-level key (its first NAME, or a QUOTED unknown key).
//  3. Every NAME is a key of the schema (ConfigKeyNames / StateKeyNames) except the
//     user's own names: the last segment of an "unknown key" error and the source name
//     after "phases[i].weights". QUOTED segments stand only in those places.
//  4. WHERE is the bare ROOT only for a finding about the whole document: WHAT gives a
//     position ("line N, column M": syntax, nesting depth, a non-string key) or says the
//     document is not a mapping / JSON object, or that its aliases expand past its size.
//
// Thread-safe: pure functions of their arguments.
#pragma once

#include <cctype>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "braid/config/config.h"
#include "braid/plan/step_plan.h"
#include "braid/status.h"

namespace braid::fuzz {

/// The config the fuzzed states belong to (parsed with base_dir kBaseDir; nothing on
/// disk is read).
inline constexpr const char* kStateConfig = R"(seed: 11
batch: {global_tokens: 8192, seq_len: 1024, micro_batch_size: 2}
topology: {dp: 2}
sources:
  - {name: web, path: web/, tokens_column: ids, weight: 0.7}
  - {name: code, path: code.parquet, tokens_column: ids,
     weight: {schedule: [[0, 0.1], [100, 0.3]]}}
  - {name: chat, path: chat/, tokens_column: ids, weight: 0.2}
)";
inline constexpr const char* kBaseDir = "/fuzz-base";
/// State seeds write the fingerprint as this JSON string; ExpandState puts the config's
/// in its place, so seeds stay valid when the fingerprint's recipe changes.
inline constexpr std::string_view kFingerprintPlaceholder = "\"@fingerprint\"";
inline constexpr size_t kMaxMessageBytes = 1024;

enum class Doc { kConfig, kState };

/// Every key a config may hold, at any level (docs/config.md).
inline const std::set<std::string>& ConfigKeyNames() {
  static const std::set<std::string> names = {
      // root
      "seed", "topology", "batch", "balance", "sources", "runtime", "tokenizer", "phases",
      // topology
      "dp", "tp", "pp", "cp", "order", "distribute", "axis", "group", "broadcast_at",
      // batch
      "global_tokens", "seq_len", "micro_batch_size", "packing",
      // balance
      "cost", "attn", "linear", "vision", "mode", "algorithm", "split", "max_piece",
      "slack",
      // sources[i]
      "name", "path", "tokens_column", "text_column", "image_column", "weight",
      "schedule",
      "steps", "oversize", "on_error", "storage", "endpoint", "region", "anonymous",
      "image", "patch_size", "max_pixels", "image_token_id", "folder", "shuffle_window",
      "chat",
      "prompt_column", "response_column", "messages_column", "workers", "transform",
      "python", "columns", "loaders",
      // runtime
      "kind", "read_ahead_bytes", "prefetch_steps", "cache", "dir", "max_bytes",
      // tokenizer
      "type", "model", "bos", "eos", "file", "add_special_tokens", "bos_token",
      "eos_token",
      // phases[i]
      "until_step", "weights"};
  return names;
}

/// Every key of a state (PlannerStateToJson).
inline const std::set<std::string>& StateKeyNames() {
  static const std::set<std::string> names = {
      "version", "fingerprint", "step", "consumed_micro_batches", "sources", "name",
      "epoch", "window", "offset", "head_start", "carry", "skipped"};
  return names;
}

inline bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                                 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1   ? c
                  : len == 2 ? (c & 0x1F)
                  : len == 3 ? (c & 0x0F)
                             : (c & 0x07);
    for (size_t k = 1; k < len; ++k) {
      const auto cont = static_cast<unsigned char>(s[i + k]);
      if ((cont & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cont & 0x3F);
    }
    const uint32_t min = len == 1 ? 0 : len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

/// True if `what` has "line N, column M".
inline bool HasPosition(std::string_view what) {
  const size_t at = what.find("line ");
  if (at == std::string_view::npos) return false;
  size_t i = at + 5, digits = 0;
  while (i < what.size() && std::isdigit(static_cast<unsigned char>(what[i]))) {
    ++i;
    ++digits;
  }
  if (digits == 0 || what.substr(i, 9) != ", column ") return false;
  i += 9;
  return i < what.size() && std::isdigit(static_cast<unsigned char>(what[i]));
}

/// "" if `st` is an error that names a key path (rules 1-4 above), else what is wrong.
inline std::string CheckError(const Status& st, Doc doc) {
  if (!st.IsInvalid()) return "not an Invalid status: " + st.ToString();
  const ErrorDetail* detail = GetErrorDetail(st);
  if (detail == nullptr) return "no braid ErrorDetail: " + st.ToString();
  if (detail->kind() != ErrorKind::kConfig) return "not a config error: " + st.ToString();
  const std::string& where = detail->where();
  const std::string& msg = st.message();
  if (!IsValidUtf8(msg)) return "message is not valid UTF-8";
  for (unsigned char ch : msg) {
    if (ch < 0x20 || ch == 0x7f) return "message has a control character: " + msg;
  }
  if (msg.size() > kMaxMessageBytes) {
    return "message longer than " + std::to_string(kMaxMessageBytes) + " bytes: " +
           msg.substr(0, 200);
  }
  if (where.empty() || msg.compare(0, where.size() + 2, where + ": ") != 0 ||
      msg.size() == where.size() + 2) {
    return "message is not 'WHERE: WHAT' with WHERE '" + where + "': " + msg;
  }
  const std::string what = msg.substr(where.size() + 2);
  const std::string root = doc == Doc::kConfig ? "config" : "state";
  const std::set<std::string>& names =
      doc == Doc::kConfig ? ConfigKeyNames() : StateKeyNames();
  const bool unknown_key = what.rfind("unknown key", 0) == 0;

  // Split WHERE into segments: {kind, text}; kind '.' name, '[' index, '"' quoted.
  struct Segment {
    char kind;
    std::string text;
  };
  std::vector<Segment> segs;
  auto name_end = [&](size_t from) {
    size_t j = from;
    while (j < where.size() && (std::isalnum(static_cast<unsigned char>(where[j])) ||
                                where[j] == '_' || where[j] == '-')) {
      ++j;
    }
    return j;
  };
  // `["..."]` starting at `from`: the index after it, or npos.
  auto quoted_end = [&](size_t from) -> size_t {
    size_t j = from + 2;
    while (j < where.size() && where[j] != '"') j += where[j] == '\\' ? 2 : 1;
    if (j + 1 >= where.size() || where[j + 1] != ']') return std::string::npos;
    return j + 2;
  };
  size_t i = 0;
  while (i < where.size()) {
    if (where.compare(i, 2, "[\"") == 0) {
      const size_t j = quoted_end(i);
      if (j == std::string::npos) return "unterminated quoted segment in '" + where + "'";
      segs.push_back({'"', where.substr(i + 2, j - i - 4)});
      i = j;
    } else if (where[i] == '[') {
      size_t j = i + 1;
      while (j < where.size() && std::isdigit(static_cast<unsigned char>(where[j]))) ++j;
      if (j == i + 1 || j >= where.size() || where[j] != ']') {
        return "bad index segment in '" + where + "'";
      }
      segs.push_back({'[', where.substr(i + 1, j - i - 1)});
      i = j + 1;
    } else if (i == 0 || where[i] == '.') {
      const size_t from = i == 0 ? 0 : i + 1;
      const size_t j = name_end(from);
      if (j == from) return "empty or bad name segment in '" + where + "'";
      segs.push_back({'.', where.substr(from, j - from)});
      i = j;
    } else {
      return "unexpected '" + std::string(1, where[i]) + "' in key path '" + where + "'";
    }
  }
  if (segs.empty()) return "empty key path";

  if (segs.size() == 1 && segs[0].kind == '.' && segs[0].text == root) {
    const bool document_level =
        HasPosition(what) || what.rfind("must be a mapping", 0) == 0 ||
        what.rfind("must be a JSON object", 0) == 0 ||
        what.rfind("aliases expand", 0) == 0 || what.rfind("cannot be parsed", 0) == 0;
    if (!document_level) return "bare '" + root + "' without a position: " + msg;
    return "";
  }
  if (doc == Doc::kState && !(segs[0].kind == '.' && segs[0].text == "state")) {
    return "a state error not under 'state': " + msg;
  }
  for (size_t k = doc == Doc::kState ? 1 : 0; k < segs.size(); ++k) {
    const Segment& s = segs[k];
    if (s.kind == '[') continue;
    const bool last = k + 1 == segs.size();
    // phases[i].weights.NAME: a source name.
    const bool source_name = doc == Doc::kConfig && k >= 3 && segs[0].text == "phases" &&
                             segs[1].kind == '[' && segs[2].text == "weights" && k == 3;
    const bool user_name = (last && unknown_key) || source_name;
    if (s.kind == '"') {
      if (!user_name) return "quoted segment outside a user's name: " + msg;
      continue;
    }
    if (!names.count(s.text) && !user_name) {
      return "segment '" + s.text + "' is not a key of the schema: " + msg;
    }
  }
  return "";
}

/// The state text with the placeholder fingerprint replaced by `config`'s.
inline std::string ExpandState(std::string text, const Config& config) {
  const std::string fp = "\"" + config.Fingerprint() + "\"";
  for (size_t at = text.find(kFingerprintPlaceholder); at != std::string::npos;
       at = text.find(kFingerprintPlaceholder, at + fp.size())) {
    text.replace(at, kFingerprintPlaceholder.size(), fp);
  }
  return text;
}

/// Parses a state for `config`; "" if the outcome is acceptable, else what is wrong.
/// A state that parses must round-trip through PlannerStateToJson. `accepted`, if given,
/// says whether it parsed.
inline std::string CheckStateText(const std::string& text, const Config& config,
                                  bool* accepted = nullptr) {
  int64_t consumed = -1;
  auto state = PlannerStateFromJson(text, config, &consumed);
  if (accepted != nullptr) *accepted = state.ok();
  if (!state.ok()) return CheckError(state.status(), Doc::kState);
  if (state->sources.size() != config.sources.size()) return "wrong number of cursors";
  if (consumed < 0) return "negative consumed_micro_batches accepted";
  for (const SourceCursor& c : state->sources) {
    if (!std::isfinite(c.carry)) return "non-finite carry accepted";
  }
  int64_t again_consumed = -1;
  auto again = PlannerStateFromJson(PlannerStateToJson(*state, config, consumed), config,
                                    &again_consumed);
  if (!again.ok()) return "re-serialized state fails: " + again.status().ToString();
  if (!(*again == *state) || again_consumed != consumed) {
    return "state does not round-trip";
  }
  return "";
}

/// Parses a config; "" if the outcome is acceptable, else what is wrong. A config that
/// parses must validate again, give a per-step shape and a fresh state that round-trips.
/// `accepted`, if given, says whether it parsed.
inline std::string CheckConfigText(const std::string& text, bool* accepted = nullptr) {
  auto config = ParseConfig(text, kBaseDir);
  if (accepted != nullptr) *accepted = config.ok();
  if (!config.ok()) return CheckError(config.status(), Doc::kConfig);
  const Config& c = *config;
  Status again = ValidateConfig(c);
  if (!again.ok()) return "a parsed config fails ValidateConfig: " + again.ToString();
  if (c.sources.empty()) return "no sources accepted";
  for (int64_t step : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{1} << 40}) {
    if (c.SeqLenAt(step) <= 0 || c.SequencesAt(step) <= 0 ||
        c.MicroBatchesPerRankAt(step) <= 0) {
      return "bad step shape at step " + std::to_string(step);
    }
    for (size_t k = 0; k < c.sources.size(); ++k) {
      const double w = c.WeightAt(k, step);
      if (!std::isfinite(w) || w < 0) return "bad weight at step " + std::to_string(step);
    }
  }
  PlannerState fresh;
  fresh.sources.resize(c.sources.size());
  return CheckStateText(PlannerStateToJson(fresh, c), c);
}

}  // namespace braid::fuzz
