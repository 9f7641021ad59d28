#include "braid/plan/balance.h"

#include <algorithm>
#include <numeric>
#include <queue>

namespace braid {
namespace {

struct Bin {
  double sum = 0;
  std::vector<int32_t> items;
};

// A partial partition: m bins, kept sorted by sum, heaviest first.
struct Partial {
  std::vector<Bin> bins;
  int64_t order = 0;  // tie-break: creation order
  double spread() const { return bins.front().sum - bins.back().sum; }
};

// Heaviest first, ties in the current order (a stable sort), moving each bin once.
void SortBins(std::vector<Bin>* bins) {
  std::vector<std::pair<double, int32_t>> keys(bins->size());
  bool sorted = true;
  for (size_t i = 0; i < bins->size(); ++i) {
    keys[i] = {-(*bins)[i].sum, static_cast<int32_t>(i)};
    if (i > 0 && keys[i].first < keys[i - 1].first) sorted = false;
  }
  if (sorted) return;
  std::sort(keys.begin(), keys.end());
  std::vector<Bin> out;
  out.reserve(bins->size());
  for (const auto& k : keys) out.push_back(std::move((*bins)[size_t(k.second)]));
  *bins = std::move(out);
}

// Item indices by cost, heaviest first, ties by index (what a stable sort gives).
std::vector<int32_t> ByCostDescending(const std::vector<double>& costs) {
  std::vector<std::pair<double, int32_t>> keys(costs.size());
  for (size_t i = 0; i < costs.size(); ++i) keys[i] = {-costs[i], static_cast<int32_t>(i)};
  std::sort(keys.begin(), keys.end());
  std::vector<int32_t> idx(costs.size());
  for (size_t i = 0; i < keys.size(); ++i) idx[i] = keys[i].second;
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
  int64_t next_order = 0;
  for (size_t start = 0; start < sorted.size(); start += size_t(m)) {
    Partial p;
    p.order = next_order++;
    p.bins.resize(size_t(m));
    for (int64_t j = 0; j < m; ++j) {
      const int32_t item = sorted[start + size_t(j)];
      p.bins[size_t(j)].sum = costs[size_t(item)];
      p.bins[size_t(j)].items.push_back(item);
    }
    SortBins(&p.bins);
    push(std::move(p));
  }
  while (heap.size() > 1) {
    Partial a = pop();
    Partial b = pop();
    // a's heaviest bin takes b's lightest, and so on.
    for (int64_t j = 0; j < m; ++j) {
      Bin& dst = a.bins[size_t(j)];
      Bin& src = b.bins[size_t(m - 1 - j)];
      dst.sum += src.sum;
      dst.items.insert(dst.items.end(), src.items.begin(), src.items.end());
    }
    SortBins(&a.bins);
    a.order = next_order++;
    push(std::move(a));
  }
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(m));
  if (!heap.empty()) {
    Partial& final_partition = heap.front();
    for (int64_t j = 0; j < m; ++j) {
      out[size_t(j)] = std::move(final_partition.bins[size_t(j)].items);
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> Greedy(const std::vector<double>& costs, int64_t m) {
  const size_t per_bin = costs.size() / size_t(m);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(m));
  // (sum, bin) min-heap over bins that still have room.
  using Entry = std::pair<double, int64_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (int64_t j = 0; j < m; ++j) heap.emplace(0.0, j);
  for (int32_t item : ByCostDescending(costs)) {
    auto [sum, bin] = heap.top();
    heap.pop();
    out[size_t(bin)].push_back(item);
    if (out[size_t(bin)].size() < per_bin) heap.emplace(sum + costs[size_t(item)], bin);
  }
  return out;
}

std::vector<std::vector<int32_t>> InOrder(const std::vector<double>& costs, int64_t m) {
  const size_t per_bin = costs.size() / size_t(m);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(m));
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
  const auto sorted = ByCostDescending(costs);
  const int64_t n = static_cast<int64_t>(costs.size());
  std::vector<int32_t> out(costs.size());
  const int64_t center = (n - 1) / 2;
  for (int64_t k = 0; k < n; ++k) {
    // k = 0 -> center, 1 -> center+1, 2 -> center-1, 3 -> center+2, ...
    const int64_t step = (k + 1) / 2;
    int64_t pos = (k % 2 == 1) ? center + step : center - step;
    if (pos >= n) pos = center - step;  // n even: the right side is exhausted first
    if (pos < 0) pos = center + step;
    out[size_t(pos)] = sorted[size_t(k)];
  }
  return out;
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
