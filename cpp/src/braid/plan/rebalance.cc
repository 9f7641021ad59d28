#include "braid/plan/rebalance.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <iterator>
#include <set>
#include <utility>

#include "braid/plan/planner.h"

namespace braid {
namespace {

bool SameDocument(const DocPiece& a, const DocPiece& b) {
  return a.source == b.source && a.file == b.file && a.row == b.row && a.epoch == b.epoch;
}

// One way to shift cost from one bin to another: piece `a` of sequence `from` moves to
// sequence `to`, and (a swap) piece `b` of `to` moves to `from`.
struct Exchange {
  int32_t from = -1;
  size_t a = 0;
  int32_t to = -1;
  int64_t b = -1;  // -1: a move
  double score = 0;
};

bool HoldsDocument(const Sequence& seq, const DocPiece& piece, int64_t except = -1) {
  for (size_t i = 0; i < seq.docs.size(); ++i) {
    if (int64_t(i) != except && SameDocument(seq.docs[i], piece)) return true;
  }
  return false;
}

}  // namespace

int64_t MovePiecesBetweenBins(const BalanceConfig& b, int64_t capacity,
                              const std::vector<std::vector<int32_t>>& bins,
                              std::vector<Sequence>* sequences) {
  std::vector<Sequence>& seqs = *sequences;
  const size_t m = bins.size();
  if (m < 2) return 0;
  std::vector<double> load(m, 0.0);
  size_t pieces = 0;
  for (size_t r = 0; r < m; ++r) {
    for (int32_t s : bins[r]) {
      load[r] += seqs[size_t(s)].cost;
      pieces += seqs[size_t(s)].docs.size();
    }
  }
  auto cost = [&](const DocPiece& d) { return PieceCost(b, d.len, d.image_tokens); };
  // Each exchange lowers the sum of squared loads, so the loop ends; the cap bounds it.
  const int64_t max_exchanges = static_cast<int64_t>(4 * pieces + 16);
  // The bins by (load, index), updated as loads change.
  std::set<std::pair<double, int32_t>> by_load;
  for (size_t r = 0; r < m; ++r) by_load.emplace(load[r], static_cast<int32_t>(r));
  int64_t exchanges = 0;
  while (exchanges < max_exchanges) {
    // The costliest bin, ties to the lower index.
    const double top = std::prev(by_load.end())->first;
    const size_t hi = size_t(by_load.lower_bound({top, INT32_MIN})->second);
    Exchange best;
    for (const auto& [lo_load, lo_index] : by_load) {
      const size_t lo = size_t(lo_index);
      const double gap = load[hi] - load[lo];
      if (gap <= 0) break;
      // The exchange that shifts the cost nearest gap / 2, strictly between 0 and gap.
      auto consider = [&](int32_t from, size_t a, int32_t to, int64_t bi, double shift) {
        if (!(shift > 0 && shift < gap)) return;
        const double score = std::abs(gap / 2 - shift);
        if (best.from >= 0 && score >= best.score) return;
        const Sequence& src = seqs[size_t(from)];
        const Sequence& dst = seqs[size_t(to)];
        if (HoldsDocument(dst, src.docs[a], bi)) return;
        if (bi >= 0 && HoldsDocument(src, dst.docs[size_t(bi)], int64_t(a))) return;
        best = Exchange{from, a, to, bi, score};
      };
      for (int32_t from : bins[hi]) {
        const Sequence& src = seqs[size_t(from)];
        for (size_t a = 0; a < src.docs.size(); ++a) {
          const DocPiece& pa = src.docs[a];
          const double ca = cost(pa);
          for (int32_t to : bins[lo]) {
            const Sequence& dst = seqs[size_t(to)];
            if (dst.tokens + pa.len <= capacity) consider(from, a, to, -1, ca);
            for (size_t bi = 0; bi < dst.docs.size(); ++bi) {
              const DocPiece& pb = dst.docs[bi];
              if (dst.tokens - pb.len + pa.len > capacity ||
                  src.tokens - pa.len + pb.len > capacity || SameDocument(pa, pb)) {
                continue;
              }
              consider(from, a, to, int64_t(bi), ca - cost(pb));
            }
          }
        }
      }
      if (best.from < 0) continue;
      Sequence& src = seqs[size_t(best.from)];
      Sequence& dst = seqs[size_t(best.to)];
      DocPiece pa = std::move(src.docs[best.a]);
      src.docs.erase(src.docs.begin() + static_cast<std::ptrdiff_t>(best.a));
      if (best.b >= 0) {
        DocPiece pb = std::move(dst.docs[size_t(best.b)]);
        dst.docs.erase(dst.docs.begin() + static_cast<std::ptrdiff_t>(best.b));
        src.docs.push_back(std::move(pb));
      }
      dst.docs.push_back(std::move(pa));
      for (Sequence* seq : {&src, &dst}) {
        seq->tokens = 0;
        seq->cost = 0;
        for (const DocPiece& d : seq->docs) {
          seq->tokens += d.len;
          seq->cost += cost(d);
        }
      }
      for (size_t r : {hi, lo}) {
        by_load.erase({load[r], static_cast<int32_t>(r)});
        load[r] = 0;
        for (int32_t t : bins[r]) load[r] += seqs[size_t(t)].cost;
        by_load.emplace(load[r], static_cast<int32_t>(r));
      }
      break;
    }
    if (best.from < 0) break;
    ++exchanges;
  }
  return exchanges;
}

}  // namespace braid
