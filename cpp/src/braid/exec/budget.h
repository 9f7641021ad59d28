// The source loaders' memory budget: how runtime.memory_bytes is shared by the sources.
//
// One budget for every loader of a job bounds what the loaders decode and hold ahead of
// the planner (queued samples with their payloads, an image payload at its decoded size,
// or, when planning, the bytes their rows decoded to). Each source gets a share in proportion to what it must
// deliver per step (its weight at step 0; equal shares if every weight is 0), capped by
// runtime.read_ahead_bytes; a source always may hold one batch, however small its share
// (docs/decisions.md, 26). The default budget follows
// from the job: per source, (prefetch_steps + 2) steps of its tokens at 4 bytes each, at
// least kMinSourceBytes, summed.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "braid/config/config.h"

namespace braid {

class ReadPool;

/// The least each source contributes to the default budget.
inline constexpr int64_t kMinSourceBytes = int64_t{4} << 20;

/// Each source's fraction of the weights at `step` (config order; weights below 0 count
/// as 0), or all 0 when every weight is 0 there.
std::vector<double> WeightSharesAt(const Config& config, int64_t step);

/// runtime.memory_bytes when set, else the default described above.
int64_t MemoryBudgetBytes(const Config& config);

/// Each source's share of MemoryBudgetBytes (config order), capped by
/// runtime.read_ahead_bytes; at least 1.
std::vector<int64_t> SourceShares(const Config& config);

/// The reader/transform threads of the job: runtime.threads, else the machine's cores.
int64_t ReadThreads(const Config& config);

/// How many threads open the job's sources at once (listing, footers) on `pool`: all of
/// them and the caller, or 1 when a source copies remote files into a local cache (the
/// copies of one process are not made safe against each other).
int64_t OpenThreads(const Config& config, const ReadPool& pool);

}  // namespace braid
