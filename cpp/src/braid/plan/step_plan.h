// The planner's output for one global step, and the planner's resumable state.
//
// A StepPlan says, for every DP rank, which pieces of which documents fill each sequence
// of each micro-batch. Constructors execute it; `braid plan` prints it as one JSON line
// (docs/plan-format.md). PlannerState is everything needed to continue the stream exactly:
// the step, and per source its cursor, the consumed part of a split document, and the
// tokens it is owed (its carry). Thread-safe: immutable values once built.
//
// Memory: the nested vectors of a plan the planner builds (every micro-batch's sequences,
// every sequence's pieces) live in one arena the plan owns (StepPlan::arena), so building
// and destroying a step's ~16k sequences is a few large allocations, not one per vector.
// A plan copied, or built by hand (tests), uses the heap. Moving a part (a MicroBatch, a
// Sequence) out of a planner-built plan keeps it in that plan's arena: copy a part that
// must outlive its plan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <memory_resource>
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

/// The allocator of a plan's nested vectors: the plan's arena for a planner-built plan,
/// the heap (the default) otherwise. Sequence, MicroBatch and BucketPlan are allocator-aware:
/// a vector of them built with an arena allocator puts their own vectors there too.
using PlanAllocator = std::pmr::polymorphic_allocator<std::byte>;

struct Sequence {
  using allocator_type = PlanAllocator;
  std::pmr::vector<DocPiece> docs;
  int64_t tokens = 0;
  double cost = 0;

  Sequence() = default;
  explicit Sequence(const allocator_type& alloc) : docs(alloc) {}
  Sequence(const Sequence& other, const allocator_type& alloc)
      : docs(other.docs, alloc), tokens(other.tokens), cost(other.cost) {}
  Sequence(Sequence&& other, const allocator_type& alloc)
      : docs(std::move(other.docs), alloc), tokens(other.tokens), cost(other.cost) {}
  Sequence(const Sequence&) = default;  ///< the copy's vectors on the heap
  Sequence(Sequence&&) noexcept = default;
  Sequence& operator=(const Sequence&) = default;
  Sequence& operator=(Sequence&&) = default;
};

struct MicroBatch {
  using allocator_type = PlanAllocator;
  std::pmr::vector<Sequence> sequences;  ///< micro_batch_size of them
  int64_t tokens = 0;
  double cost = 0;

  MicroBatch() = default;
  explicit MicroBatch(const allocator_type& alloc) : sequences(alloc) {}
  MicroBatch(const MicroBatch& other, const allocator_type& alloc)
      : sequences(other.sequences, alloc), tokens(other.tokens), cost(other.cost) {}
  MicroBatch(MicroBatch&& other, const allocator_type& alloc)
      : sequences(std::move(other.sequences), alloc),
        tokens(other.tokens),
        cost(other.cost) {}
  MicroBatch(const MicroBatch&) = default;
  MicroBatch(MicroBatch&&) noexcept = default;
  MicroBatch& operator=(const MicroBatch&) = default;
  MicroBatch& operator=(MicroBatch&&) = default;
};

/// One bucket's part of a step (the part balanced for one group of ranks; bucket = DP
/// rank by default, docs/architecture.md's glossary): its micro-batches.
struct BucketPlan {
  using allocator_type = PlanAllocator;
  int64_t bucket = 0;  ///< index in topology.buckets(); the plan JSON's "dp"
  int64_t tokens = 0;
  double cost = 0;
  std::pmr::vector<MicroBatch> micro_batches;

  BucketPlan() = default;
  explicit BucketPlan(const allocator_type& alloc) : micro_batches(alloc) {}
  BucketPlan(const BucketPlan& other, const allocator_type& alloc)
      : bucket(other.bucket),
        tokens(other.tokens),
        cost(other.cost),
        micro_batches(other.micro_batches, alloc) {}
  BucketPlan(BucketPlan&& other, const allocator_type& alloc)
      : bucket(other.bucket),
        tokens(other.tokens),
        cost(other.cost),
        micro_batches(std::move(other.micro_batches), alloc) {}
  BucketPlan(const BucketPlan&) = default;
  BucketPlan(BucketPlan&&) noexcept = default;
  BucketPlan& operator=(const BucketPlan&) = default;
  BucketPlan& operator=(BucketPlan&&) = default;
};

/// The memory of a planner-built plan's nested vectors (a monotonic arena). It moves with
/// its plan; a copy has none (the copy's vectors are on the heap). Not thread-safe to
/// allocate from; a built plan only reads.
class PlanArena {
 public:
  PlanArena() = default;
  /// An arena whose first block holds `initial_bytes`.
  explicit PlanArena(size_t initial_bytes)
      : resource_(std::make_unique<std::pmr::monotonic_buffer_resource>(initial_bytes)) {}
  PlanArena(const PlanArena&) noexcept {}  // NOLINT: a copy has no arena
  PlanArena& operator=(const PlanArena&) = delete;
  PlanArena(PlanArena&&) noexcept = default;
  PlanArena& operator=(PlanArena&&) noexcept = default;

  /// The allocator of the arena; the heap's when there is none.
  PlanAllocator allocator() const {
    return resource_ ? PlanAllocator(resource_.get()) : PlanAllocator();
  }
  explicit operator bool() const { return resource_ != nullptr; }

  /// Says that no piece in the arena holds a payload (a plan made from metadata only), so
  /// the plan is freed with its arena without visiting its pieces.
  void set_pieces_without_payloads(bool v) { pieces_without_payloads_ = v; }
  bool pieces_without_payloads() const { return resource_ && pieces_without_payloads_; }

 private:
  std::unique_ptr<std::pmr::monotonic_buffer_resource> resource_;
  bool pieces_without_payloads_ = false;
};

struct SourceCursor {
  StreamPos next;          ///< first sample not fully consumed
  int64_t head_start = 0;  ///< tokens already consumed of the sample at `next`
  /// Tokens the source is owed: its share of the tokens planned so far less what it
  /// received (negative when ahead). The share drift is -carry.
  double carry = 0;
  int64_t skipped = 0;     ///< samples skipped so far (empty, null, oversize)
  bool operator==(const SourceCursor&) const = default;
};

struct PlannerState {
  int64_t step = 0;
  std::vector<SourceCursor> sources;
  bool operator==(const PlannerState&) const = default;
};

struct StepPlan {
  StepPlan() = default;
  StepPlan(const StepPlan&) = default;  ///< the copy's nested vectors on the heap, no arena
  StepPlan(StepPlan&&) noexcept = default;
  StepPlan& operator=(const StepPlan& other) { return *this = StepPlan(other); }
  /// `buckets` first (its old contents go while their arena lives), then `arena`.
  StepPlan& operator=(StepPlan&&) noexcept = default;
  /// Destroys `buckets` before `arena`, which holds their vectors.
  ~StepPlan();

  int64_t step = 0;
  int64_t seq_len = 0;
  double imbalance = 1.0;
  /// The imbalance the same sequences would have if assigned in order (what per-rank
  /// loaders get); for reports, not part of the plan.
  double sequential_imbalance = 1.0;
  /// Multimodal documents that found no sequence with room for them whole, so they were
  /// cut after their image tokens, their text continuing elsewhere (docs/planner.md);
  /// for reports, not in the JSON.
  int64_t multimodal_cut = 0;
  /// Multimodal documents left at the head of their source for a later step: its quota
  /// could not hold them, or no sequence had room for their image tokens
  /// (docs/planner.md); for reports, not in the JSON.
  int64_t multimodal_deferred = 0;
  std::vector<int64_t> source_tokens;  ///< per source, tokens in this step
  /// Per source, the context figures of this step's pieces summed (planner.h,
  /// ContextOf): mean context / bound = source_context / source_bound.
  std::vector<int64_t> source_context;
  std::vector<int64_t> source_bound;
  std::vector<BucketPlan> buckets;  ///< one per bucket (topology.buckets()), in bucket order
  PlannerState state_before;
  PlannerState state_after;
  /// Holds the nested vectors of `buckets` in a planner-built plan; empty when they are on
  /// the heap. INVARIANT: declared after `buckets` and outlives their contents (see the
  /// destructor and the move assignment).
  PlanArena arena;
};

/// What a run's summary takes from one step's plan (whichever runtime planned it).
struct PlanFigures {
  int64_t step = 0;
  double imbalance = 1.0;
  double sequential_imbalance = 1.0;
  std::vector<int64_t> source_tokens;
  std::vector<int64_t> skipped;  ///< per source, samples skipped since the start (state)
  int64_t padding_tokens = 0;
  int64_t multimodal_cut = 0;
  int64_t multimodal_deferred = 0;
  int64_t seq_len = 0;
  std::vector<int64_t> source_context;  ///< per source, StepPlan::source_context
  std::vector<int64_t> source_bound;    ///< per source, StepPlan::source_bound
  std::vector<double> source_drift;     ///< per source, after the step (-carry)
};
PlanFigures FiguresOf(const StepPlan& plan, const Config& config);

/// One JSON object on one line, the `braid plan` contract.
std::string StepPlanToJson(const StepPlan& plan, const Config& config);

/// The state as a JSON object (what Loader.state_dict() and --state-out carry).
/// `consumed_micro_batches` counts the micro-batches of step `state.step` that a client
/// has already received (0 at a step boundary).
std::string PlannerStateToJson(const PlannerState& state, const Config& config,
                               int64_t consumed_micro_batches = 0);

/// The state of a client that has received `consumed` of its `per_step` micro-batches
/// of the step planned from `before` to `after`: resuming from it continues right after
/// the last micro-batch received (`after` once the step is complete).
std::string ClientStateJson(const PlannerState& before, const PlannerState& after,
                            int64_t consumed, int64_t per_step, const Config& config);

/// The version PlannerStateToJson writes. Version 1 (states saved before shares were
/// kept exact over time) resumes only under mix.exact: step, the accounting it was
/// saved with.
inline constexpr int64_t kStateVersion = 2;

/// Parses PlannerStateToJson's output and checks it against `config` (version,
/// fingerprint, source names). Fails with a config error under the key "state".
Result<PlannerState> PlannerStateFromJson(const std::string& text, const Config& config,
                                          int64_t* consumed_micro_batches = nullptr);

}  // namespace braid
