// The embedded runtime: every role of a Braid job inside one process.
//
// An Engine composes the three services over the in-process transport
// (transport/in_process.h): a PlannerService that draws from the job's SourceServices
// (their streams carry the payloads: `sources[].loaders` loaders per source, on one pool
// of `runtime.threads` threads, within `runtime.memory_bytes`), planning
// runtime.prefetch_steps steps ahead on a thread of its own; and a ConstructorService that
// builds the micro-batches of the buckets this process serves, steps_in_flight steps
// ahead, from the plans themselves (payload handles, no copy). The engine decides
// nothing: the planner plans, the constructor builds, the client's RankCursor says which
// micro-batch comes next and what state follows it.
//
// Micro-batches come out in (step, bucket, micro-batch) order; with Options::view set,
// each is this trainer rank's view of the micro-batch (TP/PP/CP, construct/views.h).
// Several processes that each embed an Engine compute the same global plan (it is
// deterministic) and each builds only its own buckets: once a step is planned, the engine
// wants the payloads of its own pieces (PayloadRef::Want), so image decoding, which is
// done on demand (source/source_loader.h), happens for those alone.
//
// Thread-compatible: call Next() and StateJson() from one thread; Stop() and the
// destructor from any.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "braid/batch.h"
#include "braid/client/topology.h"
#include "braid/config/config.h"
#include "braid/exec/allocation.h"
#include "braid/service/profile_timeline.h"
#include "braid/plan/step_plan.h"
#include "braid/source/profile.h"
#include "braid/status.h"

namespace braid {

class Engine {
 public:
  struct Options {
    /// The buckets (DP ranks by default, topology.buckets()) whose micro-batches this
    /// process builds, in the order it receives them each step; empty means all.
    std::vector<int64_t> buckets;
    /// A state from StateJson() (or `braid plan --state-out`); empty starts fresh.
    std::string state_json;
    /// Called on the planner thread with every plan, before its batches are built.
    std::function<void(const StepPlan&)> on_plan;
    /// This trainer rank's coordinates; those of the distributed dimensions (dp, by
    /// default) are ignored: each micro-batch's own bucket is used (WithBucket). When
    /// set, Next() returns the rank's view of every micro-batch (construct/views.h), made
    /// from the one build; unset, Next() returns the bucket's whole micro-batch, and a
    /// process that serves several ranks of the group calls NextViews().
    std::optional<RankCoords> view;
    /// With `view` and topology.cp > 1: false hands every CP rank the whole sequences
    /// (for trainers that split for CP themselves, e.g. Megatron's get_batch).
    bool split_context = true;
    /// Called about every 100 ms by Next() while it waits, on its thread (a binding
    /// checks for signals there). A non-OK status ends that Next() with it and nothing
    /// else: the micro-batch stays next, and the next call waits for it again.
    std::function<Status()> interrupt;
    /// With `view` in a topology of several ranks per DP group: the folder where this
    /// node's peers of the group share their builds (transport/node_builds.h); empty:
    /// NodeBuildsFolder, from the launcher's environment (no run named there: each
    /// process builds its own).
    std::string share_builds_dir;
  };

  /// Opens every source and starts planning. Fails on a bad state (key "state"), a bad
  /// source (its file), or a bucket or view coordinate outside the topology ("rank").
  static Result<std::unique_ptr<Engine>> Make(const Config& config, Options options);
  ~Engine();

  /// The next micro-batch; blocks until it is built. Returns the first error any role
  /// hit, then again on every later call; or what Options::interrupt returned (then the
  /// stream has not moved).
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

  /// Per source, what loading it has cost this process so far (source/profile.h): CPU
  /// of its read steps and deferred payloads, bytes read, samples and tokens produced.
  /// Thread-safe.
  std::vector<SourceProfile> source_profiles() const;
  /// The sources' shares of threads and memory each time runtime.autoscale changed
  /// them (service/planner_service.h); empty with autoscale off. Thread-safe.
  std::vector<ShareChange> share_changes() const;
  /// What each source cost and how long planning waited on it, per span of steps
  /// (service/profile_timeline.h). Thread-safe.
  std::vector<ProfileSpan> source_timeline() const;
  /// Per source, payloads blanked after their metadata was published (an image whose
  /// body did not decode, on_error: skip). Thread-safe.
  std::vector<int64_t> blanked_payloads() const;
  /// Builds of this process's buckets taken from a peer's (Options::share_builds_dir),
  /// not built here.
  int64_t shared_builds() const;
  /// Per source, files skipped so far under on_error: skip, in whole or part (a footer
  /// or a row group that did not read; found when read, read-ahead included).
  /// Thread-safe.
  std::vector<int64_t> skipped_files() const;
  /// Per source, those of skipped_files() that did not open: their rows are
  /// unknown and not among the skipped samples. Thread-safe.
  std::vector<int64_t> unreadable_files() const;

  /// Micro-batches per step that this process receives.
  int64_t local_micro_batches_per_step(int64_t step) const;

  /// Stops every role and joins their threads (what the destructor does), e.g. on
  /// SIGTERM. Later Next() calls return Cancelled; StateJson() still describes the last
  /// micro-batch returned. Idempotent. A Next() blocked on another thread returns
  /// Cancelled.
  void Stop();

 private:
  class Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace braid
