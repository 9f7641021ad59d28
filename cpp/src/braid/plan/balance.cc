#include "braid/plan/balance.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <numeric>
#include <utility>

namespace braid {
namespace {

// A bin of a partial partition. Its items are a linked list over item indices (`Lists`),
// so merging two bins is O(1) and a merge of partitions allocates nothing.
struct Bin {
  double sum = 0;
  int32_t list = 0;  // the list's id: the item that opened it
  int32_t pos = 0;   // tie-break while sorting: the bin's position before the sort
};

// Singly linked lists of items, one per bin, each named by its first item.
struct Lists {
  std::vector<int32_t> next;  // next item in the same list; -1 at the end
  std::vector<int32_t> tail;  // per list id: its last item
  explicit Lists(size_t n) : next(n, -1), tail(n) {
    std::iota(tail.begin(), tail.end(), 0);
  }
  // Appends list `b` to list `a` (a's items first).
  void Append(int32_t a, int32_t b) {
    next[size_t(tail[size_t(a)])] = b;
    tail[size_t(a)] = tail[size_t(b)];
  }
};

// A partial partition: m bins, kept sorted by sum, heaviest first.
struct Partial {
  std::vector<Bin> bins;
  int64_t order = 0;  // tie-break: creation order
  double spread() const { return bins.front().sum - bins.back().sum; }
};

// A key that orders like `cost`, descending: flip the sign bit of a positive double, every
// bit of a negative one, then complement. -0.0 counts as 0.0 (a tie, as in a comparison).
uint64_t DescendingKey(double cost) {
  const uint64_t bits = std::bit_cast<uint64_t>(cost == 0 ? 0.0 : cost);
  const uint64_t ascending = (bits >> 63) != 0 ? ~bits : bits | (uint64_t{1} << 63);
  return ~ascending;
}

// Heaviest first, ties in the current order (what a stable sort gives). Many bins (a
// partition over 1,000 ranks, sorted after every merge) take a stable radix sort on the
// sums' bits, 8 bits a pass, into `*tmp`; both give the same order.
void SortBins(std::vector<Bin>* bins, std::vector<Bin>* tmp) {
  bool sorted = true;
  for (size_t i = 0; i < bins->size(); ++i) {
    (*bins)[i].pos = static_cast<int32_t>(i);
    if (i > 0 && (*bins)[i].sum > (*bins)[i - 1].sum) sorted = false;
  }
  if (sorted) return;
  const size_t n = bins->size();
  if (n < 256) {
    std::sort(bins->begin(), bins->end(), [](const Bin& a, const Bin& b) {
      if (a.sum != b.sum) return a.sum > b.sum;
      return a.pos < b.pos;
    });
    return;
  }
  constexpr int kPasses = 8;
  std::array<std::array<uint32_t, 256>, kPasses> count{};
  for (const Bin& bin : *bins) {
    const uint64_t key = DescendingKey(bin.sum);
    for (int p = 0; p < kPasses; ++p) ++count[size_t(p)][(key >> (8 * p)) & 0xff];
  }
  tmp->resize(n);
  const uint64_t first = DescendingKey(bins->front().sum);
  for (int p = 0; p < kPasses; ++p) {
    auto& c = count[size_t(p)];
    if (c[(first >> (8 * p)) & 0xff] == n) continue;  // every key has this digit
    uint32_t sum = 0;
    for (uint32_t& x : c) sum += std::exchange(x, sum);
    for (const Bin& bin : *bins) {
      (*tmp)[c[(DescendingKey(bin.sum) >> (8 * p)) & 0xff]++] = bin;
    }
    bins->swap(*tmp);
  }
}

// Item indices by cost, heaviest first, ties by index (what a stable sort gives).
// Large inputs (a step's sequences) take a stable radix sort on the costs' bits; both
// give the same order.
std::vector<int32_t> ByCostDescending(const std::vector<double>& costs) {
  const size_t n = costs.size();
  if (n < 1024) {
    std::vector<std::pair<double, int32_t>> keys(n);
    for (size_t i = 0; i < n; ++i) keys[i] = {-costs[i], static_cast<int32_t>(i)};
    std::sort(keys.begin(), keys.end());
    std::vector<int32_t> idx(n);
    for (size_t i = 0; i < n; ++i) idx[i] = keys[i].second;
    return idx;
  }
  std::vector<uint64_t> key(n), key_tmp(n);
  std::vector<int32_t> idx(n), idx_tmp(n);
  for (size_t i = 0; i < n; ++i) {
    key[i] = DescendingKey(costs[i]);
    idx[i] = static_cast<int32_t>(i);
  }
  constexpr int kBits = 11, kPasses = 6;  // 66 >= 64 bits
  constexpr size_t kBuckets = size_t{1} << kBits;
  std::vector<size_t> count(kBuckets * kPasses, 0);
  auto digit = [&](uint64_t k, int pass) {
    return size_t(pass) * kBuckets + ((k >> (pass * kBits)) & (kBuckets - 1));
  };
  for (uint64_t k : key) {
    for (int p = 0; p < kPasses; ++p) ++count[digit(k, p)];
  }
  for (int p = 0; p < kPasses; ++p) {
    if (count[digit(key[0], p)] == n) continue;  // every key has this digit: a no-op
    size_t* c = count.data() + size_t(p) * kBuckets;
    size_t sum = 0;
    for (size_t b = 0; b < kBuckets; ++b) sum += std::exchange(c[b], sum);
    for (size_t i = 0; i < n; ++i) {
      const size_t at = count[digit(key[i], p)]++;
      key_tmp[at] = key[i];
      idx_tmp[at] = idx[i];
    }
    key.swap(key_tmp);
    idx.swap(idx_tmp);
  }
  return idx;
}

std::vector<std::vector<int32_t>> KarmarkarKarp(const std::vector<double>& costs,
                                                int64_t m) {
  const auto sorted = ByCostDescending(costs);
  auto cmp = [](const Partial& a, const Partial& b) {
    if (a.spread() != b.spread()) return a.spread() < b.spread();
    return a.order > b.order;
  };
  // A max-heap by spread over a plain vector, so partials move in and out (what
  // std::priority_queue does, less its copy of top()).
  std::vector<Partial> heap;
  heap.reserve(sorted.size() / size_t(m) + 1);
  auto push = [&](Partial p) {
    heap.push_back(std::move(p));
    std::push_heap(heap.begin(), heap.end(), cmp);
  };
  auto pop = [&] {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    Partial p = std::move(heap.back());
    heap.pop_back();
    return p;
  };
  Lists lists(costs.size());
  std::vector<Bin> tmp;  // SortBins' scratch
  int64_t next_order = 0;
  for (size_t start = 0; start < sorted.size(); start += size_t(m)) {
    Partial p;
    p.order = next_order++;
    p.bins.resize(size_t(m));
    for (int64_t j = 0; j < m; ++j) {
      const int32_t item = sorted[start + size_t(j)];
      p.bins[size_t(j)].sum = costs[size_t(item)];
      p.bins[size_t(j)].list = item;
    }
    SortBins(&p.bins, &tmp);
    push(std::move(p));
  }
  while (heap.size() > 1) {
    Partial a = pop();
    Partial b = pop();
    // a's heaviest bin takes b's lightest, and so on.
    for (int64_t j = 0; j < m; ++j) {
      Bin& dst = a.bins[size_t(j)];
      const Bin& src = b.bins[size_t(m - 1 - j)];
      dst.sum += src.sum;
      lists.Append(dst.list, src.list);
    }
    SortBins(&a.bins, &tmp);
    a.order = next_order++;
    push(std::move(a));
  }
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(m));
  if (!heap.empty()) {
    const size_t per_bin = costs.size() / size_t(m);
    for (int64_t j = 0; j < m; ++j) {
      auto& items = out[size_t(j)];
      items.reserve(per_bin);
      int32_t i = heap.front().bins[size_t(j)].list;
      for (; i >= 0; i = lists.next[size_t(i)]) items.push_back(i);
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> Greedy(const std::vector<double>& costs, int64_t m) {
  const size_t per_bin = costs.size() / size_t(m);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(m));
  for (auto& bin : out) bin.reserve(per_bin);
  // (sum, bin) min-heap over bins that still have room. The lightest bin takes the item
  // and sinks once to its new place (one sift instead of a pop and a push); the order of
  // (sum, bin) is total, so the bin chosen is the one any min-heap gives.
  using Entry = std::pair<double, int64_t>;
  std::vector<Entry> heap(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) heap[size_t(j)] = {0.0, j};  // already a heap
  auto sift_down = [&heap] {
    const size_t n = heap.size();
    const Entry e = heap[0];
    size_t i = 0;
    for (size_t c = 1; c < n; c = 2 * i + 1) {
      if (c + 1 < n && heap[c + 1] < heap[c]) ++c;
      if (!(heap[c] < e)) break;
      heap[i] = heap[c];
      i = c;
    }
    heap[i] = e;
  };
  for (int32_t item : ByCostDescending(costs)) {
    Entry& top = heap.front();
    const size_t bin = size_t(top.second);
    out[bin].push_back(item);
    if (out[bin].size() < per_bin) {
      top.first += costs[size_t(item)];
    } else {
      top = heap.back();
      heap.pop_back();
    }
    if (!heap.empty()) sift_down();
  }
  return out;
}

std::vector<std::vector<int32_t>> InOrder(const std::vector<double>& costs, int64_t m) {
  const size_t per_bin = costs.size() / size_t(m);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(m));
  for (auto& bin : out) bin.reserve(per_bin);
  for (size_t i = 0; i < costs.size(); ++i) {
    out[i / per_bin].push_back(static_cast<int32_t>(i));
  }
  return out;
}

}  // namespace

std::vector<std::vector<int32_t>> PartitionEqualCount(const std::vector<double>& costs,
                                                      int64_t num_bins,
                                                      BalanceAlgorithm algorithm) {
  std::vector<std::vector<int32_t>> bins;
  switch (algorithm) {
    case BalanceAlgorithm::kKarmarkarKarp:
      bins = KarmarkarKarp(costs, num_bins);
      break;
    case BalanceAlgorithm::kGreedy:
      bins = Greedy(costs, num_bins);
      break;
    case BalanceAlgorithm::kNone:
      bins = InOrder(costs, num_bins);
      break;
  }
  for (auto& bin : bins) std::sort(bin.begin(), bin.end());
  return bins;
}

std::vector<int32_t> MiddleHeavyOrder(const std::vector<double>& costs) {
  std::vector<int32_t> out;
  MiddleHeavyOrder(costs, &out);
  return out;
}

void MiddleHeavyOrder(const std::vector<double>& costs, std::vector<int32_t>* order) {
  const int64_t n = static_cast<int64_t>(costs.size());
  // By cost, heaviest first, ties by index. A rank has a few micro-batches: an insertion
  // sort on the stack, no allocation.
  constexpr int64_t kSmall = 64;
  std::array<int32_t, kSmall> small;
  std::vector<int32_t> large;
  const int32_t* sorted = small.data();
  if (n <= kSmall) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t j = i;
      for (; j > 0 && costs[size_t(small[size_t(j - 1)])] < costs[size_t(i)]; --j) {
        small[size_t(j)] = small[size_t(j - 1)];
      }
      small[size_t(j)] = static_cast<int32_t>(i);
    }
  } else {
    large = ByCostDescending(costs);
    sorted = large.data();
  }
  order->resize(costs.size());
  const int64_t center = (n - 1) / 2;
  for (int64_t k = 0; k < n; ++k) {
    // k = 0 -> center, 1 -> center+1, 2 -> center-1, 3 -> center+2, ...
    const int64_t step = (k + 1) / 2;
    int64_t pos = (k % 2 == 1) ? center + step : center - step;
    if (pos >= n) pos = center - step;  // n even: the right side is exhausted first
    if (pos < 0) pos = center + step;
    (*order)[size_t(pos)] = sorted[k];
  }
}

double Imbalance(const std::vector<double>& costs,
                 const std::vector<std::vector<int32_t>>& bins) {
  double max_sum = 0, total = 0;
  for (const auto& bin : bins) {
    double sum = 0;
    for (int32_t i : bin) sum += costs[size_t(i)];
    max_sum = std::max(max_sum, sum);
    total += sum;
  }
  if (bins.empty() || total <= 0) return 1.0;
  return max_sum / (total / static_cast<double>(bins.size()));
}

}  // namespace braid
