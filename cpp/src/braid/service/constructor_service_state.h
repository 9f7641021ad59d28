// A constructor service's window: the plans it asked for, the builds it started and the
// views it made, and the one place where they change.
//
// Every change is an Update passed to Apply: a rank asked for a view (the newest step
// asked for moves, and what lies more than keep_steps behind it is dropped), a rank was
// served one (once every rank of the bucket was served every micro-batch of a build, the
// build and its views are dropped at once: a rank that asks again gets them built again,
// the same bytes), a build was
// queued or ended (a failed one is forgotten, so a retried request builds again), plans
// were requested or failed, a view was made (the first one made for a key is the one
// every rank receives). What Apply drops is handed back, to be freed outside the
// service's lock (a view's attachment may be a transport's object).
//
// Thread-compatible: the ConstructorService applies updates under its mutex.
#pragma once

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <variant>
#include <vector>

#include "braid/service/constructor_service.h"

namespace braid {

class ConstructorServiceState {
 public:
  using StepBucket = std::pair<int64_t, int64_t>;
  using BuildFuture = std::shared_future<Result<std::shared_ptr<const BucketBuild>>>;
  using PlanFuture = std::shared_future<Result<std::shared_ptr<const PlannedStep>>>;

  /// A rank asked for a view of (step, bucket).
  struct Asked {
    int64_t step = 0, bucket = 0;
  };
  /// A build of (step, bucket) was queued; `id` tells it from a later one of the key.
  struct BuildQueued {
    StepBucket key;
    int64_t id = 0;
    BuildFuture build;
  };
  /// A build ended; a failed one is forgotten (if it is still the held one).
  struct BuildEnded {
    StepBucket key;
    int64_t id = 0;
    bool ok = true;
  };
  /// The plan of `step` was requested for `buckets`.
  struct PlansRequested {
    int64_t step = 0;
    std::vector<int64_t> buckets;
    int64_t id = 0;
    PlanFuture plan;
  };
  /// That request failed: forgotten, so that a later one asks again.
  struct PlansFailed {
    int64_t step = 0;
    int64_t id = 0;
  };
  /// A view was made; kept unless one was made for the key meanwhile.
  struct ViewMade {
    ViewKey key;
    std::shared_ptr<const DeliveredView> view;
  };
  /// A rank was served a view of micro-batch key.micro_batch of a build of
  /// `micro_batches` (0: of the build already served from).
  struct Served {
    ViewKey key;
    int64_t micro_batches = 0;
  };
  using Update = std::variant<Asked, BuildQueued, BuildEnded, PlansRequested, PlansFailed,
                              ViewMade, Served>;

  /// What an update dropped: free it without the service's lock held.
  struct Dropped {
    std::vector<BuildFuture> builds;
    std::vector<PlanFuture> plans;
    std::vector<std::shared_ptr<const DeliveredView>> views;
    /// Takes what `more` holds too.
    void Add(Dropped&& more);
  };

  /// `receivers`: the ranks that receive each bucket (empty or 0: unknown, so builds are
  /// dropped by keep_steps only).
  ConstructorServiceState(int64_t keep_steps, const std::vector<int64_t>& buckets,
                          std::vector<int64_t> receivers = {});

  Dropped Apply(const Update& update);

  /// The build of `key` when queued or done, else nullopt.
  std::optional<BuildFuture> Build(const StepBucket& key) const;
  /// The plan request that holds (step, bucket), else nullopt.
  std::optional<PlanFuture> Plan(const StepBucket& key) const;
  /// The known buckets whose plan at `step` was not requested yet, ascending.
  std::vector<int64_t> BucketsWithoutPlan(int64_t step) const;
  /// The view made for `key`, else null.
  std::shared_ptr<const DeliveredView> View(const ViewKey& key) const;

  int64_t newest_step() const { return newest_; }
  int64_t held_builds() const { return static_cast<int64_t>(builds_.size()); }
  int64_t held_views() const { return static_cast<int64_t>(views_.size()); }

 private:
  void DropBuild(const StepBucket& key, Dropped* dropped);

  const int64_t keep_steps_;
  const std::vector<int64_t> receivers_;
  // Per build not yet served to all its receivers: the ranks served each micro-batch.
  std::map<StepBucket, std::vector<int64_t>> served_;
  int64_t newest_ = -1;
  std::set<int64_t> buckets_;  // every bucket a rank asked for (or known in advance)
  template <typename F>
  struct Held {
    int64_t id = 0;
    F future;
  };
  std::map<StepBucket, Held<BuildFuture>> builds_;
  std::map<StepBucket, Held<PlanFuture>> plans_;
  std::map<ViewKey, std::shared_ptr<const DeliveredView>> views_;
};

}  // namespace braid
