// The planner: decides every global step from sample metadata alone.
//
// For step t with sequence length L and S = global_tokens / L sequences
// (docs/planner.md, "One step"):
//  1-2. Draw. Each source is owed its weight's share of the tokens planned so far less
//     what it received (its carry, in the state). Under mix.exact: time (the default)
//     the step takes whole *units* from the sources' streams, each in its seeded order
//     (a document, or a piece of one longer than the piece cap ending at its next cut
//     point), in the order a worst-case fair queue (WF2Q) over tokens would serve them;
//     a unit larger than the room left waits for the next step, and the step's last
//     tokens are a cut of one text unit. Every source stays within two sequence lengths
//     of its share (docs/decisions.md, 2). Under mix.exact: step every step's tokens per
//     source are exact (largest remainder with carry) and the document that overflows a
//     quota is cut there, its rest opening the source's next quota.
//  3. Pack. Time: best fit decreasing (pack_whole.h), pieces cut only where a sequence
//     ends. Step: the pieces interleaved in a seeded order, packed in that order into
//     sequences of exactly L tokens, split at sequence boundaries. Documents longer than
//     L follow `oversize` (split | truncate | skip). Multimodal documents
//     (image_tokens > 0) are never cut inside their image tokens, and not at all when
//     they fit a sequence and a sequence has room: the draw places each one into a
//     sequence as it takes it (the first with room from a seeded random one), before
//     consuming it. One that the step cannot hold, or that no sequence has room for
//     (not even for its image tokens), stays at the head of its source for the next
//     step (counted as deferred; the source is owed it and draws early); one that has
//     no room whole but room for its image tokens is cut after them (counted as cut).
//     More image tokens than L: skipped (counted).
//  4. Balance. The S sequences are split over dp ranks with equal counts by the
//     configured algorithm on cost(doc) = attn*len^2 + linear*len (+ vision*image_tokens
//     in the hybrid cost mode) summed per sequence; each rank's sequences form its
//     micro-batches.
// Token slack (balance.slack > 0): steps 1-3 use a budget of S * fill tokens, fill = L
// less round(slack * L), packing each sequence to `fill`; after step 4 whole pieces move
// between the ranks' sequences, up to L tokens each, to even the ranks' costs
// (rebalance.h).
// Steps 1-3 do not depend on dp, so the documents of a step, and their pieces, are the
// same for any dp.
// Padding (batch.pad_to_multiple_of m > 1): the planner plans in blocks of m tokens. A
// document of n tokens is ceil(n / m) blocks; seq_len, global_tokens, max_piece and the
// cost coefficients are taken in blocks (attn * m^2, linear * m, vision * m), so every
// decision above is made as without padding, and every cut falls on a block boundary.
// The plan comes back in tokens: each piece's `len` and `doc_tokens` count its padding
// (what it occupies of its sequence); the constructor fills the padding. The state's
// head_start and carry count blocks.
//
// Thread-compatible: one thread calls PlanStep; the streams are consumed from that thread.
#pragma once

#include <memory>
#include <vector>

#include "braid/config/config.h"
#include "braid/plan/pack_whole.h"
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

/// The context figures of a piece of `len` tokens starting `start` tokens into its
/// document, at sequence length `seq_len` (docs/planner.md, "Context and share drift"):
/// `context` sums each token's position inside the piece (what attention sees of its
/// document), `bound` each token's offset in the document modulo seq_len (what it would
/// see were the document cut only every seq_len tokens from its start); context <= bound
/// for a piece of at most seq_len tokens.
struct PieceContext {
  int64_t context = 0;
  int64_t bound = 0;
};
inline PieceContext ContextOf(int64_t start, int64_t len, int64_t seq_len) {
  const int64_t end = start + len;
  if (end <= seq_len) {  // inside the document's first seq_len tokens: no wrap
    return PieceContext{len * (len - 1) / 2, (end * (end - 1) - start * (start - 1)) / 2};
  }
  // Sum of (offset mod seq_len) over the offsets [0, end) of a document.
  auto prefix = [seq_len](int64_t e) {
    const int64_t q = e / seq_len, r = e % seq_len;
    return q * (seq_len * (seq_len - 1) / 2) + r * (r - 1) / 2;
  };
  return PieceContext{len * (len - 1) / 2, prefix(end) - prefix(start)};
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
  /// The source's next document not fully consumed, read from its stream into heads_
  /// (skipping what `oversize: skip`, an empty row or images larger than `seq_len`
  /// skip); returns its tokens at `seq_len` (truncated under `oversize: truncate`).
  /// Fails with the stream's error, or a config error for a state whose consumed part
  /// does not fit the document found at its cursor.
  Result<int64_t> Head(int32_t source, int64_t seq_len);
  /// Takes the next `take` tokens of the head document (`doc_tokens` long) as a piece.
  void Consume(int32_t source, int64_t doc_tokens, int64_t take,
               std::vector<DocPiece>* pieces);
  /// Places the multimodal document about to become piece pieces_.size() (its atomic
  /// `atomic` tokens) into a sequence of the step; false: no room (it waits).
  bool Place(int64_t atomic, int64_t image_tokens, int64_t seq_len, int64_t fill);
  /// mix.exact: step. Draws up to `quota` tokens; `*drawn` gets the tokens drawn (less
  /// than the quota when a multimodal document is left for the next step). `fill` is
  /// the tokens a sequence is packed to (multimodal documents are placed into sequences
  /// as drawn).
  Status Draw(int32_t source, int64_t quota, int64_t seq_len, int64_t fill,
              std::vector<DocPiece>* pieces, int64_t* drawn);
  /// mix.exact: time. Draws the step's whole units into pieces_ (planner.cc); `*taken`
  /// gets the tokens per source. Updates the sources' carries.
  Status DrawWhole(int64_t seq_len, int64_t fill, int64_t capacity,
                   std::vector<int64_t>* taken);
  // A source's place in DrawWhole's schedule for the step.
  struct Flow {
    int64_t doc_tokens = 0;  // of its head document
    int64_t unit = 0;        // tokens of its next unit
    int64_t served = 0;      // tokens taken this step
    bool atomic = false;     // the unit is a multimodal document's atomic head
    bool blocked = false;    // its unit did not fit: it takes nothing more this step
    // The phase of the head document's cut points (split: boundary), for its position
    // and piece cap.
    int64_t phase = 0, phase_cap = 0;
    StreamPos phase_pos;
  };
  /// Sets `flow`'s head document and next unit for `source` (reading its stream when
  /// the head is consumed).
  Status NextUnit(int32_t source, int64_t seq_len, int64_t fill, Flow* flow);
  /// Takes `tokens` of `source`'s next unit (all of it, or the step's last tokens) into
  /// pieces_, then finds its next unit.
  Status TakeUnit(int32_t source, int64_t tokens, int64_t seq_len, int64_t fill);
  /// Packs pieces_ into sequences_ (mix.exact: step: interleave order, cut at sequence
  /// boundaries; time: whole where they fit), with the sequences' tokens and costs in
  /// seq_tokens_ / seq_costs_ and the context figures in the plan.
  Status PackInterleaved(int64_t seq_len, int64_t fill, int64_t num_sequences,
                         StepPlan* plan);
  Status PackWhole(int64_t seq_len, int64_t fill, StepPlan* plan);

  Result<StepPlan> PlanBlocks();

  const Config config_;  // in blocks of `block_` tokens (see the header comment)
  int64_t block_ = 1;    // batch.pad_to_multiple_of
  std::vector<std::unique_ptr<SampleStream>> block_streams_;  // streams_ in blocks
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
  // DrawWhole's and PackWhole's scratch.
  std::vector<Flow> flows_;
  std::vector<double> owed_, rate_;  // per source: owed at the step's start, share
  std::vector<int32_t> active_, draw_sources_;
  std::vector<std::pair<double, int32_t>> scratch_, waiting_, ready_;
  struct Part {  // a part of a drawn piece in a sequence
    int32_t piece = 0;
    int64_t offset = 0;
    int64_t len = 0;
  };
  std::vector<Part> special_;
  std::vector<int32_t> by_sequence_, head_of_, text_order_, text_piece_, text_sequence_,
      piece_parts_, at_, slot_;
  std::vector<int64_t> rooms_, text_lens_;
  std::vector<PackedPart> cut_parts_;
  WholePacker packer_;
};

}  // namespace braid
