#include "braid/plan/step_plan.h"

#include <array>
#include <new>

#include <nlohmann/json.hpp>

namespace braid {

using Json = nlohmann::ordered_json;

StepPlan::~StepPlan() {
  if (arena.pieces_without_payloads()) {
    // Every vector below a rank that the arena holds owns nothing but arena memory (the
    // arena's vectors allocate their elements' vectors there too, and no piece has a
    // payload): end those vectors' lives without their destructors, which would only
    // visit ~70k pieces to release nothing. The arena frees the memory after.
    const PlanAllocator alloc = arena.allocator();
    for (RankPlan& rank : ranks) {
      if (rank.micro_batches.get_allocator() == alloc) {
        new (&rank.micro_batches) std::pmr::vector<MicroBatch>();
      }
    }
    ranks.clear();
    return;
  }
  // The pieces first, a few sequences ahead of their fetch: in a planner-built plan each
  // sequence's pieces lie in the arena in packing order, which is not this one, and a
  // step's ~70k pieces (a few MB) would otherwise be fetched one sequence at a time.
  constexpr size_t kAhead = 32;
  std::array<Sequence*, kAhead> pending{};
  size_t n = 0;
  for (RankPlan& rank : ranks) {
    for (MicroBatch& mb : rank.micro_batches) {
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
  ranks.clear();
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
  const bool several = config.batch.micro_batch_size > 1;
  Json ranks = Json::array();
  for (const RankPlan& rank : plan.ranks) {
    Json r;
    r["dp"] = rank.dp;
    r["cost"] = rank.cost;
    r["tokens"] = rank.tokens;
    Json mbs = Json::array();
    for (const MicroBatch& mb : rank.micro_batches) {
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
    ranks.push_back(std::move(r));
  }
  out["ranks"] = std::move(ranks);
  return out.dump();
}

std::string PlannerStateToJson(const PlannerState& state, const Config& config,
                               int64_t consumed_micro_batches) {
  Json out;
  out["version"] = 1;
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

Result<PlannerState> PlannerStateFromJson(const std::string& text, const Config& config,
                                          int64_t* consumed_micro_batches) {
  Json in;
  try {
    in = Json::parse(text);
  } catch (const Json::exception& e) {
    return ConfigError("state", std::string("not valid JSON: ") + e.what());
  }
  try {
    if (!in.is_object()) return ConfigError("state", "must be a JSON object");
    if (in.value("version", 0) != 1) return ConfigError("state.version", "must be 1");
    const std::string fp = in.at("fingerprint").get<std::string>();
    if (fp != config.Fingerprint()) {
      return ConfigError("state.fingerprint",
                         "the state was saved under a different config (seed, sources or "
                         "batch shape changed): " + fp + " != " + config.Fingerprint());
    }
    PlannerState state;
    state.step = in.at("step").get<int64_t>();
    if (state.step < 0) return ConfigError("state.step", "must be >= 0");
    const int64_t consumed = in.value("consumed_micro_batches", int64_t{0});
    if (consumed < 0) return ConfigError("state.consumed_micro_batches", "must be >= 0");
    if (consumed_micro_batches != nullptr) *consumed_micro_batches = consumed;
    const Json& sources = in.at("sources");
    if (!sources.is_array() || sources.size() != config.sources.size()) {
      return ConfigError("state.sources", "must list the config's " +
                                              std::to_string(config.sources.size()) +
                                              " sources");
    }
    for (size_t i = 0; i < sources.size(); ++i) {
      const Json& s = sources[i];
      const std::string key = "state.sources[" + std::to_string(i) + "]";
      if (s.at("name").get<std::string>() != config.sources[i].name) {
        return ConfigError(key + ".name", "expected '" + config.sources[i].name + "'");
      }
      SourceCursor c;
      c.next.epoch = s.at("epoch").get<int64_t>();
      c.next.window = s.at("window").get<int64_t>();
      c.next.offset = s.at("offset").get<int64_t>();
      c.head_start = s.at("head_start").get<int64_t>();
      c.carry = s.at("carry").get<double>();
      c.skipped = s.at("skipped").get<int64_t>();
      if (c.next.epoch < 0 || c.next.window < 0 || c.next.offset < 0 || c.head_start < 0) {
        return ConfigError(key, "positions must be >= 0");
      }
      state.sources.push_back(c);
    }
    return state;
  } catch (const Json::exception& e) {
    return ConfigError("state", std::string("malformed: ") + e.what());
  }
}

}  // namespace braid
