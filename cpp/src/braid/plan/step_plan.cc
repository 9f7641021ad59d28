#include "braid/plan/step_plan.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <new>

#include <nlohmann/json.hpp>

namespace braid {

using Json = nlohmann::ordered_json;

StepPlan::~StepPlan() {
  if (arena.pieces_without_payloads()) {
    // Every vector below a bucket that the arena holds owns nothing but arena memory (the
    // arena's vectors allocate their elements' vectors there too, and no piece has a
    // payload): end those vectors' lives without their destructors, which would only
    // visit ~70k pieces to release nothing. The arena frees the memory after.
    const PlanAllocator alloc = arena.allocator();
    for (BucketPlan& bucket : buckets) {
      if (bucket.micro_batches.get_allocator() == alloc) {
        new (&bucket.micro_batches) std::pmr::vector<MicroBatch>();
      }
    }
    buckets.clear();
    return;
  }
  // The pieces first, a few sequences ahead of their fetch: in a planner-built plan each
  // sequence's pieces lie in the arena in packing order, which is not this one, and a
  // step's ~70k pieces (a few MB) would otherwise be fetched one sequence at a time.
  constexpr size_t kAhead = 32;
  std::array<Sequence*, kAhead> pending{};
  size_t n = 0;
  for (BucketPlan& bucket : buckets) {
    for (MicroBatch& mb : bucket.micro_batches) {
      for (Sequence& seq : mb.sequences) {
        const char* data = reinterpret_cast<const char*>(seq.docs.data());
        const size_t bytes = seq.docs.size() * sizeof(DocPiece);
        for (size_t at = 0; at < bytes; at += 64) __builtin_prefetch(data + at);
        Sequence*& slot = pending[n++ % kAhead];
        if (slot != nullptr) slot->docs.clear();
        slot = &seq;
      }
    }
  }
  for (Sequence* seq : pending) {
    if (seq != nullptr) seq->docs.clear();
  }
  buckets.clear();
}

std::string StepPlanToJson(const StepPlan& plan, const Config& config) {
  Json out;
  out["step"] = plan.step;
  out["seq_len"] = plan.seq_len;
  out["imbalance"] = plan.imbalance;
  Json tokens = Json::object();
  for (size_t i = 0; i < config.sources.size(); ++i) {
    tokens[config.sources[i].name] = plan.source_tokens[i];
  }
  out["source_tokens"] = std::move(tokens);
  // Per source: this step's mean context / bound, and the share drift after it (tokens
  // received less the share of the tokens planned), to the thousandth of a token.
  Json context = Json::object(), drift = Json::object();
  for (size_t i = 0; i < config.sources.size(); ++i) {
    const bool has = i < plan.source_bound.size() && plan.source_bound[i] > 0;
    context[config.sources[i].name] =
        has ? std::round(1e4 * double(plan.source_context[i]) /
                         double(plan.source_bound[i])) / 1e4
            : 1.0;
    const double d = i < plan.state_after.sources.size()
                         ? std::round(-1e3 * plan.state_after.sources[i].carry) / 1e3
                         : 0.0;
    drift[config.sources[i].name] = d == 0 ? 0.0 : d;  // never -0
  }
  out["context"] = std::move(context);
  out["drift"] = std::move(drift);
  const bool several = config.batch.micro_batch_size > 1;
  // The JSON keeps its names (docs/plan-format.md): "ranks" holds the buckets, "dp" is a
  // bucket's index.
  Json buckets = Json::array();
  for (const BucketPlan& bucket : plan.buckets) {
    Json r;
    r["dp"] = bucket.bucket;
    r["cost"] = bucket.cost;
    r["tokens"] = bucket.tokens;
    Json mbs = Json::array();
    for (const MicroBatch& mb : bucket.micro_batches) {
      Json m;
      m["tokens"] = mb.tokens;
      m["cost"] = mb.cost;
      Json docs = Json::array();
      for (size_t s = 0; s < mb.sequences.size(); ++s) {
        for (const DocPiece& d : mb.sequences[s].docs) {
          Json doc;
          doc["src"] = config.sources[size_t(d.source)].name;
          doc["file"] = d.file;
          doc["row"] = d.row;
          doc["epoch"] = d.epoch;
          doc["start"] = d.start;
          doc["len"] = d.len;
          if (d.image_tokens > 0) doc["img"] = d.image_tokens;  // multimodal only
          if (several) doc["seq"] = s;
          docs.push_back(std::move(doc));
        }
      }
      m["docs"] = std::move(docs);
      mbs.push_back(std::move(m));
    }
    r["micro_batches"] = std::move(mbs);
    buckets.push_back(std::move(r));
  }
  out["ranks"] = std::move(buckets);
  return out.dump();
}

std::string PlannerStateToJson(const PlannerState& state, const Config& config,
                               int64_t consumed_micro_batches) {
  Json out;
  out["version"] = kStateVersion;
  out["fingerprint"] = config.Fingerprint();
  out["step"] = state.step;
  out["consumed_micro_batches"] = consumed_micro_batches;
  Json sources = Json::array();
  for (size_t i = 0; i < state.sources.size(); ++i) {
    const SourceCursor& c = state.sources[i];
    Json s;
    s["name"] = config.sources[i].name;
    s["epoch"] = c.next.epoch;
    s["window"] = c.next.window;
    s["offset"] = c.next.offset;
    s["head_start"] = c.head_start;
    s["carry"] = c.carry;
    s["skipped"] = c.skipped;
    sources.push_back(std::move(s));
  }
  out["sources"] = std::move(sources);
  return out.dump();
}

namespace {

// A state's positions and counts are below 2^62: no run gets there, and the planner may
// add to them without overflow.
constexpr int64_t kMaxStateCount = int64_t{1} << 62;

// `obj[key]` as an integer in [0, kMaxStateCount]; `fallback` when absent and not
// `required`. Errors name the key path ("state.sources[0].epoch").
Result<int64_t> StateCount(const Json& obj, const char* key, const std::string& parent,
                           bool required, int64_t fallback = 0) {
  const std::string path = parent + "." + key;
  const auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) return ConfigError(path, "is required");
    return fallback;
  }
  if (!it->is_number_integer()) {
    return ConfigError(path, std::string("must be an integer, got ") + it->type_name());
  }
  if (it->is_number_unsigned() ? it->get<uint64_t>() > uint64_t(kMaxStateCount)
                               : (it->get<int64_t>() < 0 ||
                                  it->get<int64_t>() > kMaxStateCount)) {
    return ConfigError(path, "must be in [0, 2^62], got " + it->dump());
  }
  return it->get<int64_t>();
}

Result<std::string> StateString(const Json& obj, const char* key,
                                const std::string& parent) {
  const std::string path = parent + "." + key;
  const auto it = obj.find(key);
  if (it == obj.end()) return ConfigError(path, "is required");
  if (!it->is_string()) {
    return ConfigError(path, std::string("must be a string, got ") + it->type_name());
  }
  return it->get<std::string>();
}

// A state is three levels deep; a deeper document is refused before it is parsed
// (nlohmann's parser does not recurse, but a 100,000-level document still costs seconds).
Status CheckStateDepth(const std::string& text) {
  int64_t depth = 0;
  size_t line = 1, line_begin = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '\n') {
      ++line;
      line_begin = i + 1;
    } else if (in_string) {
      if (ch == '\\') {
        ++i;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > kMaxConfigDepth) {
        return ConfigError("state", "nested deeper than " +
                                        std::to_string(kMaxConfigDepth) + " levels at line " +
                                        std::to_string(line) + ", column " +
                                        std::to_string(i - line_begin + 1));
      }
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return Status::OK();
}

// The fingerprint `config` had before sources[].shuffle_window_bytes existed (windows
// bounded in rows only): a state saved then names its order, which the byte bound
// changes.
std::string RowsOnlyFingerprint(const Config& config) {
  Config rows_only = config;
  for (auto& s : rows_only.sources) s.shuffle_window_bytes = 0;
  return rows_only.Fingerprint();
}

}  // namespace

Result<PlannerState> PlannerStateFromJson(const std::string& text, const Config& config,
                                          int64_t* consumed_micro_batches) {
  ARROW_RETURN_NOT_OK(CheckStateDepth(text));
  Json in;
  try {
    in = Json::parse(text);
  } catch (const Json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." without
    // the library's prefix; the rest echoes input, so it is escaped and cut.
    std::string what = e.what();
    const size_t at = what.find(" at line ");
    what = at == std::string::npos ? " (byte " + std::to_string(e.byte) + "): " + what
                                   : what.substr(at);
    return ConfigError("state", "not valid JSON" + EscapeForMessage(what, 240));
  } catch (const std::exception& e) {  // e.g. std::bad_alloc
    return ConfigError("state", std::string("cannot be parsed: ") + e.what());
  }
  try {
    if (!in.is_object()) return ConfigError("state", "must be a JSON object");
    const auto version = in.find("version");
    if (version == in.end() || !version->is_number_integer()) {
      return ConfigError("state.version", "must be " + std::to_string(kStateVersion));
    }
    // Version 1: shares exact per step (cursors and carries of the same meaning); it
    // continues exactly only under that accounting.
    if (version->get<int64_t>() == 1 && config.mix.exact != MixConfig::Exact::kStep) {
      return ConfigError(
          "state.version",
          "1: the state was saved when every step's shares were exact (documents cut at "
          "the quota); this config keeps shares exact over time. Resume it with "
          "mix: {exact: step} to continue the same stream, or start afresh without it");
    }
    if (version->get<int64_t>() != kStateVersion && version->get<int64_t>() != 1) {
      return ConfigError("state.version", "must be " + std::to_string(kStateVersion) +
                                              ", got " + version->dump());
    }
    ARROW_ASSIGN_OR_RAISE(const std::string fp, StateString(in, "fingerprint", "state"));
    if (fp != config.Fingerprint()) {
      if (fp == RowsOnlyFingerprint(config)) {
        return ConfigError(
            "state.fingerprint",
            "the state was saved with shuffle windows bounded in rows only (the order "
            "before sources[].shuffle_window_bytes); bounding them in bytes changes the "
            "order of large row groups and windows. Resume it with "
            "shuffle_window_bytes: 0 on every source, or start afresh");
      }
      return ConfigError("state.fingerprint",
                         "the state was saved under a different config (seed, sources or "
                         "batch shape changed): " + EscapeForMessage(fp) +
                             " != " + config.Fingerprint());
    }
    PlannerState state;
    ARROW_ASSIGN_OR_RAISE(state.step, StateCount(in, "step", "state", true));
    ARROW_ASSIGN_OR_RAISE(const int64_t consumed,
                          StateCount(in, "consumed_micro_batches", "state", false));
    if (consumed_micro_batches != nullptr) *consumed_micro_batches = consumed;
    const auto sources = in.find("sources");
    if (sources == in.end() || !sources->is_array() ||
        sources->size() != config.sources.size()) {
      return ConfigError("state.sources", "must list the config's " +
                                              std::to_string(config.sources.size()) +
                                              " sources");
    }
    // The carry is what a source is owed: within a sequence or two of tokens under
    // mix.exact: time, a fraction of a token plus deferred documents under step (a
    // source that deferred draws first next step). Far more cannot come from a run (and
    // would stall the quota loop).
    const double max_carry = 8.0 * static_cast<double>(config.batch.global_tokens);
    for (size_t i = 0; i < sources->size(); ++i) {
      const Json& s = (*sources)[i];
      const std::string key = "state.sources[" + std::to_string(i) + "]";
      if (!s.is_object()) return ConfigError(key, "must be a JSON object");
      ARROW_ASSIGN_OR_RAISE(const std::string name, StateString(s, "name", key));
      if (name != config.sources[i].name) {
        return ConfigError(key + ".name", "expected '" +
                                              EscapeForMessage(config.sources[i].name) +
                                              "', got '" + EscapeForMessage(name) + "'");
      }
      SourceCursor c;
      ARROW_ASSIGN_OR_RAISE(c.next.epoch, StateCount(s, "epoch", key, true));
      ARROW_ASSIGN_OR_RAISE(c.next.window, StateCount(s, "window", key, true));
      ARROW_ASSIGN_OR_RAISE(c.next.offset, StateCount(s, "offset", key, true));
      ARROW_ASSIGN_OR_RAISE(c.head_start, StateCount(s, "head_start", key, true));
      ARROW_ASSIGN_OR_RAISE(c.skipped, StateCount(s, "skipped", key, true));
      const auto carry = s.find("carry");
      if (carry == s.end()) return ConfigError(key + ".carry", "is required");
      if (!carry->is_number()) {
        return ConfigError(key + ".carry",
                           std::string("must be a number, got ") + carry->type_name());
      }
      c.carry = carry->get<double>();
      if (!(std::abs(c.carry) <= max_carry)) {
        return ConfigError(key + ".carry",
                           "must be a finite number within 8 * batch.global_tokens, "
                           "got " + carry->dump());
      }
      state.sources.push_back(c);
    }
    return state;
  } catch (const Json::exception& e) {  // not expected: every access is checked above
    return ConfigError("state", std::string("malformed: ") + EscapeForMessage(e.what()));
  }
}

std::string ClientStateJson(const PlannerState& before, const PlannerState& after,
                            int64_t consumed, int64_t per_step, const Config& config) {
  if (consumed >= per_step) return PlannerStateToJson(after, config, 0);
  return PlannerStateToJson(before, config, consumed);
}

PlanFigures FiguresOf(const StepPlan& plan, const Config& config) {
  PlanFigures f;
  f.step = plan.step;
  f.imbalance = plan.imbalance;
  f.sequential_imbalance = plan.sequential_imbalance;
  f.source_tokens = plan.source_tokens;
  for (const auto& c : plan.state_after.sources) f.skipped.push_back(c.skipped);
  int64_t filled = 0;
  for (int64_t t : plan.source_tokens) filled += t;
  f.padding_tokens = plan.seq_len * config.SequencesAt(plan.step) - filled;
  f.multimodal_cut = plan.multimodal_cut;
  f.multimodal_deferred = plan.multimodal_deferred;
  f.seq_len = plan.seq_len;
  f.source_context = plan.source_context;
  f.source_bound = plan.source_bound;
  for (const auto& c : plan.state_after.sources) f.source_drift.push_back(-c.carry);
  return f;
}

}  // namespace braid
