// A trainer's place in its stream: which micro-batch it receives next, and the state it
// resumes from after each one received.
//
// A process receives, per step, the micro-batches of its buckets (usually one: the
// rank's), bucket by bucket in the order given, each bucket's in micro-batch order; a
// phase with another seq_len changes how many a step has. A cursor made from a state
// (Loader.state_dict(), `braid plan --state-out`) starts right after the micro-batches
// that state says were consumed. Both runtimes' clients walk their streams with it, so
// the order and the state protocol are one definition.
//
// Thread-compatible. REQUIRES: the config outlives the cursor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "braid/config/config.h"
#include "braid/plan/step_plan.h"
#include "braid/status.h"

namespace braid {

class RankCursor {
 public:
  struct Position {
    int64_t step = 0, bucket = 0, micro_batch = 0;
    int64_t index = 0;  ///< among the micro-batches of `step` this cursor walks through
  };

  /// A cursor over `buckets` starting at `state_json` (empty: a fresh start). Fails on a
  /// bad state (key "state"), one consumed past its step's micro-batches
  /// ("state.consumed_micro_batches"), or a bucket outside the topology ("rank").
  static Result<RankCursor> Make(const Config& config, const std::string& state_json,
                                 std::vector<int64_t> buckets);

  /// The next micro-batch to receive; moves past it.
  Position Next();

  /// Micro-batches of `step` this cursor walks through.
  int64_t per_step(int64_t step) const;

  /// The state right after receiving the micro-batch at `at` of the step planned from
  /// `before` to `after`: resuming from it continues with the micro-batch after it.
  std::string StateAfter(const Position& at, const PlannerState& before,
                         const PlannerState& after) const;
  /// The state the cursor started from, as JSON.
  const std::string& start_json() const { return start_json_; }
  const PlannerState& start() const { return start_; }

 private:
  RankCursor(const Config& config, std::vector<int64_t> buckets)
      : config_(&config), buckets_(std::move(buckets)) {}

  const Config* config_;
  std::vector<int64_t> buckets_;
  PlannerState start_;
  std::string start_json_;
  Position next_;
};

}  // namespace braid
