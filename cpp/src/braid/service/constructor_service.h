// The data constructor role as a service: builds each (step, bucket)'s micro-batches once
// and serves every trainer rank of the bucket's group its view of them.
//
// A ConstructorService reaches the other roles through two ports a runtime implements:
//   PlanSource   a step's plan (in process: the plan itself, payload handles attached;
//                across processes: its wire message, the slice of the buckets asked for)
//   PieceSource  the tokens of planned pieces by key, from the host that serves each
//                source (a SourceService in this process or another one); asynchronous,
//                so the pieces of one build are asked of every host at once
// and decides everything else: which plans to ask for (each step once, for every bucket
// its ranks have asked for so far), building steps_in_flight steps ahead of the newest
// step asked for, oldest first, on its own build threads; attaching fetched pieces and
// decoding their images (AttachPieces: on_error: skip blanks, logged and counted);
// hedging a slow or unreachable host by asking its standby (Options::standby: after four
// times the host's usual answer time, or at once when it is unreachable; the first good
// answer wins, both are the same bytes); keeping builds and views keep_steps behind the
// newest step asked for, or sooner, once every rank of the bucket was served them
// (Options::receivers; a rank that asks again gets them built again, the same bytes);
// making each view once for every rank that receives it (TP peers share one).
//
// The window of builds, plans and views is a ConstructorServiceState, changed only by
// its Apply (tested without a runtime).
//
// Thread-safe. Stop() (or the destructor) ends the builds; waiting View() calls return
// Cancelled.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "braid/batch.h"
#include "braid/config/config.h"
#include "braid/service/planner_service_state.h"
#include "braid/service/wire.h"
#include "braid/status.h"

namespace braid {

/// How a constructor receives plans. Thread-safe: called from the build threads.
class PlanSource {
 public:
  virtual ~PlanSource() = default;
  /// Step `step`'s plan, holding at least `buckets` (ascending). Blocks; fails with the
  /// planner's error, or a timeout or unavailable error of the transport.
  virtual Result<std::shared_ptr<const PlannedStep>> Plan(
      int64_t step, const std::vector<int64_t>& buckets) = 0;
};

/// The replies to one PieceSource call: one per requested source, in request order.
struct PieceCall {
  int64_t id = 0;
  Status status;
  std::vector<std::shared_ptr<const PieceReply>> replies;
};

/// Per source: its PieceRequests (kRequestFields int64 each).
using SourceRequests = std::vector<std::pair<int32_t, std::vector<int64_t>>>;

/// How a constructor fetches pieces. Thread-safe; calls are asynchronous.
class PieceSource {
 public:
  virtual ~PieceSource() = default;
  /// Sends `requests` to replica `replica` (0: the host, 1: its standby) of source host
  /// `host` and returns at once with the call's id.
  virtual Result<int64_t> Send(int32_t host, int32_t replica,
                               const SourceRequests& requests) = 0;
  /// The first of `calls` to finish within `timeout_s`, with its replies or its error
  /// (UnavailableError when the host is unreachable); nullopt when none finished in
  /// time. A call returned is forgotten.
  virtual std::optional<PieceCall> WaitAny(const std::vector<int64_t>& calls,
                                           double timeout_s) = 0;
  /// Forgets calls whose answers are no longer wanted.
  virtual void Forget(const std::vector<int64_t>& calls) = 0;
};

/// How a constructor shares its builds with peer processes that build the same buckets
/// (the embedded runtime's TP / PP / CP peers on one node: transport/node_builds.h).
/// Thread-safe.
class BuildShare {
 public:
  virtual ~BuildShare() = default;
  /// The micro-batches of `plan`'s bucket `bucket` that a peer built from the same plan,
  /// or nullopt.
  virtual std::optional<std::vector<std::shared_ptr<const Batch>>> Find(
      const StepPlan& plan, int64_t bucket) = 0;
  /// Waits until no peer is building (plan.step, bucket) and returns a claim that keeps
  /// the others waiting until it is released; null when none can be had (or `stop`
  /// returned true): the caller builds anyway.
  virtual std::shared_ptr<void> Claim(const StepPlan& plan, int64_t bucket,
                                      const std::function<bool()>& stop) = 0;
  /// Hands the micro-batches built from `plan` for `bucket` to the peers.
  virtual void Put(const StepPlan& plan, int64_t bucket,
                   const std::vector<std::shared_ptr<const Batch>>& batches) = 0;
};

/// A rank's request: one micro-batch, and which view of it.
struct ViewKey {
  int64_t step = 0, bucket = 0, micro_batch = 0;
  int64_t pp = 0, cp = 0;
  bool split_context = true;
  bool whole = false;  ///< the group's micro-batch itself (pp, cp, split_context ignored)
  auto operator<=>(const ViewKey&) const = default;
};

/// One view as the ranks that ask for it receive it. Thread-safe.
class DeliveredView {
 public:
  DeliveredView(std::shared_ptr<const Batch> batch, std::shared_ptr<const PlannedStep> step)
      : batch_(std::move(batch)), step_(std::move(step)) {}
  const Batch& batch() const { return *batch_; }
  const std::shared_ptr<const Batch>& shared_batch() const { return batch_; }
  /// The step's plan as received (its states: what a rank's state is made of).
  const PlannedStep& step() const { return *step_; }
  /// The transport's form of this view (a shared-memory file, an object-store
  /// reference): made by `make` once, for every rank that receives the view; released
  /// with the view.
  std::shared_ptr<void> Attachment(const std::function<std::shared_ptr<void>()>& make) const;

 private:
  std::shared_ptr<const Batch> batch_;
  std::shared_ptr<const PlannedStep> step_;
  mutable std::mutex mu_;
  mutable std::shared_ptr<void> attachment_;  // GUARDED_BY(mu_)
};

/// One (step, bucket)'s micro-batches, built once.
struct BucketBuild {
  std::shared_ptr<const PlannedStep> step;
  std::vector<std::shared_ptr<const Batch>> batches;
};

class ConstructorService {
 public:
  struct Options {
    /// Buckets known in advance (the embedded runtime's); others join as ranks ask.
    std::vector<int64_t> buckets;
    /// Steps built ahead of the newest step asked for (runtime.steps_in_flight).
    int64_t steps_in_flight = 2;
    /// Steps of builds and views kept behind the newest step asked for.
    int64_t keep_steps = 4;
    /// The ranks that receive each bucket's views, when all of them ask this service:
    /// a build is dropped once each was served each of its micro-batches, before
    /// keep_steps. Empty: by keep_steps only.
    std::vector<int64_t> receivers;
    /// Builds at a time: their waits on other roles overlap the others' decoding.
    int64_t build_threads = 4;
    /// The longest wait on another role (runtime.timeout_s).
    double timeout_s = 120;
    /// The host that serves each source's pieces (PieceSource::Send's `host`).
    std::vector<int32_t> host_of_source;
    /// Hosts have standbys: hedge slow or unreachable ones (runtime.shadow).
    bool standby = false;
    /// Place the tensors of builds and views in shared-memory files (one per micro-batch,
    /// construct/tensor_memory.h) that a transport hands to trainer processes as they
    /// are (node delivery); else on the heap.
    bool shared_memory = false;
    /// Called about every 100 ms by a View() call while it waits for its build, on the
    /// caller's thread: a non-OK status (say, a signal arrived for the trainer's thread)
    /// ends that wait with it, and the service goes on (the build continues; asking
    /// again gets it).
    /// Null: waits end with the work or the timeout.
    std::function<Status()> interrupt;
    /// With plans that carry their payloads: take each (step, bucket) a peer process
    /// built, and hand the peers each one built here (BuildShare); null: build alone.
    std::shared_ptr<BuildShare> share;
  };

  /// A service that receives plans from `plans` and, when they carry no payloads, pieces
  /// from `pieces` (may be null when every plan carries its payloads). Fails (config
  /// error naming "sources") when a source has no host.
  static Result<std::unique_ptr<ConstructorService>> Make(
      const Config& config, Options options, std::shared_ptr<PlanSource> plans,
      std::shared_ptr<PieceSource> pieces);
  ~ConstructorService();

  /// The view `key` asks for, built once for every rank that asks; starts the builds of
  /// the key's bucket steps_in_flight steps ahead. Fails with the build's error (a
  /// plan's, a piece's: naming the file and row), a config error naming "rank" for a
  /// bucket or view coordinate outside the topology (or "micro_batch" past the step's),
  /// a timeout error after runtime.timeout_s, Cancelled once stopped, or the status
  /// Options::interrupt returned.
  Result<std::shared_ptr<const DeliveredView>> View(const ViewKey& key);

  /// What the service reports (`braid status`).
  struct Figures {
    int64_t newest_step = -1;
    int64_t built_buckets = 0;      ///< (step, bucket) builds completed
    /// Of built_buckets, builds of a (step, bucket) built before: asked again by a rank
    /// further behind than the kept window (Options::keep_steps).
    int64_t rebuilt_buckets = 0;
    /// Of built_buckets, those taken from a peer's build (Options::share), not built
    /// here.
    int64_t shared_buckets = 0;
    int64_t standby_requests = 0;   ///< calls hedged to a standby
    int64_t held_builds = 0, held_views = 0;
    int64_t plan_bytes = 0;         ///< of plan messages received
    std::map<int32_t, int64_t> blanked_pieces;  ///< per source (on_error: skip)
  };
  Figures figures() const;

  /// Ends the builds; later and waiting View() calls return Cancelled. Idempotent.
  void Stop();

 private:
  class Impl;
  explicit ConstructorService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace braid
