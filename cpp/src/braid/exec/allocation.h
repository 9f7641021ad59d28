// The auto-partitioning decision: how the job's read threads and memory budget are shared
// by its sources at a step, from what each source costs and what the mix asks of it over
// the steps ahead (runtime.autoscale, docs/sources.md "Auto-partitioning").
//
// Inputs: the sources' weights at every step of the horizon [step, step + lookahead]
// (schedules and phases are known ahead), each source's measured cost (source/profile.h:
// the CPU of its read steps per token, the part that more worker threads parallelize),
// the pool's threads and the memory budget (exec/budget.h). Per source:
//
// - its horizon share: the largest fraction of a step's tokens it is owed at any step of
//   the horizon, so a source is scaled up `lookahead` steps before its weight rises and
//   keeps its resources until its weight has fallen for that long;
// - active: a horizon share above 0. An inactive source reads nothing ahead and holds no
//   thread: a source of weight 0 costs its cursor until its weight is about to rise;
// - read-ahead: the memory budget divided in proportion to the active sources' horizon
//   shares, capped by runtime.read_ahead_bytes;
// - workers (pool threads its transform loop may use): threads in proportion to its
//   demand, horizon share x CPU per token, rounded up, at least `sources[].workers`, at
//   most the pool's threads. A source whose cost is not yet measured (fewer than
//   kMinProfiledSamples samples) is priced at the mean of those measured; with none
//   measured, every source keeps its configured workers.
// - hysteresis: given the allocation in force (`previous`), an active source keeps its
//   workers while its demand in threads stays within kWorkerHysteresis of the band that
//   gave them (above workers - 1 - h, at most workers + h), so costs measured while
//   running do not flip a source between two counts from step to step.
//
// Workers above a source's need cost nothing: a transform loop's helpers are pool threads
// that are free (exec/read_pool.h ParallelFor), so the decision needs relative demand
// only, not the trainers' consumption rate. Deferred payloads (image decodes) are one
// pool task each and need no workers. None of this changes the sample stream
// (source/source_loader.h: the stream is the same for any worker count and read-ahead).
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "braid/config/config.h"
#include "braid/source/profile.h"

namespace braid {

/// One source's share of the job's threads and memory.
struct SourceShare {
  /// Pool threads the source's transform loop may use (0 when inactive).
  int64_t workers = 1;
  /// Bytes it reads ahead of the planner (the batch size follows from it).
  int64_t read_ahead_bytes = 0;
  /// False: the source reads only what is asked of it (one batch at a time), nothing
  /// ahead, and a source not yet started is not started.
  bool active = true;
  bool operator==(const SourceShare&) const = default;
};

/// The sources' shares from the planning of `step` on (a change log's entry).
struct ShareChange {
  int64_t step = 0;
  std::vector<SourceShare> shares;  ///< per source, config order
};

/// Samples a source must have produced before its measured cost is used.
inline constexpr int64_t kMinProfiledSamples = 32;

/// How far (in threads) a source's demand must leave the band of its current workers
/// before they change.
inline constexpr double kWorkerHysteresis = 0.25;

/// The steps ahead the decision looks at: what the job reads before a step is consumed
/// (prefetch_steps + steps_in_flight + 2).
int64_t AllocationLookahead(const Config& config);

/// Each source's share (config order) for planning `step`, as the header says.
/// `profiles` is per source in config order (missing entries: not measured); `threads`
/// >= 1 and `budget_bytes` >= 1 are the pool's size and the job's memory budget;
/// `previous`, the allocation in force (empty: none), damps the workers' changes.
std::vector<SourceShare> AllocateSources(const Config& config, int64_t step,
                                         const std::vector<SourceProfile>& profiles,
                                         int64_t threads, int64_t budget_bytes,
                                         const std::vector<SourceShare>& previous = {});

/// The fixed allocation of runtime.autoscale: false (and of a job's start before any
/// step is planned): every source active, its configured workers, the budget shared by
/// the weights at step 0 (exec/budget.h SourceShares).
std::vector<SourceShare> UniformAllocation(const Config& config);

}  // namespace braid
