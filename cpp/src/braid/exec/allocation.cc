#include "braid/exec/allocation.h"

#include <algorithm>
#include <cmath>

#include "braid/exec/budget.h"

namespace braid {

int64_t AllocationLookahead(const Config& config) {
  return config.runtime.prefetch_steps + config.runtime.steps_in_flight + 2;
}

std::vector<SourceShare> UniformAllocation(const Config& config) {
  const std::vector<int64_t> bytes = SourceShares(config);
  std::vector<SourceShare> out(config.sources.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].workers = std::max<int64_t>(1, config.sources[i].workers);
    out[i].read_ahead_bytes = bytes[i];
  }
  return out;
}

std::vector<SourceShare> AllocateSources(const Config& config, int64_t step,
                                         const std::vector<SourceProfile>& profiles,
                                         int64_t threads, int64_t budget_bytes,
                                         const std::vector<SourceShare>& previous) {
  const size_t n = config.sources.size();
  threads = std::max<int64_t>(1, threads);
  budget_bytes = std::max<int64_t>(1, budget_bytes);
  // The largest fraction of a step each source is owed over the horizon.
  std::vector<double> share(n, 0.0);
  const int64_t end = step + AllocationLookahead(config);
  for (int64_t t = std::max<int64_t>(0, step); t <= end; ++t) {
    const std::vector<double> w = WeightSharesAt(config, t);
    for (size_t i = 0; i < n; ++i) share[i] = std::max(share[i], w[i]);
  }
  double active_share = 0;
  for (double s : share) active_share += s;
  if (active_share <= 0) return UniformAllocation(config);  // nothing drawn: as if off

  // CPU of read steps per token, measured; unmeasured sources at the measured mean.
  std::vector<double> cost(n, -1.0);
  double known = 0;
  int64_t measured = 0;
  for (size_t i = 0; i < n && i < profiles.size(); ++i) {
    const SourceProfile& p = profiles[i];
    if (p.samples < kMinProfiledSamples || p.tokens <= 0) continue;
    cost[i] = 1e-9 * double(p.read_cpu_ns) / double(p.tokens);
    known += cost[i];
    ++measured;
  }
  const double mean_cost = measured > 0 ? known / double(measured) : 0.0;
  std::vector<double> demand(n, 0.0);
  double total_demand = 0;
  for (size_t i = 0; i < n; ++i) {
    demand[i] = share[i] * (cost[i] >= 0 ? cost[i] : mean_cost);
    total_demand += demand[i];
  }

  std::vector<SourceShare> out(n);
  for (size_t i = 0; i < n; ++i) {
    SourceShare& s = out[i];
    const int64_t floor = std::max<int64_t>(1, config.sources[i].workers);
    if (share[i] <= 0) {
      s.active = false;
      s.workers = 0;
      // Sizes the one batch it reads when asked (a quarter of this).
      s.read_ahead_bytes = std::min(config.runtime.read_ahead_bytes, kMinSourceBytes);
      continue;
    }
    const auto bytes =
        static_cast<int64_t>(share[i] / active_share * double(budget_bytes));
    s.read_ahead_bytes =
        std::max<int64_t>(1, std::min(bytes, config.runtime.read_ahead_bytes));
    s.workers = floor;
    if (total_demand > 0) {
      const double want = double(threads) * demand[i] / total_demand;
      int64_t workers = static_cast<int64_t>(std::ceil(want - 1e-9));
      if (i < previous.size() && previous[i].active && previous[i].workers > 0) {
        const auto held = double(previous[i].workers);
        if (want > held - 1.0 - kWorkerHysteresis && want <= held + kWorkerHysteresis) {
          workers = previous[i].workers;
        }
      }
      s.workers = std::clamp<int64_t>(workers, floor, std::max(floor, threads));
    }
  }
  return out;
}

}  // namespace braid
