#include "braid/exec/budget.h"

#include <algorithm>
#include <cmath>

#include "braid/exec/read_pool.h"

namespace braid {
namespace {

// Normalized weights at step 0 (equal when they are all 0).
std::vector<double> Shares(const Config& config) {
  std::vector<double> w = WeightSharesAt(config, 0);
  if (std::all_of(w.begin(), w.end(), [](double x) { return x <= 0; })) {
    std::fill(w.begin(), w.end(), 1.0 / double(w.size()));
  }
  return w;
}

}  // namespace

std::vector<double> WeightSharesAt(const Config& config, int64_t step) {
  const size_t n = config.sources.size();
  std::vector<double> w(n, 0.0);
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += (w[i] = std::max(0.0, config.WeightAt(i, step)));
  if (total > 0) {
    for (double& x : w) x /= total;
  }
  return w;
}

int64_t MemoryBudgetBytes(const Config& config) {
  if (config.runtime.memory_bytes > 0) return config.runtime.memory_bytes;
  const std::vector<double> share = Shares(config);
  const double steps = static_cast<double>(config.runtime.prefetch_steps + 2);
  const double step_bytes = static_cast<double>(config.batch.global_tokens) * 4.0;
  int64_t total = 0;
  for (double s : share) {
    total += std::max(kMinSourceBytes, static_cast<int64_t>(std::ceil(steps * s * step_bytes)));
  }
  return total;
}

std::vector<int64_t> SourceShares(const Config& config) {
  const int64_t budget = MemoryBudgetBytes(config);
  std::vector<int64_t> out;
  for (double s : Shares(config)) {
    const auto bytes = static_cast<int64_t>(s * static_cast<double>(budget));
    out.push_back(std::max<int64_t>(1, std::min(bytes, config.runtime.read_ahead_bytes)));
  }
  return out;
}

int64_t ReadThreads(const Config& config) {
  return config.runtime.threads > 0 ? config.runtime.threads : ReadPool::DefaultThreads();
}

int64_t OpenThreads(const Config& config, const ReadPool& pool) {
  for (const auto& s : config.sources) {
    if (!s.cache_dir.empty()) return 1;
  }
  return pool.threads() + 1;
}

}  // namespace braid
