// The planner: decides every global step from sample metadata alone.
//
// For step t with sequence length L and S = global_tokens / L sequences:
//  1. Quotas. Each source's weight at t (its schedule) gives its share of the S*L tokens;
//     largest-remainder rounding, with the remainder carried to the next step, makes the
//     achieved share converge to the weights.
//  2. Draw. Each source yields its quota from its stream, in its seeded order; a document
//     that does not fit the quota is cut, and its rest opens the source's next quota.
//  3. Pack. The drawn pieces are interleaved in a seeded order and packed in that order into
//     S sequences of exactly L tokens; a piece that crosses a sequence boundary is split.
//     Documents longer than L follow `oversize` (split | truncate | skip).
//     Multimodal documents (image_tokens > 0) are never cut inside their image tokens,
//     and not at all when they fit a sequence and a sequence has room: the draw places
//     each one into a sequence as it takes it (the first with room from a seeded random
//     one), before consuming it. A
//     document that the quota cannot hold, or that no sequence has room for (not even
//     for its image tokens), stays at the head of its source for the next step (the
//     carry owes the source the tokens; counted as deferred). One that has no room
//     whole but room for its image tokens is cut after them (counted as cut). A source
//     owed a token or more by its carry (it deferred) draws before the others, the most
//     owed first, so the document it deferred meets the step's rooms still empty. The
//     packer puts them where the draw placed them, then fills the rooms with text in
//     interleave order. Longer than L: an atomic first L tokens, the rest text; more
//     image tokens than L: skipped (counted).
//  4. Balance. The S sequences are split over dp ranks with equal counts by the configured
//     algorithm on cost(doc) = attn*len^2 + linear*len (+ vision*image_tokens in the
//     hybrid cost mode) summed per sequence; each rank's
//     sequences form its micro-batches.
// Token slack (balance.slack > 0): steps 1-3 use a budget of S * fill tokens, fill = L
// less round(slack * L), packing each sequence to `fill`; after step 4 whole pieces move
// between the ranks' sequences, up to L tokens each, to even the ranks' costs
// (rebalance.h).
// Steps 1-3 do not depend on dp, so the documents of a step are the same for any dp.
//
// Thread-compatible: one thread calls PlanStep; the streams are consumed from that thread.
#pragma once

#include <memory>
#include <vector>

#include "braid/config/config.h"
#include "braid/plan/step_plan.h"
#include "braid/source/sample.h"
#include "braid/status.h"

namespace braid {

/// Cost of one document piece of `len` tokens (image placeholders included) carrying
/// `image_tokens` vision tokens: backbone attn*len^2 + linear*len, plus, in the hybrid
/// cost mode, the vision encoder's vision*image_tokens.
inline double PieceCost(const BalanceConfig& b, int64_t len, int64_t image_tokens = 0) {
  const double l = static_cast<double>(len);
  double c = b.attn * l * l + b.linear * l;
  if (image_tokens > 0 && b.cost_mode == BalanceConfig::CostMode::kHybrid) {
    c += b.vision * static_cast<double>(image_tokens);
  }
  return c;
}

class Planner {
 public:
  /// `streams[i]` yields config.sources[i] starting at state.sources[i].next; the planner
  /// does not own them. REQUIRES: streams.size() == config.sources.size().
  static Result<std::unique_ptr<Planner>> Make(const Config& config,
                                               std::vector<SampleStream*> streams,
                                               PlannerState state);

  ~Planner();

  /// A fresh state (step 0, every source at its start) for `config`.
  static PlannerState InitialState(const Config& config);

  /// Plans the next step and advances the state. Fails with the stream's error.
  Result<StepPlan> PlanStep();

  const PlannerState& state() const { return state_; }

 private:
  Planner(const Config& config, std::vector<SampleStream*> streams, PlannerState state);
  std::vector<int64_t> Quotas(int64_t capacity);
  /// Draws up to `quota` tokens; `*drawn` gets the tokens drawn (less than the quota
  /// when a multimodal document is left for the next step). `fill` is the tokens a
  /// sequence is packed to (multimodal documents are placed into sequences as drawn).
  Status Draw(int32_t source, int64_t quota, int64_t seq_len, int64_t fill,
              std::vector<DocPiece>* pieces, int64_t* drawn);

  const Config config_;
  std::vector<SampleStream*> streams_;
  PlannerState state_;
  // The sample at state_.sources[i].next when it has been read but not fully consumed.
  std::vector<Sample> heads_;
  std::vector<bool> has_head_;
  // Scratch reused from step to step so that a step allocates only what its plan keeps
  // (not state): the drawn pieces, their lengths, the interleave order.
  std::vector<DocPiece> pieces_;
  std::vector<int64_t> piece_lens_;  // pieces_[k].len, compact for the packer's count
  bool any_image_tokens_ = false;    // whether any of pieces_ has image tokens
  bool any_payload_ = false;         // whether any of pieces_ has a payload
  std::vector<int32_t> perm_;
  std::vector<size_t> draw_order_;  // the sources in the order the step draws them
  // Places the step's multimodal documents into its sequences as they are drawn
  // (planner.cc): made on the step's first multimodal document, reset every step.
  class Placer;
  std::unique_ptr<Placer> placer_;
  int64_t multimodal_cut_ = 0;       // this step's, for the plan
  int64_t multimodal_deferred_ = 0;  // this step's, for the plan
  // The step's sequences in packing order (their vectors in the plan's arena; moved into
  // the plan's micro-batches), and per sequence its parts, tokens and cost.
  std::vector<Sequence> sequences_;
  std::vector<int32_t> seq_parts_;
  std::vector<int64_t> seq_tokens_;
  std::vector<double> seq_costs_;
};

}  // namespace braid
