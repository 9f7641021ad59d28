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
// CountText cut them (each sequence's docs reserved for its parts by the caller).
void FillText(int64_t fill, const std::vector<int32_t>& order, std::vector<DocPiece>* pieces,
              std::vector<Sequence>* sequences) {
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
        docs.push_back(std::move(piece));
        if (filled == fill) {
          ++current;
          filled = 0;
        }
        break;
      }
      DocPiece& part = docs.emplace_back(piece);
      part.len = room;
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
                      std::vector<Sequence>* sequences) {
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

Result<std::unique_ptr<Planner>> Planner::Make(const Config& config,
                                               std::vector<SampleStream*> streams,
                                               PlannerState state) {
  if (streams.size() != config.sources.size() ||
      state.sources.size() != config.sources.size()) {
    return Status::Invalid("planner: ", config.sources.size(), " sources but ",
                           streams.size(), " streams and ", state.sources.size(),
                           " cursors");
  }
  return std::unique_ptr<Planner>(new Planner(config, std::move(streams), std::move(state)));
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

Status Planner::Draw(int32_t source, int64_t quota, int64_t seq_len, int64_t fill,
                     std::vector<DocPiece>* pieces, int64_t* drawn) {
  auto& cursor = state_.sources[size_t(source)];
  Sample& head = heads_[size_t(source)];
  const SourceConfig& src = config_.sources[size_t(source)];
  int64_t need = quota;
  int64_t skipped_in_a_row = 0;
  while (need > 0) {
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
      if (!placer_) {
        placer_ = std::make_unique<Placer>(
            size_t(config_.batch.global_tokens / seq_len), fill, seq_len - fill,
            internal::DeriveSeed({config_.seed, kPlaceSalt, uint64_t(state_.step)}));
      }
      bool cut = false;
      if (!placer_->Place(static_cast<int32_t>(pieces->size()), atomic,
                          head.meta.image_tokens, &cut)) {
        ++multimodal_deferred_;
        break;
      }
      multimodal_cut_ += cut ? 1 : 0;
    }
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
    need -= take;
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
  if (need > 0) cursor.carry += static_cast<double>(need);  // a deferred document
  *drawn = quota - need;
  return Status::OK();
}

Result<StepPlan> Planner::PlanStep() {
  const int64_t seq_len = config_.SeqLenAt(state_.step);  // the phase's
  const int64_t num_sequences = config_.batch.global_tokens / seq_len;
  // Each sequence is packed to `fill` tokens: the step's budget leaves the token slack.
  const int64_t fill = FillTokens(config_.balance, seq_len);
  const int64_t capacity = num_sequences * fill;
  StepPlan plan;
  plan.step = state_.step;
  plan.seq_len = seq_len;
  plan.state_before = state_;

  // 1-2. Quotas and draw, source by source.
  plan.source_tokens = Quotas(capacity);
  pieces_.clear();
  piece_lens_.clear();
  any_image_tokens_ = false;
  any_payload_ = false;
  placer_.reset();
  multimodal_cut_ = 0;
  multimodal_deferred_ = 0;
  // Sources in config order, except that those owed a token or more (they deferred a
  // multimodal document; a rounding carry is below one) draw first, the most owed first,
  // while every sequence still has room: a document that found none is not starved by
  // the documents of sources drawn before it. Text-only steps keep the config order.
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
  plan.multimodal_cut = multimodal_cut_;
  plan.multimodal_deferred = multimodal_deferred_;
  // 3. Interleave and pack in that order. The interleave order is a seeded permutation of
  // the drawn pieces (the swaps that would shuffle them); the packer visits the pieces in
  // it and moves each into its sequence, so a piece moves once.
  internal::Rng rng(internal::DeriveSeed({config_.seed, kDrawSalt, uint64_t(state_.step)}));
  perm_.resize(pieces_.size());
  std::iota(perm_.begin(), perm_.end(), 0);
  rng.Shuffle(&perm_);
  const bool multimodal = any_image_tokens_;
  // The plan's nested vectors go to its arena, sized for the pieces drawn plus a cut per
  // sequence boundary: a step allocates a few large blocks and frees them at once.
  plan.arena = PlanArena((pieces_.size() + size_t(num_sequences)) * sizeof(DocPiece) +
                         size_t(num_sequences) * (sizeof(Sequence) + sizeof(MicroBatch)));
  plan.arena.set_pieces_without_payloads(!any_payload_);
  const PlanAllocator alloc = plan.arena.allocator();
  const bool slack = fill < seq_len && config_.balance.algorithm != BalanceAlgorithm::kNone;
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
  // The sequences in packing order, their vectors in the arena in that order too (filling
  // them there, sequentially, and then moving each sequence to its micro-batch beats
  // filling them in the plan's order: docs/planner.md).
  std::vector<Sequence>& sequences = sequences_;
  sequences.clear();
  sequences.reserve(size_t(num_sequences));
  for (int64_t i = 0; i < num_sequences; ++i) sequences.emplace_back(alloc);
  std::vector<double>& costs = seq_costs_;
  if (multimodal) {
    ARROW_RETURN_NOT_OK(
        PackMultimodal(config_.balance, fill, std::move(pieces_), placed, &sequences));
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
    FillText(fill, perm_, &pieces_, &sequences);
  }
  // 4. Balance over DP ranks, then cut each rank's sequences into micro-batches.
  const int64_t dp = config_.topology.buckets();  // one per DP rank by default
  auto rank_bins = PartitionEqualCount(costs, dp, config_.balance.algorithm);
  if (config_.balance.algorithm != BalanceAlgorithm::kNone &&
      SwapBetweenExtremeBins(costs, &rank_bins, /*max_swaps=*/dp) > 0) {
    // Then swaps between the costliest and the cheapest rank (plan/swap_refine.h).
    for (auto& bin : rank_bins) std::sort(bin.begin(), bin.end());
  }
  {  // in order, num_sequences / dp consecutive sequences per rank
    const size_t per = costs.size() / size_t(dp);
    double max_sum = 0, total = 0;
    for (size_t r = 0; r < size_t(dp); ++r) {
      double sum = 0;
      for (size_t k = r * per; k < (r + 1) * per; ++k) sum += costs[k];
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
  plan.ranks.reserve(static_cast<size_t>(dp));
  for (int64_t r = 0; r < dp; ++r) plan.ranks.emplace_back(alloc);
  std::vector<int32_t> flat;  // reused by every rank
  std::vector<double> member_costs, mb_costs;
  std::vector<int32_t> order(static_cast<size_t>(n_micro));  // of the micro-batches
  std::iota(order.begin(), order.end(), 0);
  for (int64_t r = 0; r < dp; ++r) {
    RankPlan& rank = plan.ranks[size_t(r)];
    rank.dp = r;
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
