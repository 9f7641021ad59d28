// The planner's output for one global step, and the planner's resumable state.
//
// A StepPlan says, for every DP rank, which pieces of which documents fill each sequence
// of each micro-batch. Constructors execute it; `braid plan` prints it as one JSON line
// (docs/plan-format.md). PlannerState is everything needed to continue the stream exactly:
// the step, and per source its cursor, the consumed part of a split document, and the
// rounding carry of its token quota. Thread-safe: immutable values once built.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "braid/config/config.h"
#include "braid/source/sample.h"
#include "braid/status.h"

namespace braid {

/// A contiguous run of one document's tokens inside a sequence.
struct DocPiece {
  int32_t source = 0;
  int32_t file = 0;
  int64_t row = 0;
  int64_t epoch = 0;
  int64_t start = 0;       ///< token offset of the piece in the document
  int64_t len = 0;
  int64_t doc_tokens = 0;  ///< length of the whole (possibly truncated) document
  /// The document's image (vision) tokens, on the piece that starts the document only
  /// (start == 0: image placeholders lead the document); 0 on every other piece and on
  /// text. Counted in `len` like any token; adds balance.cost.vision * image_tokens.
  int64_t image_tokens = 0;
  PayloadRef payload;      ///< empty when planning without payloads
};

struct Sequence {
  std::vector<DocPiece> docs;
  int64_t tokens = 0;
  double cost = 0;
};

struct MicroBatch {
  std::vector<Sequence> sequences;  ///< micro_batch_size of them
  int64_t tokens = 0;
  double cost = 0;
};

struct RankPlan {
  int64_t dp = 0;
  int64_t tokens = 0;
  double cost = 0;
  std::vector<MicroBatch> micro_batches;
};

struct SourceCursor {
  StreamPos next;          ///< first sample not fully consumed
  int64_t head_start = 0;  ///< tokens already consumed of the sample at `next`
  double carry = 0;        ///< quota rounding carried to the next step (tokens)
  int64_t skipped = 0;     ///< samples skipped so far (empty, null, oversize)
  bool operator==(const SourceCursor&) const = default;
};

struct PlannerState {
  int64_t step = 0;
  std::vector<SourceCursor> sources;
  bool operator==(const PlannerState&) const = default;
};

struct StepPlan {
  int64_t step = 0;
  int64_t seq_len = 0;
  double imbalance = 1.0;
  /// The imbalance the same sequences would have if assigned in order (what per-rank
  /// loaders get); for reports, not part of the plan.
  double sequential_imbalance = 1.0;
  /// Documents that start with image tokens and found no sequence with room for them
  /// whole, so they were cut like text (docs/planner.md); for reports, not in the JSON.
  int64_t multimodal_cut = 0;
  std::vector<int64_t> source_tokens;  ///< per source, tokens in this step
  std::vector<RankPlan> ranks;
  PlannerState state_before;
  PlannerState state_after;
};

/// One JSON object on one line, the `braid plan` contract.
std::string StepPlanToJson(const StepPlan& plan, const Config& config);

/// The state as a JSON object (what Loader.state_dict() and --state-out carry).
/// `consumed_micro_batches` counts the micro-batches of step `state.step` that a client
/// has already received (0 at a step boundary).
std::string PlannerStateToJson(const PlannerState& state, const Config& config,
                               int64_t consumed_micro_batches = 0);

/// Parses PlannerStateToJson's output and checks it against `config` (fingerprint,
/// source names). Fails with a config error under the key "state".
Result<PlannerState> PlannerStateFromJson(const std::string& text, const Config& config,
                                          int64_t* consumed_micro_batches = nullptr);

}  // namespace braid
