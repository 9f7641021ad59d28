// The embedded runtime: every role of a Braid job inside one process.
//
// An Engine owns one ShardedSource per source (`sources[].loaders` SourceLoaders, merged
// into the source's one order), the ReadPool of `runtime.threads` threads on which every
// loader reads ahead within its share of `runtime.memory_bytes` (exec/budget.h), one
// Planner on a planner thread, and one constructor thread that builds the micro-batches of
// the DP ranks this process serves. The threads hand work through bounded queues
// (runtime.prefetch_steps plans; two steps of micro-batches), so memory stays bounded and
// nothing busy-waits. The engine decides nothing itself: the planner plans, the
// constructor executes.
//
// Micro-batches come out in (step, dp rank, micro-batch) order; with Options::view set,
// each is this trainer rank's view of the micro-batch (TP/PP/CP, construct/views.h).
// Several processes that each embed an Engine compute the same global plan (it is
// deterministic) and each builds only its own ranks: once a step is planned, the engine
// wants the payloads of its own pieces (PayloadRef::Want), so image decoding, which is
// done on demand (source/source_loader.h), happens for those alone.
//
// Thread-compatible: call Next() and StateJson() from one thread; the destructor stops and
// joins every thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "braid/client/topology.h"
#include "braid/config/config.h"
#include "braid/construct/batch.h"
#include "braid/plan/planner.h"
#include "braid/source/sharded_source.h"
#include "braid/source/source_loader.h"
#include "braid/status.h"
#include "braid/exec/bounded_queue_internal.h"

namespace braid {

class Engine {
 public:
  struct Options {
    /// The DP ranks (buckets, topology.buckets(); == DP ranks by default) whose
    /// micro-batches this process builds; empty means all.
    std::vector<int64_t> dp_ranks;
    /// A state from StateJson() (or `braid plan --state-out`); empty starts fresh.
    std::string state_json;
    /// Called on the planner thread with every plan, before its batches are built.
    std::function<void(const StepPlan&)> on_plan;
    /// This trainer rank's coordinates; those of the distributed dimensions (dp, by
    /// default) are ignored: each micro-batch's own bucket is used (WithBucket). When set, Next() returns the rank's view of every
    /// micro-batch (construct/views.h), made on the constructor thread from the one
    /// build; unset, Next() returns the DP group's whole micro-batch, and a process that
    /// serves several ranks of the group calls ViewFor() on it once per rank.
    std::optional<RankCoords> view;
    /// With `view` and topology.cp > 1: false hands every CP rank the whole sequences
    /// (for trainers that split for CP themselves, e.g. Megatron's get_batch).
    bool split_context = true;
  };

  /// Opens every source and starts the threads. Fails on a bad state (key "state"), a bad
  /// source (its file), or a dp rank or view coordinate outside the topology ("rank").
  static Result<std::unique_ptr<Engine>> Make(const Config& config, Options options);
  ~Engine();

  /// The next micro-batch; blocks until it is built. Returns the first error any role hit.
  Result<std::shared_ptr<const Batch>> Next();

  /// The views of the next micro-batch for several trainer ranks of its DP group
  /// (coordinates' dp is ignored), from one build: TP/PP views share its buffers. Fails
  /// (config error naming "rank") with Options::view set or coordinates outside the
  /// topology, else as Next().
  Result<std::vector<std::shared_ptr<const Batch>>> NextViews(
      const std::vector<RankCoords>& coords);

  /// The state right after the last micro-batch Next() returned: resuming from it
  /// continues the stream exactly there.
  std::string StateJson() const;

  /// Per source, payloads blanked after their metadata was published (an image whose
  /// body did not decode, on_error: skip). Thread-safe.
  std::vector<int64_t> blanked_payloads() const;

  /// Per source, files skipped so far under on_error: skip, in whole or part (a footer
  /// or a row group that did not read; found when read, read-ahead included).
  /// Thread-safe.
  std::vector<int64_t> skipped_files() const;
  /// Per source, those of skipped_files() whose footer did not read: their rows are
  /// unknown and not among the skipped samples. Thread-safe.
  std::vector<int64_t> unreadable_files() const;

  /// Micro-batches per step that this process receives.
  int64_t local_micro_batches_per_step(int64_t step) const;

  /// Stops and joins every thread (what the destructor does), e.g. on SIGTERM. Later
  /// Next() calls return Cancelled; StateJson() still describes the last micro-batch
  /// returned. Idempotent. A Next() blocked on another thread returns Cancelled.
  void Stop();

 private:
  struct PlanItem {
    Status status;
    std::shared_ptr<const StepPlan> plan;
  };
  struct BatchItem {
    Status status;
    std::shared_ptr<const StepPlan> plan;
    std::shared_ptr<const Batch> batch;
    int64_t local_index = 0;  // among this process's micro-batches of the step
  };

  Engine(const Config& config, Options options);
  void PlannerLoop();
  // Starts the on-demand payloads (image decodes) of the pieces this process builds; the
  // other processes' pieces are never decoded here.
  void WantOwnPayloads(const StepPlan& plan) const;
  void ConstructorLoop();
  Result<Batch> View(Batch batch) const;  // options_.view's view of a built batch

  const Config config_;
  Options options_;
  PlannerState start_state_;
  int64_t skip_first_ = 0;  // micro-batches of the first step already consumed
  std::shared_ptr<ReadPool> pool_;  // the loaders' threads; outlives them (shared)
  std::vector<std::unique_ptr<ShardedSource>> loaders_;  // sources[].loaders each
  std::unique_ptr<Planner> planner_;
  internal::BoundedQueue<PlanItem> plans_;
  internal::BoundedQueue<BatchItem> batches_;
  std::thread planner_thread_, constructor_thread_;
  // What the client has received, for StateJson().
  std::shared_ptr<const StepPlan> last_plan_;
  int64_t last_index_ = -1;
  Status failed_;
};

}  // namespace braid
