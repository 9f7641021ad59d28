// Cross-field checks of a parsed Config (config.h): the batch shape against the topology
// tree and the phases, context-parallel slicing, and weights that leave every step some
// source. ParseConfig ends with ValidateConfig; code that changes a Config re-checks it
// (SetDataParallel, the data plane's builder).
//
// Thread-safe: pure functions of the Config.
#include <algorithm>
#include <limits>
#include <optional>

#include "braid/config/config.h"
#include "braid/config/config_internal.h"
#include "braid/config/limits_internal.h"

namespace braid {

using internal::Index;
using internal::Product;

Status CheckTopology(const Topology& t) {
  if (!Product({t.dp, t.tp, t.pp, t.cp})) {
    return ConfigError("topology", "dp * tp * pp * cp must be at most 2^63 - 1");
  }
  bool seen[4] = {false, false, false, false};
  for (size_t i = 0; i < t.order.size(); ++i) {
    const int d = static_cast<int>(t.order[i]);
    if (seen[d]) {
      return ConfigError(
          Index("topology.order", i),
          std::string("'") + ToString(t.order[i]) +
              "' appears twice (the order lists dp, tp, pp and cp once each)");
    }
    seen[d] = true;
  }
  int64_t slots = 1;
  for (Dim d : t.order) slots *= t.distributed(d) ? t.size(d) : 1;
  if (t.group <= 0 || slots % t.group != 0) {
    return ConfigError("topology.distribute.group",
                       "must divide the ranks that receive different buckets (" +
                           std::to_string(slots) + "), got " + std::to_string(t.group));
  }
  return Status::OK();
}

Status ValidateConfig(const Config& c) {
  const auto& b = c.batch;
  if (b.global_tokens % b.seq_len != 0) {
    return ConfigError("batch.global_tokens",
                       "must be a multiple of batch.seq_len (" +
                           std::to_string(b.seq_len) + "), got " +
                           std::to_string(b.global_tokens));
  }
  ARROW_RETURN_NOT_OK(CheckTopology(c.topology));
  const int64_t per_step = b.global_tokens / b.seq_len;
  // CheckTopology bounds the buckets; products beyond int64 cannot divide global_tokens.
  const std::optional<int64_t> group_or =
      Product({c.topology.buckets(), b.micro_batch_size});
  auto group_tokens = [&](int64_t seq_len) {
    const auto v = group_or ? Product({*group_or, seq_len}) : std::nullopt;
    return v ? std::to_string(*v) : std::string("more than 2^63 - 1");
  };
  const int64_t group = group_or.value_or(std::numeric_limits<int64_t>::max());
  // Named as the user knows it: topology.dp unless distribute makes other buckets.
  const std::string buckets =
      c.topology.distribute == Topology::Axis::kDp && c.topology.group == 1
          ? "topology.dp"
          : "the buckets of topology.distribute (" +
                std::to_string(c.topology.buckets()) + ")";
  if (!group_or || per_step % group != 0) {
    return ConfigError("batch.global_tokens",
                       "must be a multiple of " + buckets +
                           " * batch.micro_batch_size * batch.seq_len (" +
                           group_tokens(b.seq_len) + "), got " +
                           std::to_string(b.global_tokens));
  }
  // Each phase's seq_len (docs/planner.md) must divide the batch as batch.seq_len does.
  for (size_t i = 0; i < c.phases.size(); ++i) {
    const std::string path = "phases[" + std::to_string(i) + "].seq_len";
    const int64_t L = c.phases[i].seq_len;
    if (b.global_tokens % L != 0 || (b.global_tokens / L) % group != 0) {
      return ConfigError(path, "batch.global_tokens (" + std::to_string(b.global_tokens) +
                                   ") must be a multiple of " + buckets +
                                   " * batch.micro_batch_size * seq_len (" +
                                   group_tokens(L) + ")");
    }
  }
  // Context parallelism (construct/views.h, docs/parallelism.md): every sequence splits
  // into 2*cp equal chunks, in every phase.
  if (c.topology.slices_context()) {
    // cp <= 2^62 would be needed for 2 * cp to fit; no sequence is that long anyway.
    const int64_t parts = c.topology.cp > (int64_t{1} << 62) ? 0 : 2 * c.topology.cp;
    for (size_t i = 0; i <= c.phases.size(); ++i) {
      const bool base = i == c.phases.size();
      const int64_t L = base ? b.seq_len : c.phases[i].seq_len;
      if (parts == 0 || L % parts != 0) {
        const std::string key =
            base ? "batch.seq_len" : "phases[" + std::to_string(i) + "].seq_len";
        return ConfigError(key, "must be a multiple of 2 * topology.cp (" +
                                    (parts == 0 ? std::string("more than 2^63 - 1")
                                                : std::to_string(parts)) +
                                    ") to split sequences for context parallelism, got " +
                                    std::to_string(L));
      }
    }
  }
  // Padding (batch.pad_to_multiple_of): the planner works in blocks of that many tokens
  // (plan/planner.h), so every token count it cuts at must be whole blocks.
  if (const int64_t m = b.pad_to_multiple_of; m > 1) {
    for (size_t i = 0; i <= c.phases.size(); ++i) {
      const bool base = i == c.phases.size();
      const int64_t L = base ? b.seq_len : c.phases[i].seq_len;
      if (L % m != 0) {
        return ConfigError(
            base ? "batch.seq_len" : "phases[" + std::to_string(i) + "].seq_len",
            "must be a multiple of batch.pad_to_multiple_of (" + std::to_string(m) +
                "), got " + std::to_string(L));
      }
    }
    if (c.balance.max_piece % m != 0) {
      return ConfigError("balance.max_piece",
                         "must be a multiple of batch.pad_to_multiple_of (" +
                             std::to_string(m) + "), got " +
                             std::to_string(c.balance.max_piece));
    }
    for (size_t i = 0; i < c.sources.size(); ++i) {
      if (!c.sources[i].image_column.empty()) {
        return ConfigError("sources[" + std::to_string(i) + "].image_column",
                           "images are not planned with batch.pad_to_multiple_of > 1 "
                           "(text sources only)");
      }
    }
  }
  // Weights may be 0 for a while, but some source must have weight at every step.
  std::vector<int64_t> steps{0};
  for (const auto& s : c.sources) {
    for (const auto& [step, w] : s.weight.points) steps.push_back(step);
  }
  for (const auto& p : c.phases) {  // planner: phase boundaries and override points
    steps.push_back(p.until_step);
    if (p.until_step > 0) steps.push_back(p.until_step - 1);
    for (const auto& w : p.weights) {
      if (!w) continue;
      for (const auto& [step, v] : w->points) steps.push_back(step);
    }
  }
  // Each step once, smallest first; a step is fine as soon as one source has weight.
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  for (int64_t step : steps) {
    bool any = false;
    for (size_t k = 0; k < c.sources.size() && !any; ++k) any = c.WeightAt(k, step) > 0;
    if (!any) {
      return ConfigError(c.PhaseAt(step) ? "phases" : "sources",
                         "all weights are 0 at step " + std::to_string(step));
    }
  }
  return Status::OK();
}

Status SetDataParallel(Config* config, int64_t dp) {
  if (dp <= 0) return ConfigError("--dp", "must be > 0");
  config->topology.dp = dp;
  return ValidateConfig(*config);
}

}  // namespace braid
