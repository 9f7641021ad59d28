#include "braid/client/rank_cursor.h"

#include "braid/plan/planner.h"

namespace braid {

Result<RankCursor> RankCursor::Make(const Config& config, const std::string& state_json,
                                    std::vector<int64_t> buckets) {
  const int64_t total = config.topology.buckets();
  for (int64_t b : buckets) {
    if (b < 0 || b >= total) {
      return ConfigError("rank", "DP rank (bucket) " + std::to_string(b) +
                                     " is outside the " + std::to_string(total) +
                                     " buckets of the topology (dp=" +
                                     std::to_string(config.topology.dp) + ")");
    }
  }
  RankCursor cursor(config, std::move(buckets));
  int64_t consumed = 0;
  if (state_json.empty()) {
    cursor.start_ = Planner::InitialState(config);
  } else {
    ARROW_ASSIGN_OR_RAISE(cursor.start_, PlannerStateFromJson(state_json, config, &consumed));
    if (consumed >= cursor.per_step(cursor.start_.step)) {
      return ConfigError("state.consumed_micro_batches",
                         "exceeds the micro-batches per step of this rank");
    }
  }
  cursor.start_json_ = PlannerStateToJson(cursor.start_, config, consumed);
  cursor.next_.step = cursor.start_.step;
  for (int64_t k = 0; k < consumed; ++k) cursor.Next();
  return cursor;
}

int64_t RankCursor::per_step(int64_t step) const {
  return config_->MicroBatchesPerRankAt(step) * static_cast<int64_t>(buckets_.size());
}

RankCursor::Position RankCursor::Next() {
  const int64_t per_bucket = config_->MicroBatchesPerRankAt(next_.step);
  Position at = next_;
  at.bucket = buckets_[size_t(at.index / per_bucket)];
  at.micro_batch = at.index % per_bucket;
  if (++next_.index >= per_step(next_.step)) {
    ++next_.step;
    next_.index = 0;
  }
  return at;
}

std::string RankCursor::StateAfter(const Position& at, const PlannerState& before,
                                   const PlannerState& after) const {
  return ClientStateJson(before, after, at.index + 1, per_step(at.step), *config_);
}

}  // namespace braid
