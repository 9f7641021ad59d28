#include "braid/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "braid/plan/balance.h"
#include "braid/plan/rebalance.h"
#include "braid/plan/swap_refine.h"
#include "braid/util/rng_internal.h"

namespace braid {
namespace {

constexpr uint64_t kDrawSalt = 0xd7a3;
constexpr uint64_t kPlaceSalt = 0x91ac;
constexpr uint64_t kPhaseSalt = 0x5a3e;
// split: boundary cuts a document of this many pieces or more from its start: its pieces
// fill whole sequences whatever the phase, which would only cost context.
constexpr int64_t kAlignedPieces = 4;

// The position after `pos` (offset + 1); the loader normalizes a window overrun.
StreamPos After(StreamPos pos) {
  ++pos.offset;
  return pos;
}

// The splitting lever (balance.split / balance.max_piece): cuts every piece of a document
// longer than the cap at the document's cut points (token offsets in the document, so the
// result does not depend on how the quota cut the document). Keeps the pieces' order.
// `fill` is the tokens a sequence is packed to (seq_len less the slack).
void CutLongPieces(const BalanceConfig& b, int64_t seq_len, int64_t fill,
                   std::vector<DocPiece>* pieces) {
  const int64_t cap = b.max_piece > 0 ? std::min(b.max_piece, fill) : fill;
  const bool even = b.split == BalanceConfig::Split::kEven;
  if (!even && cap >= fill) return;  // boundary cuts happen while packing
  bool any = false;
  for (const DocPiece& p : *pieces) any = any || p.doc_tokens > cap;
  if (!any) return;
  std::vector<DocPiece> out;
  out.reserve(pieces->size() + pieces->size() / 4);
  for (DocPiece& p : *pieces) {
    const int64_t total = p.doc_tokens;
    // A multimodal document that fits a sequence is never cut (docs/planner.md).
    if (total <= cap || (p.image_tokens > 0 && total <= seq_len)) {
      out.push_back(std::move(p));
      continue;
    }
    const int64_t n = (total + cap - 1) / cap;
    // The k-th cut point: k*total/n (even) or k*cap (boundary).
    auto cut = [&](int64_t k) { return even ? k * total / n : std::min(k * cap, total); };
    const int64_t end = p.start + p.len;
    // First piece index whose end lies beyond p.start.
    int64_t k = even ? (p.start * n) / total : p.start / cap;
    while (cut(k + 1) <= p.start) ++k;
    int64_t at = p.start;
    while (at < end) {
      int64_t stop = std::min(end, cut(k + 1));
      // Never inside the image tokens that lead a multimodal document.
      if (at == 0 && p.image_tokens > 0) stop = std::min(end, std::max(stop, p.image_tokens));
      DocPiece part = p;
      part.start = at;
      part.len = stop - at;
      if (at != p.start) part.image_tokens = 0;
      out.push_back(std::move(part));
      at = stop;
      while (at < end && cut(k + 1) <= at) ++k;
    }
  }
  *pieces = std::move(out);
}

// Whether CutLongPieces would cut any of `pieces` (the splitting lever is on and some
// document is longer than its cap).
bool CutsLongPieces(const BalanceConfig& b, int64_t fill,
                    const std::vector<DocPiece>& pieces) {
  const int64_t cap = b.max_piece > 0 ? std::min(b.max_piece, fill) : fill;
  if (b.split != BalanceConfig::Split::kEven && cap >= fill) return false;
  for (const DocPiece& p : pieces) {
    if (p.doc_tokens > cap) return true;
  }
  return false;
}

// Per source, the context figures of the pieces of a step (ContextOf), as they are
// placed into sequences.
struct ContextTally {
  int64_t seq_len = 1;
  std::vector<int64_t>* context = nullptr;
  std::vector<int64_t>* bound = nullptr;
  void Add(int32_t source, int64_t start, int64_t len) {
    const PieceContext c = ContextOf(start, len, seq_len);
    (*context)[size_t(source)] += c.context;
    (*bound)[size_t(source)] += c.bound;
  }
};

// Packing text, pass 1, on the pieces' lengths alone: the pieces, visited in `order`, fill
// sequences of exactly `fill` tokens in turn; a piece that crosses a sequence boundary is
// cut there. Gives each sequence's part count, tokens and cost (its parts' costs summed in
// order). `lens[k]` is the length of piece k.
void CountText(const BalanceConfig& b, int64_t fill, const std::vector<int32_t>& order,
               const std::vector<int64_t>& lens, size_t num_sequences,
               std::vector<int32_t>* parts, std::vector<int64_t>* tokens,
               std::vector<double>* costs) {
  parts->assign(num_sequences, 0);
  tokens->assign(num_sequences, 0);
  costs->assign(num_sequences, 0.0);
  size_t current = 0;
  int64_t filled = 0;
  for (int32_t k : order) {
    int64_t len = lens[size_t(k)];
    while (len > 0) {
      const int64_t take = std::min(fill - filled, len);
      ++(*parts)[current];
      (*tokens)[current] += take;
      (*costs)[current] += PieceCost(b, take);
      len -= take;
      filled += take;
      if (filled == fill) {
        ++current;
        filled = 0;
      }
    }
  }
}

// Packing text, pass 2: moves the pieces, visited in `order`, into the sequences as
// CountText cut them (each sequence's docs reserved for its parts by the caller), and
// adds each part's context figures to `tally`.
void FillText(int64_t fill, const std::vector<int32_t>& order, std::vector<DocPiece>* pieces,
              std::vector<Sequence>* sequences, ContextTally* tally) {
  // The order is random over a buffer far larger than the cache: fetch pieces ahead.
  constexpr size_t kAhead = 24;
  size_t current = 0;
  int64_t filled = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i + kAhead < order.size()) {
      const char* ahead =
          reinterpret_cast<const char*>(pieces->data() + order[i + kAhead]);
      __builtin_prefetch(ahead);
      __builtin_prefetch(ahead + sizeof(DocPiece) - 1);
    }
    DocPiece& piece = (*pieces)[size_t(order[i])];
    while (piece.len > 0) {
      auto& docs = (*sequences)[current].docs;
      const int64_t room = fill - filled;
      if (piece.len <= room) {  // the rest of the piece fits: move it
        filled += piece.len;
        tally->Add(piece.source, piece.start, piece.len);
        docs.push_back(std::move(piece));
        if (filled == fill) {
          ++current;
          filled = 0;
        }
        break;
      }
      DocPiece& part = docs.emplace_back(piece);
      part.len = room;
      tally->Add(part.source, part.start, part.len);
      piece.start += room;
      piece.len -= room;
      ++current;
      filled = 0;
    }
  }
}

// Where the draw placed a piece that starts a multimodal document: the piece (its index
// in the draw), its sequence, and the length of its atomic head (the whole piece, its
// first L tokens, or, when no sequence had room for that, the room it was cut to after
// its image tokens).
struct Placement {
  int32_t piece = 0;
  int32_t sequence = 0;
  int64_t head = 0;
};

// Packing with multimodal pieces (docs/planner.md). The draw placed every piece that
// starts a multimodal document (image_tokens > 0): `placed` gives, in the pieces' order,
// its sequence and the length of its atomic head (the whole piece, its first L tokens,
// or the room it was cut to after its image tokens). Heads go to their sequences; the
// rest of such a piece and every text piece then fill the rooms left in order, cut where
// a room ends. Each sequence keeps its pieces in the pieces' order. With token slack the
// rooms are `fill` tokens; a head may take the slack (up to seq_len), text never does.
Status PackMultimodal(const BalanceConfig& b, int64_t fill, std::vector<DocPiece> pieces,
                      const std::vector<Placement>& placed,
                      std::vector<Sequence>* sequences, ContextTally* tally) {
  const size_t n_seq = sequences->size();
  std::vector<int64_t> room(n_seq, fill);  // to the fill; negative: into the slack
  std::vector<std::vector<std::pair<size_t, DocPiece>>> parts(n_seq);
  std::vector<std::pair<size_t, DocPiece>> text;
  text.reserve(pieces.size());
  size_t index = 0, next = 0;
  for (DocPiece& piece : pieces) {
    if (piece.image_tokens > 0) {
      if (next >= placed.size() || placed[next].head > piece.len ||
          size_t(placed[next].sequence) >= n_seq) {
        return Status::Invalid("planner: the multimodal placements of step do not match ",
                               "its pieces (a bug)");
      }
      const Placement& at = placed[next++];
      DocPiece head = piece;
      head.len = at.head;
      piece.start += at.head;
      piece.len -= at.head;
      piece.image_tokens = 0;
      room[size_t(at.sequence)] -= head.len;
      parts[size_t(at.sequence)].emplace_back(index++, std::move(head));
      if (piece.len == 0) continue;
    }
    text.emplace_back(index++, std::move(piece));
  }
  if (next != placed.size()) {
    return Status::Invalid("planner: ", placed.size() - next,
                           " multimodal placements without a piece (a bug)");
  }
  size_t k = 0;
  for (auto& [i, piece] : text) {
    while (piece.len > 0 && k < n_seq) {
      if (room[k] <= 0) {
        ++k;
        continue;
      }
      DocPiece part = piece;
      part.len = std::min(room[k], piece.len);
      piece.start += part.len;
      piece.len -= part.len;
      room[k] -= part.len;
      parts[k].emplace_back(i, std::move(part));
    }
  }
  for (size_t q = 0; q < n_seq; ++q) {
    auto& list = parts[q];
    std::stable_sort(list.begin(), list.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    Sequence& seq = (*sequences)[q];
    seq.docs.clear();
    seq.docs.reserve(list.size());
    for (auto& [i, part] : list) {
      seq.tokens += part.len;
      seq.cost += PieceCost(b, part.len, part.image_tokens);
      tally->Add(part.source, part.start, part.len);
      seq.docs.push_back(std::move(part));
    }
  }
  return Status::OK();
}

}  // namespace

// The step's multimodal placements, and the room each sequence has left for atomic heads
// in a max segment tree, so that the first sequence with enough room from a position on
// (wrapping around) and the one with the most room are found in O(log S).
class Planner::Placer {
 public:
  Placer(size_t sequences, int64_t fill, int64_t headroom, uint64_t seed)
      : sequences_(sequences), headroom_(headroom), rng_(seed) {
    while (leaves_ < sequences) leaves_ *= 2;
    tree_.assign(2 * leaves_, kNone);
    for (size_t k = 0; k < sequences; ++k) tree_[leaves_ + k] = fill;
    for (size_t i = leaves_ - 1; i > 0; --i) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  }

  /// Places drawn piece `piece` (a multimodal document's first piece, `atomic` tokens of
  /// it to be kept whole): whole into the first sequence with room for it from a seeded
  /// random one on, wrapping around (a head may take the token slack), so multimodal
  /// documents spread over the step's sequences as the interleave spreads text; else cut
  /// after its image tokens into the sequence with the most room if that holds them
  /// (`*cut` set); else false (no room: the document waits for the next step).
  bool Place(int32_t piece, int64_t atomic, int64_t image_tokens, bool* cut) {
    const size_t from = size_t(rng_.Below(sequences_));
    int64_t at = Find(1, 0, leaves_, from, atomic - headroom_);
    if (at < 0) at = Find(1, 0, leaves_, 0, atomic - headroom_);
    *cut = false;
    if (at < 0) {
      const int64_t most = tree_[1];
      if (most < std::max<int64_t>(image_tokens, 1)) return false;
      at = Find(1, 0, leaves_, 0, most);
      atomic = most;
      *cut = true;
    }
    size_t i = leaves_ + size_t(at);
    tree_[i] -= atomic;
    for (i /= 2; i > 0; i /= 2) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
    placements_.push_back(Placement{piece, static_cast<int32_t>(at), atomic});
    return true;
  }

  const std::vector<Placement>& placements() const { return placements_; }

 private:
  static constexpr int64_t kNone = INT64_MIN / 4;  // padding leaves: no room

  // The first leaf index >= `from` under `node` (covering [lo, hi)) with room >= `need`;
  // -1 when none.
  int64_t Find(size_t node, size_t lo, size_t hi, size_t from, int64_t need) const {
    if (hi <= from || tree_[node] < need) return -1;
    if (hi - lo == 1) return int64_t(lo);
    const size_t mid = (lo + hi) / 2;
    const int64_t left = Find(2 * node, lo, mid, from, need);
    return left >= 0 ? left : Find(2 * node + 1, mid, hi, from, need);
  }

  const size_t sequences_;
  const int64_t headroom_;
  internal::Rng rng_;
  size_t leaves_ = 1;
  std::vector<int64_t> tree_;          // [1] the root, leaves from leaves_
  std::vector<Placement> placements_;  // in draw order
};

Planner::~Planner() = default;

Planner::Planner(const Config& config, std::vector<SampleStream*> streams,
                 PlannerState state)
    : config_(config),
      streams_(std::move(streams)),
      state_(std::move(state)),
      heads_(streams_.size()),
      has_head_(streams_.size(), false) {}

PlannerState Planner::InitialState(const Config& config) {
  PlannerState s;
  s.sources.resize(config.sources.size());
  return s;
}

namespace {

// batch.pad_to_multiple_of (planner.h): the config as the planner sees it, in blocks.
Config InBlocks(const Config& config) {
  const int64_t m = config.batch.pad_to_multiple_of;
  Config c = config;
  c.batch.global_tokens /= m;
  c.batch.seq_len /= m;
  for (PhaseConfig& p : c.phases) p.seq_len /= m;
  c.balance.max_piece /= m;
  const double md = static_cast<double>(m);
  c.balance.attn *= md * md;
  c.balance.linear *= md;
  c.balance.vision *= md;
  return c;
}

// A source's samples with their lengths in blocks of `block` tokens (rounded up).
class BlockStream : public SampleStream {
 public:
  BlockStream(SampleStream* inner, int64_t block) : inner_(inner), block_(block) {}
  Result<Sample> Next() override {
    ARROW_ASSIGN_OR_RAISE(Sample s, inner_->Next());
    s.meta.tokens = (s.meta.tokens + block_ - 1) / block_;
    s.meta.image_tokens = (s.meta.image_tokens + block_ - 1) / block_;
    return s;
  }
  int64_t rows_per_epoch() const override { return inner_->rows_per_epoch(); }

 private:
  SampleStream* inner_;
  const int64_t block_;
};

// A plan made in blocks of `m` tokens, in tokens (its context figures recomputed).
void PlanToTokens(int64_t m, StepPlan* plan) {
  plan->seq_len *= m;
  for (int64_t& t : plan->source_tokens) t *= m;
  std::fill(plan->source_context.begin(), plan->source_context.end(), 0);
  std::fill(plan->source_bound.begin(), plan->source_bound.end(), 0);
  for (BucketPlan& bucket : plan->buckets) {
    bucket.tokens *= m;
    for (MicroBatch& mb : bucket.micro_batches) {
      mb.tokens *= m;
      for (Sequence& seq : mb.sequences) {
        seq.tokens *= m;
        for (DocPiece& d : seq.docs) {
          d.start *= m;
          d.len *= m;
          d.doc_tokens *= m;
          d.image_tokens *= m;
          const PieceContext c = ContextOf(d.start, d.len, plan->seq_len);
          plan->source_context[size_t(d.source)] += c.context;
          plan->source_bound[size_t(d.source)] += c.bound;
        }
      }
    }
  }
}

}  // namespace

Result<std::unique_ptr<Planner>> Planner::Make(const Config& config,
                                               std::vector<SampleStream*> streams,
                                               PlannerState state) {
  if (streams.size() != config.sources.size() ||
      state.sources.size() != config.sources.size()) {
    return Status::Invalid("planner: ", config.sources.size(), " sources but ",
                           streams.size(), " streams and ", state.sources.size(),
                           " cursors");
  }
  const int64_t m = config.batch.pad_to_multiple_of;
  if (m <= 1) {
    return std::unique_ptr<Planner>(
        new Planner(config, std::move(streams), std::move(state)));
  }
  std::vector<std::unique_ptr<SampleStream>> blocks;
  std::vector<SampleStream*> in_blocks;
  for (SampleStream* s : streams) {
    blocks.push_back(std::make_unique<BlockStream>(s, m));
    in_blocks.push_back(blocks.back().get());
  }
  auto planner = std::unique_ptr<Planner>(
      new Planner(InBlocks(config), std::move(in_blocks), std::move(state)));
  planner->block_ = m;
  planner->block_streams_ = std::move(blocks);
  return planner;
}

Result<StepPlan> Planner::PlanStep() {
  ARROW_ASSIGN_OR_RAISE(StepPlan plan, PlanBlocks());
  if (block_ > 1) PlanToTokens(block_, &plan);
  return plan;
}

std::vector<int64_t> Planner::Quotas(int64_t capacity) {
  const size_t n = config_.sources.size();
  std::vector<double> weights(n);
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    weights[i] = config_.WeightAt(i, state_.step);
    total += weights[i];
  }
  std::vector<double> ideal(n, 0.0);
  std::vector<int64_t> quota(n, 0);
  int64_t assigned = 0;
  for (size_t i = 0; i < n; ++i) {
    auto& cursor = state_.sources[i];
    if (weights[i] <= 0) {
      cursor.carry = 0;  // a source that is off owes nothing and is owed nothing
      continue;
    }
    ideal[i] = weights[i] / total * static_cast<double>(capacity) + cursor.carry;
    quota[i] = std::max<int64_t>(0, static_cast<int64_t>(std::floor(ideal[i])));
    assigned += quota[i];
  }
  // Largest remainder: hand out (or take back) single tokens until the quotas sum to the
  // capacity. Ties go to the lower source index.
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i) {
    if (weights[i] > 0) order.push_back(i);
  }
  auto residual = [&](size_t i) { return ideal[i] - static_cast<double>(quota[i]); };
  if (assigned != capacity) {
    // The choice of scanning `order` for the best residual before every token (largest
    // when adding, smallest among quota > 0 when taking back; ties to the lower index),
    // kept in a heap: O(log n) per token instead of O(n) (1,000 sources).
    const bool add = assigned < capacity;
    auto chosen_before = [&](size_t a, size_t b) {
      const double ra = residual(a), rb = residual(b);
      if (ra != rb) return add ? ra > rb : ra < rb;
      return a < b;
    };
    auto heap_less = [&](size_t a, size_t b) { return chosen_before(b, a); };
    std::vector<size_t> heap;
    heap.reserve(order.size());
    for (size_t i : order) {
      if (add || quota[i] > 0) heap.push_back(i);
    }
    std::make_heap(heap.begin(), heap.end(), heap_less);
    while (assigned != capacity) {
      std::pop_heap(heap.begin(), heap.end(), heap_less);
      const size_t best = heap.back();
      heap.pop_back();
      quota[best] += add ? 1 : -1;
      assigned += add ? 1 : -1;
      if (add || quota[best] > 0) {
        heap.push_back(best);
        std::push_heap(heap.begin(), heap.end(), heap_less);
      }
    }
  }
  for (size_t i : order) state_.sources[i].carry = residual(i);
  return quota;
}

Result<int64_t> Planner::Head(int32_t source, int64_t seq_len) {
  auto& cursor = state_.sources[size_t(source)];
  Sample& head = heads_[size_t(source)];
  const SourceConfig& src = config_.sources[size_t(source)];
  int64_t skipped_in_a_row = 0;
  while (true) {
    if (!has_head_[size_t(source)]) {
      ARROW_ASSIGN_OR_RAISE(head, streams_[size_t(source)]->Next());
      bool skip = head.meta.skip != SkipReason::kNone;
      // A document already partly consumed (a resume inside it, perhaps across a phase
      // boundary that shortened seq_len) is finished, never skipped half-way.
      if (!skip && src.oversize == Oversize::kSkip && cursor.head_start == 0 &&
          head.meta.tokens > seq_len) {
        head.meta.skip = SkipReason::kOversize;
        skip = true;
      }
      // Images that do not fit one sequence cannot be placed uncut: skipped, any mode.
      if (!skip && cursor.head_start == 0 && head.meta.image_tokens > seq_len) {
        head.meta.skip = SkipReason::kOversize;
        skip = true;
      }
      if (skip) {
        ++cursor.skipped;
        cursor.next = After(head.meta.pos);
        cursor.head_start = 0;
        if (++skipped_in_a_row > streams_[size_t(source)]->rows_per_epoch()) {
          return DataError(src.path, "sources[" + std::to_string(source) +
                                         "] ('" + src.name +
                                         "'): every sample of an epoch was skipped");
        }
        continue;
      }
      skipped_in_a_row = 0;
      has_head_[size_t(source)] = true;
      cursor.next = head.meta.pos;
    }
    const int64_t doc_tokens = src.oversize == Oversize::kTruncate
                                   ? std::min(head.meta.tokens, seq_len)
                                   : head.meta.tokens;
    // A resumed state names a document by its position only; if the document found there
    // is not longer than the consumed part, the state does not belong to this data (files
    // changed, or a hand-edited state). Planning on would draw more tokens than the step
    // holds.
    if (cursor.head_start >= doc_tokens && src.oversize == Oversize::kTruncate &&
        cursor.head_start < head.meta.tokens) {
      // Truncated at a longer seq_len before a phase boundary: that document is done.
      cursor.next = After(head.meta.pos);
      cursor.head_start = 0;
      has_head_[size_t(source)] = false;
      head = Sample{};
      continue;
    }
    if (cursor.head_start >= doc_tokens) {
      return ConfigError("state.sources[" + std::to_string(source) + "].head_start",
                         std::to_string(cursor.head_start) +
                             " tokens consumed, but the document at the cursor (" +
                             src.path + ", file " + std::to_string(head.meta.file) +
                             ", row " + std::to_string(head.meta.row) + ") has " +
                             std::to_string(doc_tokens) +
                             "; the source's files changed since the state was saved");
    }
    return doc_tokens;
  }
}

void Planner::Consume(int32_t source, int64_t doc_tokens, int64_t take,
                      std::vector<DocPiece>* pieces) {
  auto& cursor = state_.sources[size_t(source)];
  Sample& head = heads_[size_t(source)];
  DocPiece& piece = pieces->emplace_back();
  piece.source = source;
  piece.file = head.meta.file;
  piece.row = head.meta.row;
  piece.epoch = head.meta.epoch;
  piece.start = cursor.head_start;
  piece.len = take;
  piece.doc_tokens = doc_tokens;
  piece.image_tokens = cursor.head_start == 0 ? head.meta.image_tokens : 0;
  piece_lens_.push_back(take);
  any_image_tokens_ = any_image_tokens_ || piece.image_tokens > 0;
  any_payload_ = any_payload_ || static_cast<bool>(head.payload);
  cursor.head_start += take;
  if (cursor.head_start < doc_tokens) {
    piece.payload = head.payload;
  } else {  // the document's last piece takes the payload over
    piece.payload = std::move(head.payload);
    cursor.next = After(head.meta.pos);
    cursor.head_start = 0;
    has_head_[size_t(source)] = false;  // `head` is stale (its payload moved out)
  }
}

bool Planner::Place(int64_t atomic, int64_t image_tokens, int64_t seq_len, int64_t fill) {
  if (!placer_) {
    placer_ = std::make_unique<Placer>(
        size_t(config_.batch.global_tokens / seq_len), fill, seq_len - fill,
        internal::DeriveSeed({config_.seed, kPlaceSalt, uint64_t(state_.step)}));
  }
  bool cut = false;
  if (!placer_->Place(static_cast<int32_t>(pieces_.size()), atomic, image_tokens, &cut)) {
    return false;
  }
  multimodal_cut_ += cut ? 1 : 0;
  return true;
}

Status Planner::Draw(int32_t source, int64_t quota, int64_t seq_len, int64_t fill,
                     std::vector<DocPiece>* pieces, int64_t* drawn) {
  auto& cursor = state_.sources[size_t(source)];
  int64_t need = quota;
  while (need > 0) {
    ARROW_ASSIGN_OR_RAISE(const int64_t doc_tokens, Head(source, seq_len));
    const Sample& head = heads_[size_t(source)];
    // A multimodal document is not cut inside its image tokens (nor at all when it fits
    // a sequence): a quota too small for it ends here, the carry owes the rest.
    const bool starts_multimodal = cursor.head_start == 0 && head.meta.image_tokens > 0;
    if (starts_multimodal &&
        need < (doc_tokens <= seq_len ? doc_tokens : head.meta.image_tokens)) {
      ++multimodal_deferred_;
      break;
    }
    const int64_t take = std::min(need, doc_tokens - cursor.head_start);
    if (starts_multimodal) {
      // Placed now, before it is consumed: a document that no sequence has room for (not
      // even for its image tokens) stays at the head of the source for the next step.
      int64_t atomic = std::min(take, seq_len);
      if (doc_tokens > seq_len) {  // its first piece as the splitting lever cuts it
        std::vector<DocPiece> probe(1);
        probe[0].start = 0;
        probe[0].len = take;
        probe[0].doc_tokens = doc_tokens;
        probe[0].image_tokens = head.meta.image_tokens;
        CutLongPieces(config_.balance, seq_len, fill, &probe);
        atomic = std::min(probe[0].len, seq_len);
      }
      if (!Place(atomic, head.meta.image_tokens, seq_len, fill)) {
        ++multimodal_deferred_;
        break;
      }
    }
    Consume(source, doc_tokens, take, pieces);
    need -= take;
  }
  if (need > 0) cursor.carry += static_cast<double>(need);  // a deferred document
  *drawn = quota - need;
  return Status::OK();
}

Status Planner::NextUnit(int32_t source, int64_t seq_len, int64_t fill, Flow* flow) {
  ARROW_ASSIGN_OR_RAISE(flow->doc_tokens, Head(source, seq_len));
  const int64_t consumed = state_.sources[size_t(source)].head_start;
  const SampleMeta& meta = heads_[size_t(source)].meta;
  const BalanceConfig& b = config_.balance;
  const int64_t doc = flow->doc_tokens;
  const int64_t cap = b.max_piece > 0 ? std::min(b.max_piece, fill) : fill;
  const bool even = b.split == BalanceConfig::Split::kEven;
  const int64_t n = (doc + cap - 1) / cap;  // the lever's pieces of a document > cap
  // The k-th cut point of a document longer than the cap (CutLongPieces's).
  auto cut = [&](int64_t k) { return even ? k * doc / n : std::min(k * cap, doc); };
  flow->atomic = consumed == 0 && meta.image_tokens > 0;
  if (flow->atomic) {
    // Whole when it fits a sequence; else its first piece, never ending inside its
    // images (docs/planner.md, "multimodal documents").
    flow->unit =
        doc <= seq_len ? doc : std::min(std::max(cut(1), meta.image_tokens), seq_len);
    return Status::OK();
  }
  if (doc <= cap) {
    flow->unit = doc - consumed;
    return Status::OK();
  }
  if (b.split == BalanceConfig::Split::kBoundary && meta.image_tokens == 0 &&
      doc < kAlignedPieces * cap) {
    // Every cap tokens from a phase in [0, cap) drawn from the document's identity and
    // epoch: where the sequence ends of a concatenation would cut it (docs/decisions.md,
    // 2). The draw depends on the seed through the streams' orders alone.
    if (flow->phase_cap != cap || flow->phase_pos != meta.pos) {  // once a document
      flow->phase_cap = cap;
      flow->phase_pos = meta.pos;
      flow->phase = int64_t(
          internal::DeriveSeed({kPhaseSalt, uint64_t(source), uint64_t(meta.file),
                                uint64_t(meta.row), uint64_t(meta.epoch)}) %
          uint64_t(cap));
    }
    const int64_t phase = flow->phase;
    const int64_t next =
        consumed < phase ? phase : phase + ((consumed - phase) / cap + 1) * cap;
    flow->unit = std::min(next, doc) - consumed;
    return Status::OK();
  }
  int64_t k = even ? consumed * n / doc : consumed / cap;
  while (cut(k + 1) <= consumed) ++k;
  flow->unit = cut(k + 1) - consumed;
  return Status::OK();
}

Status Planner::TakeUnit(int32_t source, int64_t tokens, int64_t seq_len, int64_t fill) {
  Flow& f = flows_[size_t(source)];
  Consume(source, f.doc_tokens, tokens, &pieces_);
  f.served += tokens;
  return NextUnit(source, seq_len, fill, &f);
}

namespace {

// The in-step time at which the sources' positive balances sum to `capacity`: the root
// of sum_i max(0, owed_i + rate_i * t) = capacity over the sources `active`.
double BalanceTime(const std::vector<int32_t>& active, const std::vector<double>& owed,
                   const std::vector<double>& rate, double capacity,
                   std::vector<std::pair<double, int32_t>>* scratch) {
  scratch->clear();
  for (int32_t i : active) scratch->emplace_back(-owed[size_t(i)] / rate[size_t(i)], i);
  std::sort(scratch->begin(), scratch->end());
  double owed_sum = 0, rate_sum = 0;
  for (size_t k = 0; k < scratch->size(); ++k) {
    owed_sum += owed[size_t((*scratch)[k].second)];
    rate_sum += rate[size_t((*scratch)[k].second)];
    const double t = (capacity - owed_sum) / rate_sum;
    if (k + 1 == scratch->size() || t <= (*scratch)[k + 1].first) return t;
  }
  return 0;  // no source: not reached
}

}  // namespace

// Shares exact over time (docs/planner.md, "One step"; docs/decisions.md, 2). Within
// the step, source i is owed `owed_i + rate_i * x` tokens once the step holds x tokens
// (the fluid share), and units are taken as a fair scheduler serves packets (WF2Q): a
// source whose tokens do not exceed what it is owed is due, and the due source whose
// unit would be owed soonest ends first. The bulk is taken per source at once, up to
// what it is owed at a time a margin of one unit per source before the step fills; the
// rest unit by unit. A unit larger than the room left waits (its source is owed it next
// step); the last tokens are a cut of a text unit, where it loses least context.
Status Planner::DrawWhole(int64_t seq_len, int64_t fill, int64_t capacity,
                          std::vector<int64_t>* taken) {
  const size_t n = streams_.size();
  taken->assign(n, 0);
  flows_.assign(n, Flow{});
  owed_.assign(n, 0.0);
  rate_.assign(n, 0.0);
  double total_weight = 0, frozen = 0;
  for (size_t i = 0; i < n; ++i) {
    rate_[i] = config_.WeightAt(i, state_.step);
    total_weight += rate_[i];
    if (rate_[i] <= 0) frozen += state_.sources[i].carry;
  }
  active_.clear();
  for (size_t i = 0; i < n; ++i) {
    if (rate_[i] <= 0) continue;
    rate_[i] /= total_weight;
    // What the sources at weight 0 are owed (or hold ahead) stays theirs; the others
    // schedule around it in proportion to their shares, so that theirs sum to 0.
    owed_[i] = state_.sources[i].carry + rate_[i] * frozen;
    active_.push_back(static_cast<int32_t>(i));
  }
  if (active_.empty()) return Status::OK();
  // 1. Bulk: each source takes the units it is owed at time `bulk`, the most owed
  // source first (a multimodal document it deferred meets the step's rooms empty).
  const double bulk =
      BalanceTime(active_, owed_, rate_, double(capacity), &scratch_) -
      double(active_.size()) * double(fill);
  std::vector<int32_t>& order = draw_sources_;
  order = active_;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return owed_[size_t(a)] > owed_[size_t(b)];
  });
  int64_t x = 0;
  for (int32_t i : order) {
    Flow& f = flows_[size_t(i)];
    ARROW_RETURN_NOT_OK(NextUnit(i, seq_len, fill, &f));
    const double limit = owed_[size_t(i)] + rate_[size_t(i)] * bulk;
    while (double(f.served + f.unit) <= limit) {
      const int64_t image_tokens = heads_[size_t(i)].meta.image_tokens;
      if (f.atomic && !Place(f.unit, image_tokens, seq_len, fill)) {
        f.blocked = true;
        ++multimodal_deferred_;
        break;
      }
      x += f.unit;
      ARROW_RETURN_NOT_OK(TakeUnit(i, f.unit, seq_len, fill));
    }
  }
  // 2. Unit by unit. `waiting_` holds the sources not yet due by the time they are
  // (start), `ready_` the due ones by when their unit ends (finish); a blocked source
  // is in neither.
  using Key = std::pair<double, int32_t>;
  const auto later = [](const Key& a, const Key& b) { return a > b; };
  waiting_.clear();
  ready_.clear();
  auto slack = [&](int32_t i) {  // tokens owed at x less those taken: >= 0 when due
    return owed_[size_t(i)] + rate_[size_t(i)] * double(x) -
           double(flows_[size_t(i)].served);
  };
  auto finish = [&](int32_t i) {
    const Flow& f = flows_[size_t(i)];
    return (double(f.served + f.unit) - owed_[size_t(i)]) / rate_[size_t(i)];
  };
  auto enqueue = [&](int32_t i) {
    const double start = (double(flows_[size_t(i)].served) - owed_[size_t(i)]) /
                         rate_[size_t(i)];
    if (start <= double(x)) {
      ready_.emplace_back(finish(i), i);
      std::push_heap(ready_.begin(), ready_.end(), later);
    } else {
      waiting_.emplace_back(start, i);
      std::push_heap(waiting_.begin(), waiting_.end(), later);
    }
  };
  auto unqueue = [&](int32_t i) {
    for (auto* heap : {&waiting_, &ready_}) {
      for (size_t k = 0; k < heap->size(); ++k) {
        if ((*heap)[k].second != i) continue;
        heap->erase(heap->begin() + std::ptrdiff_t(k));
        std::make_heap(heap->begin(), heap->end(), later);
        return;
      }
    }
  };
  // Takes source i's unit whole if it fits the room and, multimodal, a sequence;
  // else blocks the source for the rest of the step.
  auto take_whole = [&](int32_t i) -> Status {
    Flow& f = flows_[size_t(i)];
    const int64_t image_tokens = heads_[size_t(i)].meta.image_tokens;
    if (f.unit > capacity - x ||
        (f.atomic && !Place(f.unit, image_tokens, seq_len, fill))) {
      f.blocked = true;
      multimodal_deferred_ += f.atomic ? 1 : 0;
      return Status::OK();
    }
    x += f.unit;
    ARROW_RETURN_NOT_OK(TakeUnit(i, f.unit, seq_len, fill));
    enqueue(i);
    return Status::OK();
  };
  for (int32_t i : active_) {
    if (!flows_[size_t(i)].blocked) enqueue(i);
  }
  const double lead_cap = double(fill);  // how far ahead a source may get to fill
  while (x < capacity) {
    const int64_t room = capacity - x;
    while (!waiting_.empty() && waiting_.front().first <= double(x)) {
      const int32_t i = waiting_.front().second;
      std::pop_heap(waiting_.begin(), waiting_.end(), later);
      waiting_.pop_back();
      ready_.emplace_back(finish(i), i);
      std::push_heap(ready_.begin(), ready_.end(), later);
    }
    if (!ready_.empty()) {  // the due source whose unit ends first
      const int32_t i = ready_.front().second;
      std::pop_heap(ready_.begin(), ready_.end(), later);
      ready_.pop_back();
      ARROW_RETURN_NOT_OK(take_whole(i));
      continue;
    }
    // No due source has a unit that fits. A source a little ahead whose unit fits, if
    // that keeps it within lead_cap of its share: the one whose unit ends first.
    int32_t pick = -1;
    for (const Key& key : waiting_) {
      const Flow& f = flows_[size_t(key.second)];
      if (f.unit > room || double(f.unit) - slack(key.second) > lead_cap) continue;
      if (pick < 0 || Key(finish(key.second), key.second) < Key(finish(pick), pick)) {
        pick = key.second;
      }
    }
    if (pick >= 0) {
      unqueue(pick);
      ARROW_RETURN_NOT_OK(take_whole(pick));
      continue;
    }
    // Else the last `room` tokens are a cut of a text unit longer than the room: the
    // one whose cut loses least context (room * (unit - room) token positions) for the
    // source's share, among the sources it keeps within lead_cap, else among the due
    // ones, else any.
    int32_t cut = -1;
    for (int tier = 0; tier < 3 && cut < 0; ++tier) {
      double best = 0;
      for (int32_t i : active_) {
        const Flow& f = flows_[size_t(i)];
        if (f.atomic || f.unit <= room) continue;
        if (tier == 0 && double(room) - slack(i) > lead_cap) continue;
        if (tier == 1 && slack(i) < 0) continue;
        // The context it loses, relative to the source's share: a cut costs a source of
        // small weight more of its context than one of the bulk of the mix.
        const double loss = double(room) * double(f.unit - room) / rate_[size_t(i)];
        if (cut < 0 || loss < best) {
          cut = i;
          best = loss;
        }
      }
    }
    if (cut < 0) {
      // No text unit is longer than the room: a whole unit that fits, the least ahead
      // first, even past lead_cap; else (only multimodal documents left) padding.
      for (const Key& key : waiting_) {
        const Flow& f = flows_[size_t(key.second)];
        if (f.unit > room) continue;
        if (pick < 0 || slack(key.second) > slack(pick)) pick = key.second;
      }
      if (pick < 0) break;
      unqueue(pick);
      ARROW_RETURN_NOT_OK(take_whole(pick));
      continue;
    }
    x += room;
    ARROW_RETURN_NOT_OK(TakeUnit(cut, room, seq_len, fill));
  }
  // What each source is owed after the step: its share of the tokens the step holds
  // less what it took (sources at weight 0 keep theirs).
  for (int32_t i : active_) {
    const Flow& f = flows_[size_t(i)];
    (*taken)[size_t(i)] = f.served;
    state_.sources[size_t(i)].carry += rate_[size_t(i)] * double(x) - double(f.served);
  }
  return Status::OK();
}

Status Planner::PackInterleaved(int64_t seq_len, int64_t fill, int64_t num_sequences,
                                StepPlan* plan) {
  // Interleave and pack in that order. The interleave order is a seeded permutation of
  // the drawn pieces (the swaps that would shuffle them); the packer visits the pieces
  // in it and moves each into its sequence, so a piece moves once.
  internal::Rng rng(internal::DeriveSeed({config_.seed, kDrawSalt, uint64_t(state_.step)}));
  perm_.resize(pieces_.size());
  std::iota(perm_.begin(), perm_.end(), 0);
  rng.Shuffle(&perm_);
  const bool multimodal = any_image_tokens_;
  ContextTally tally{seq_len, &plan->source_context, &plan->source_bound};
  std::vector<Placement> placed;  // the multimodal placements, in interleave order
  if (multimodal || CutsLongPieces(config_.balance, fill, pieces_)) {
    if (multimodal) {
      std::vector<int32_t> slot(pieces_.size(), -1);
      const auto& draw_order = placer_->placements();
      for (size_t j = 0; j < draw_order.size(); ++j) {
        slot[size_t(draw_order[j].piece)] = static_cast<int32_t>(j);
      }
      placed.reserve(draw_order.size());
      for (int32_t k : perm_) {
        if (slot[size_t(k)] >= 0) placed.push_back(draw_order[size_t(slot[size_t(k)])]);
      }
    }
    std::vector<DocPiece> shuffled;
    shuffled.reserve(pieces_.size());
    for (int32_t k : perm_) shuffled.push_back(std::move(pieces_[size_t(k)]));
    CutLongPieces(config_.balance, seq_len, fill, &shuffled);
    pieces_.swap(shuffled);
    perm_.resize(pieces_.size());
    std::iota(perm_.begin(), perm_.end(), 0);
    piece_lens_.resize(pieces_.size());
    for (size_t k = 0; k < pieces_.size(); ++k) piece_lens_[k] = pieces_[k].len;
  }
  std::vector<Sequence>& sequences = sequences_;
  std::vector<double>& costs = seq_costs_;
  if (multimodal) {
    ARROW_RETURN_NOT_OK(PackMultimodal(config_.balance, fill, std::move(pieces_), placed,
                                       &sequences, &tally));
    pieces_.clear();
    seq_tokens_.resize(sequences.size());
    costs.resize(sequences.size());
    for (size_t i = 0; i < sequences.size(); ++i) {
      seq_tokens_[i] = sequences[i].tokens;
      costs[i] = sequences[i].cost;
    }
  } else {  // text, in two passes: the cuts from the lengths, then the pieces
    CountText(config_.balance, fill, perm_, piece_lens_, size_t(num_sequences),
              &seq_parts_, &seq_tokens_, &costs);
    for (size_t i = 0; i < sequences.size(); ++i) {
      Sequence& seq = sequences[i];
      seq.docs.reserve(size_t(seq_parts_[i]));
      seq.tokens = seq_tokens_[i];
      seq.cost = costs[i];
    }
    FillText(fill, perm_, &pieces_, &sequences, &tally);
  }
  return Status::OK();
}

Status Planner::PackWhole(int64_t seq_len, int64_t fill, StepPlan* plan) {
  const size_t n_seq = sequences_.size();
  const size_t n = pieces_.size();
  // The interleave order (a seeded permutation of the drawn pieces) breaks ties between
  // equal lengths and orders the pieces of each sequence.
  internal::Rng rng(
      internal::DeriveSeed({config_.seed, kDrawSalt, uint64_t(state_.step)}));
  perm_.resize(n);
  std::iota(perm_.begin(), perm_.end(), 0);
  rng.Shuffle(&perm_);
  // Best fit decreasing fills sequences from the longest pieces down, so their order
  // follows their contents. Sequences assigned in order (`algorithm: none`, and the
  // sequential imbalance reported) take them in a seeded order instead, which says
  // nothing of their contents; the balancers keep the packer's (their ties cost the
  // swaps after them less work).
  slot_.resize(n_seq);
  std::iota(slot_.begin(), slot_.end(), 0);
  rng.Shuffle(&slot_);
  const bool in_order = config_.balance.algorithm == BalanceAlgorithm::kNone;
  const std::vector<int32_t>* first = in_order ? &slot_ : nullptr;
  // Multimodal heads go where the draw placed them; the rest of every piece is text.
  static const std::vector<Placement> kNone;
  const std::vector<Placement>& placed = placer_ ? placer_->placements() : kNone;
  rooms_.assign(n_seq, fill);
  if (!placed.empty()) {
    head_of_.assign(n, -1);
    for (size_t j = 0; j < placed.size(); ++j) {
      rooms_[size_t(placed[j].sequence)] -= placed[j].head;
      head_of_[size_t(placed[j].piece)] = static_cast<int32_t>(j);
    }
    for (int64_t& room : rooms_) room = std::max<int64_t>(room, 0);
  }
  // The text, in interleave order (so the packer's ties follow it): every piece of a
  // text step as drawn, else what follows the multimodal heads.
  const bool text_only = placed.empty();
  if (text_only) {
    ARROW_RETURN_NOT_OK(
        packer_.Pack(piece_lens_, perm_, &rooms_, &text_sequence_, &cut_parts_, first));
  } else {
    text_lens_.clear();
    text_piece_.clear();
    for (int32_t k : perm_) {
      const int32_t h = head_of_[size_t(k)];
      const int64_t rest = piece_lens_[size_t(k)] - (h >= 0 ? placed[size_t(h)].head : 0);
      if (rest <= 0) continue;
      text_piece_.push_back(k);
      text_lens_.push_back(rest);
    }
    text_order_.resize(text_lens_.size());
    std::iota(text_order_.begin(), text_order_.end(), 0);
    ARROW_RETURN_NOT_OK(
        packer_.Pack(text_lens_, text_order_, &rooms_, &text_sequence_, &cut_parts_,
                     first));
  }
  // Each sequence's parts in interleave order (a piece's by offset), as entries into its
  // slice of by_sequence_: a piece index for a piece placed whole, -1 - j for special_[j]
  // (a multimodal head, the text after it, a part of a cut piece).
  special_.clear();
  seq_parts_.assign(n_seq + 1, 0);
  for (int32_t s : text_sequence_) {
    if (s >= 0) ++seq_parts_[size_t(s) + 1];
  }
  for (const PackedPart& p : cut_parts_) ++seq_parts_[size_t(p.sequence) + 1];
  for (const Placement& at : placed) ++seq_parts_[size_t(at.sequence) + 1];
  for (size_t s = 0; s < n_seq; ++s) seq_parts_[s + 1] += seq_parts_[s];
  by_sequence_.resize(size_t(seq_parts_[n_seq]));
  at_.assign(seq_parts_.begin(), seq_parts_.end() - 1);
  auto add_special = [&](int32_t sequence, int32_t piece, int64_t offset, int64_t len) {
    by_sequence_[size_t(at_[size_t(sequence)]++)] = -1 - int32_t(special_.size());
    special_.push_back(Part{piece, offset, len});
  };
  if (text_only) {  // text index = piece index
    for (int32_t k : perm_) {
      const int32_t s = text_sequence_[size_t(k)];
      if (s >= 0) by_sequence_[size_t(at_[size_t(s)]++)] = k;
    }
    for (const PackedPart& p : cut_parts_) {
      add_special(p.sequence, p.piece, p.offset, p.len);
    }
  } else {
    size_t t = 0;  // the next text piece, in interleave order
    for (int32_t k : perm_) {
      int64_t offset = 0;
      const int32_t h = head_of_[size_t(k)];
      if (h >= 0) {
        offset = placed[size_t(h)].head;
        add_special(placed[size_t(h)].sequence, k, 0, offset);
      }
      if (t == text_piece_.size() || text_piece_[t] != k) continue;
      const int32_t s = text_sequence_[t];
      if (s >= 0 && offset == 0) {
        by_sequence_[size_t(at_[size_t(s)]++)] = k;
      } else if (s >= 0) {
        add_special(s, k, offset, text_lens_[t]);
      }
      ++t;
    }
    // The cut pieces' parts, after the whole ones of their sequences (a sequence holds
    // at most a few), with the piece order kept among them.
    for (const PackedPart& p : cut_parts_) {
      const int32_t k = text_piece_[size_t(p.piece)];
      const int32_t h = head_of_[size_t(k)];
      add_special(p.sequence, k, (h >= 0 ? placed[size_t(h)].head : 0) + p.offset, p.len);
    }
  }
  // How many special parts each piece has: the last takes its payload over. (A piece
  // placed whole is one part.)
  piece_parts_.assign(n, 0);
  for (const Part& p : special_) ++piece_parts_[size_t(p.piece)];
  // The sequences in order, their pieces written to the arena one after the other. The
  // pieces are read in a random order: fetch them ahead.
  ContextTally tally{seq_len, &plan->source_context, &plan->source_bound};
  seq_tokens_.assign(n_seq, 0);
  seq_costs_.assign(n_seq, 0.0);
  constexpr size_t kAhead = 16;
  const size_t total = by_sequence_.size();
  const double attn = config_.balance.attn, linear = config_.balance.linear;
  size_t index = 0;
  for (size_t s = 0; s < n_seq; ++s) {
    Sequence& seq = sequences_[s];
    const size_t last = size_t(seq_parts_[s + 1]);
    seq.docs.reserve(last - index);
    for (; index < last; ++index) {
      if (index + kAhead < total) {
        const int32_t e = by_sequence_[index + kAhead];
        const char* ahead = reinterpret_cast<const char*>(
            &pieces_[size_t(e >= 0 ? e : special_[size_t(-1 - e)].piece)]);
        __builtin_prefetch(ahead);
        __builtin_prefetch(ahead + sizeof(DocPiece) - 1);
      }
      const int32_t e = by_sequence_[index];
      if (e >= 0) {  // a whole text piece
        DocPiece& part = seq.docs.emplace_back(std::move(pieces_[size_t(e)]));
        const double l = static_cast<double>(part.len);
        seq.tokens += part.len;
        seq.cost += attn * l * l + linear * l;
        tally.Add(part.source, part.start, part.len);
        continue;
      }
      const Part& it = special_[size_t(-1 - e)];
      DocPiece& piece = pieces_[size_t(it.piece)];
      DocPiece& part = --piece_parts_[size_t(it.piece)] == 0
                           ? seq.docs.emplace_back(std::move(piece))
                           : seq.docs.emplace_back(piece);
      part.start += it.offset;
      part.len = it.len;
      if (it.offset > 0) part.image_tokens = 0;
      seq.tokens += part.len;
      seq.cost += PieceCost(config_.balance, part.len, part.image_tokens);
      tally.Add(part.source, part.start, part.len);
    }
    seq_tokens_[s] = seq.tokens;
    seq_costs_[s] = seq.cost;
  }
  pieces_.clear();
  return Status::OK();
}

Result<StepPlan> Planner::PlanBlocks() {
  const int64_t seq_len = config_.SeqLenAt(state_.step);  // the phase's
  const int64_t num_sequences = config_.batch.global_tokens / seq_len;
  // Each sequence is packed to `fill` tokens: the step's budget leaves the token slack.
  const int64_t fill = FillTokens(config_.balance, seq_len);
  const int64_t capacity = num_sequences * fill;
  const bool per_step = config_.mix.exact == MixConfig::Exact::kStep;
  StepPlan plan;
  plan.step = state_.step;
  plan.seq_len = seq_len;
  plan.state_before = state_;
  plan.source_context.assign(streams_.size(), 0);
  plan.source_bound.assign(streams_.size(), 0);

  // 1-2. The draw: per-step quotas (mix.exact: step), or whole units by the shares
  // owed over time.
  pieces_.clear();
  piece_lens_.clear();
  any_image_tokens_ = false;
  any_payload_ = false;
  placer_.reset();
  multimodal_cut_ = 0;
  multimodal_deferred_ = 0;
  if (per_step) {
    plan.source_tokens = Quotas(capacity);
    // Sources in config order, except that those owed a token or more (they deferred a
    // multimodal document; a rounding carry is below one) draw first, the most owed
    // first, while every sequence still has room: a document that found none is not
    // starved by the documents of sources drawn before it. Text-only steps keep the
    // config order.
    draw_order_.resize(streams_.size());
    std::iota(draw_order_.begin(), draw_order_.end(), size_t{0});
    auto owed = [&](size_t i) {
      const double carry = plan.state_before.sources[i].carry;  // before Quotas reset it
      return carry >= 1.0 ? carry : 0.0;
    };
    std::stable_sort(draw_order_.begin(), draw_order_.end(),
                     [&](size_t a, size_t b) { return owed(a) > owed(b); });
    for (size_t i : draw_order_) {
      if (plan.source_tokens[i] > 0) {
        ARROW_RETURN_NOT_OK(Draw(static_cast<int32_t>(i), plan.source_tokens[i], seq_len,
                                 fill, &pieces_, &plan.source_tokens[i]));
      }
    }
  } else {
    ARROW_RETURN_NOT_OK(DrawWhole(seq_len, fill, capacity, &plan.source_tokens));
  }
  plan.multimodal_cut = multimodal_cut_;
  plan.multimodal_deferred = multimodal_deferred_;
  // 3. Pack. The plan's nested vectors go to its arena, sized for the pieces drawn plus
  // a cut per sequence boundary: a step allocates a few large blocks and frees them at
  // once. The sequences are in packing order, their vectors in the arena in that order
  // too (filling them there, sequentially, and then moving each sequence to its
  // micro-batch beats filling them in the plan's order: docs/planner.md).
  plan.arena = PlanArena((pieces_.size() + size_t(num_sequences)) * sizeof(DocPiece) +
                         size_t(num_sequences) * (sizeof(Sequence) + sizeof(MicroBatch)));
  plan.arena.set_pieces_without_payloads(!any_payload_);
  const PlanAllocator alloc = plan.arena.allocator();
  const bool slack = fill < seq_len && config_.balance.algorithm != BalanceAlgorithm::kNone;
  std::vector<Sequence>& sequences = sequences_;
  sequences.clear();
  sequences.reserve(size_t(num_sequences));
  for (int64_t i = 0; i < num_sequences; ++i) sequences.emplace_back(alloc);
  if (per_step) {
    ARROW_RETURN_NOT_OK(PackInterleaved(seq_len, fill, num_sequences, &plan));
  } else {
    ARROW_RETURN_NOT_OK(PackWhole(seq_len, fill, &plan));
  }
  std::vector<double>& costs = seq_costs_;
  // 4. Balance over DP ranks, then cut each rank's sequences into micro-batches.
  const int64_t dp = config_.topology.buckets();  // one per DP rank by default
  auto rank_bins = PartitionEqualCount(costs, dp, config_.balance.algorithm);
  if (config_.balance.algorithm != BalanceAlgorithm::kNone &&
      SwapBetweenExtremeBins(costs, &rank_bins, /*max_swaps=*/dp) > 0) {
    // Then swaps between the costliest and the cheapest rank (plan/swap_refine.h).
    for (auto& bin : rank_bins) std::sort(bin.begin(), bin.end());
  }
  {  // in order, num_sequences / dp consecutive sequences per rank (under mix.exact:
     // time in a seeded order when the packer's follows the sequences' contents)
    const size_t per = costs.size() / size_t(dp);
    const bool seeded = !per_step && config_.balance.algorithm != BalanceAlgorithm::kNone;
    double max_sum = 0, total = 0;
    for (size_t r = 0; r < size_t(dp); ++r) {
      double sum = 0;
      for (size_t k = r * per; k < (r + 1) * per; ++k) {
        sum += costs[seeded ? size_t(slot_[k]) : k];
      }
      max_sum = std::max(max_sum, sum);
      total += sum;
    }
    plan.sequential_imbalance = total > 0 ? max_sum / (total / double(dp)) : 1.0;
  }
  // Token slack: pieces move between the ranks' sequences into the room it left.
  if (slack) {
    MovePiecesBetweenBins(config_.balance, seq_len, rank_bins, &sequences);
    for (size_t i = 0; i < sequences.size(); ++i) {
      seq_tokens_[i] = sequences[i].tokens;
      costs[i] = sequences[i].cost;
    }
  }
  plan.imbalance = Imbalance(costs, rank_bins);
  const int64_t mbs = config_.batch.micro_batch_size;
  const int64_t n_micro = num_sequences / (dp * mbs);
  plan.buckets.reserve(static_cast<size_t>(dp));
  for (int64_t r = 0; r < dp; ++r) plan.buckets.emplace_back(alloc);
  std::vector<int32_t> flat;  // reused by every rank
  std::vector<double> member_costs, mb_costs;
  std::vector<int32_t> order(static_cast<size_t>(n_micro));  // of the micro-batches
  std::iota(order.begin(), order.end(), 0);
  for (int64_t r = 0; r < dp; ++r) {
    BucketPlan& rank = plan.buckets[size_t(r)];
    rank.bucket = r;
    const auto& members = rank_bins[size_t(r)];
    // Micro-batch k holds flat[k * mbs .. (k + 1) * mbs): the rank's sequences in order
    // (mbs 1), or partitioned over the micro-batches like the ranks.
    flat.clear();
    if (mbs == 1) {
      flat = members;
    } else {
      member_costs.clear();
      for (int32_t m : members) member_costs.push_back(costs[size_t(m)]);
      for (auto& bin : PartitionEqualCount(member_costs, n_micro,
                                           config_.balance.algorithm)) {
        for (int32_t k : bin) flat.push_back(members[size_t(k)]);
      }
    }
    mb_costs.assign(size_t(n_micro), 0.0);
    for (int64_t k = 0; k < n_micro; ++k) {
      int64_t tokens = 0;
      for (int64_t j = k * mbs; j < (k + 1) * mbs; ++j) {
        tokens += seq_tokens_[size_t(flat[size_t(j)])];
        mb_costs[size_t(k)] += costs[size_t(flat[size_t(j)])];
      }
      rank.tokens += tokens;
      rank.cost += mb_costs[size_t(k)];
    }
    // Heaviest micro-batches in the middle of the rank's order (fewer pipeline bubbles);
    // `none` keeps the per-rank loader's order. Each sequence belongs to exactly one
    // micro-batch: move, never copy.
    if (config_.balance.algorithm != BalanceAlgorithm::kNone) {
      MiddleHeavyOrder(mb_costs, &order);
    }
    rank.micro_batches.resize(size_t(n_micro));
    for (int64_t pos = 0; pos < n_micro; ++pos) {
      const int64_t k = order[size_t(pos)];
      MicroBatch& mb = rank.micro_batches[size_t(pos)];
      mb.sequences.reserve(size_t(mbs));
      for (int64_t j = k * mbs; j < (k + 1) * mbs; ++j) {
        const size_t s = size_t(flat[size_t(j)]);
        mb.tokens += seq_tokens_[s];
        mb.cost += costs[s];
        mb.sequences.push_back(std::move(sequences[s]));
      }
    }
  }
  sequences.clear();  // all moved into the plan: keep nothing that refers to its arena
  ++state_.step;
  plan.state_after = state_;
  return plan;
}

}  // namespace braid
