// braid/loader.h: one trainer rank's stream of micro-batches, from a C++ program.
//
// A Loader is the embedded runtime behind a small face: Make() opens every source of the
// job and starts planning and building in this process (docs/architecture.md, "One
// micro-batch on the embedded runtime"); Next() returns the rank's micro-batches in
// (step, micro-batch) order, each its view for the rank's TP/PP/CP coordinates;
// StateJson() is the position after the last one, from which Make() continues the stream
// exactly. Every rank computes the same global plan (it is deterministic), so ranks need
// not talk to each other; each builds only its own bucket.
//
// Its background work (a read pool of runtime.threads threads, a planner thread, a
// build thread) belongs to the Loader and ends with Stop() or the destructor.
//
// Thread-compatible: call Next() and StateJson() from one thread at a time. Stop() and
// the destructor may run on any thread, also while Next() blocks on another.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "braid/batch.h"
#include "braid/config.h"
#include "braid/status.h"

namespace braid {

/// A trainer rank's place in the topology (docs/parallelism.md).
struct RankCoordinates {
  int64_t dp = 0, tp = 0, pp = 0, cp = 0;
};

class Loader {
 public:
  struct Options {
    /// The trainer rank (torch.distributed's RANK), in topology.order: by default
    /// Megatron's, rank = tp + TP * (cp + CP * (dp + DP * pp)). Ignored with
    /// `coordinates`.
    int64_t rank = 0;
    /// The world size (WORLD_SIZE) to check against the topology's dp*tp*pp*cp; 0: not
    /// checked.
    int64_t world_size = 0;
    /// The rank given by its coordinates instead of `rank`.
    std::optional<RankCoordinates> coordinates;
    /// A state from StateJson() (or `braid plan --state-out`); empty: the stream's start.
    std::string state_json;
    /// With topology.cp > 1: false hands every CP rank the whole sequences (for trainers
    /// that split for context parallelism themselves, e.g. Megatron's get_batch).
    bool split_context = true;
  };

  /// Opens the job's sources and starts its work for the rank in `options`. Fails with
  /// Invalid naming "world_size" (a world size that is not the topology's), "rank" (a
  /// rank or coordinates outside the topology), "state" (a state of another config: seed,
  /// sources or sequence shape), or "runtime.kind" (runtime.kind: ray, which the Python
  /// package serves); with Invalid or IOError naming the file of a source that does not
  /// open.
  static Result<std::unique_ptr<Loader>> Make(const JobConfig& config, Options options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// The rank's next micro-batch; blocks until it is built. The batch is shared and
  /// immutable; holding it keeps its storage alive, past the Loader too. Returns the
  /// first error any part of the job hit (a DataError naming the file, row group and row;
  /// an IOError from storage), then the same on every later call; Cancelled after Stop().
  Result<std::shared_ptr<const Batch>> Next();

  /// The state (JSON) right after the last micro-batch Next() returned, or the start
  /// state before the first. Options::state_json of a new Loader for the same rank
  /// continues the stream exactly there (the state also holds the planner's position,
  /// checked against the config's fingerprint). Cheap.
  std::string StateJson() const;

  /// Stops the background work and joins its threads (what the destructor does). Later
  /// Next() calls return Cancelled, and a Next() blocked on another thread returns
  /// Cancelled; StateJson() still describes the last micro-batch returned. Idempotent.
  void Stop();

  /// The rank this Loader serves, and its coordinates.
  int64_t rank() const;
  RankCoordinates coordinates() const;
  /// The bucket whose micro-batches the rank receives (its DP rank, by default).
  int64_t bucket() const;
  /// Micro-batches the rank receives at global step `step` (a phase may change it).
  int64_t MicroBatchesAt(int64_t step) const;

 private:
  class Impl;
  explicit Loader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;  // INVARIANT: non-null
};

}  // namespace braid
