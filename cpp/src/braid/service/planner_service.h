// The planner role as a service: the Planner over the sample streams of the job's
// sources, handing out each step's plan by step number to any number of consumers.
//
// A PlannerService owns the SourceSet its planner draws from (opened by the runtime's
// OpenSources function: with payloads in the embedded runtime, metadata only for `braid
// plan` and the Ray runtime's planner) and a PlannerServiceState, which every change goes
// through. Plans are made in step order, on a thread of the service (Options::background:
// plan_ahead steps beyond the newest step asked for) or on the asking thread; the last
// keep_steps plans are held, and an older step is planned again from the nearest
// checkpoint state before it (a consumer far behind, or restarted), with a fresh set of
// streams: the plan is a pure function of (config, state), so it is the step handed out
// before. The journal (the start, the newest checkpoints, the attached ranks) goes to
// Options::commit whenever it changes, and a restarted service resumes from it.
//
// In-process consumers receive the plan itself (payload handles included); consumers in
// other processes its wire message (Options::encode: EncodeStepPlan, states as JSON).
//
// Auto-partitioning (runtime.autoscale): before it plans each step, the service shares
// its streams' pool threads and memory budget among the sources by their measured costs
// and their weights over the steps ahead (exec/allocation.h), so a source is given
// threads before its weight rises and a source of weight 0 reads nothing ahead; the
// changes are kept (share_changes()). The stream is the same either way. What each
// source's stream cost and how long the planner waited on it are kept per span of steps
// (timeline(), service/profile_timeline.h), with or without autoscale.
//
// Thread-safe. The destructor stops the planning thread and the streams.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "braid/config/config.h"
#include "braid/exec/allocation.h"
#include "braid/plan/step_plan.h"
#include "braid/service/planner_service_state.h"
#include "braid/service/profile_timeline.h"
#include "braid/service/source_service.h"
#include "braid/status.h"

namespace braid {

class Planner;

class PlannerService {
 public:
  /// Opens the streams of every source at a state's cursors (at start, after a restore,
  /// and for each replay).
  using OpenSources = std::function<Result<std::unique_ptr<SourceSet>>(const PlannerState&)>;

  struct Options {
    PlannerServiceState::Options state;
    /// Plan on a thread of the service, state.plan_ahead steps beyond the newest step
    /// asked for; false: Plan() plans on the asking thread, up to the step it asks.
    bool background = false;
    /// Hold each step's wire message and states as JSON (consumers in other processes).
    bool encode = false;
    /// Hold the plan itself (payload handles: consumers in this process).
    bool keep_plan = true;
    /// With keep_plan: find rows' payloads in the held plans (KeptPayload; each plan is
    /// indexed by row when first looked into, so a job whose fetches never come pays
    /// nothing), so that a source service beside the planner answers other processes'
    /// fetches from them.
    bool index_payloads = false;
    /// Plan a step no longer held again from a checkpoint; false: asking for it fails.
    bool replay = true;
    /// Opens the streams a replay plans from; null: the OpenSources of Make. (A planner
    /// whose streams read payloads replays from metadata: a replayed step is wanted
    /// across processes, by key.)
    OpenSources reopen;
    /// Receives the journal (PlannerServiceState::Journal) whenever it changed, in order;
    /// called without the service's lock held. Null: nothing is persisted.
    std::function<void(const std::string& journal)> commit;
    /// Called with every plan on the planning thread, before any consumer receives it.
    std::function<void(const StepPlan&)> on_plan;
  };

  /// Opens metadata-only streams of every source of `config` (token counts, no
  /// payloads): what a planning pass and the Ray runtime's planner draw from.
  static OpenSources MetadataOnly(const Config& config);

  /// Opens the sources (`open`) at `start`, or, given a journal of this job, at its
  /// newest checkpoint, and starts planning. Fails as `open` or Planner::Make do, or on
  /// a journal that does not parse (naming "journal").
  static Result<std::unique_ptr<PlannerService>> Make(const Config& config,
                                                      const PlannerState& start,
                                                      OpenSources open, Options options,
                                                      const std::string& journal = "");
  ~PlannerService();

  /// Step `step`'s plan. Waits while it is planned (up to `timeout_s`: a timeout error
  /// naming the step), plans it again when it is no longer held, and fails with the
  /// planner's error (the first failing step's, for it and every later step), a config
  /// error for a step before the job's first, or Cancelled once stopped.
  Result<std::shared_ptr<const PlannedStep>> Plan(int64_t step, double timeout_s);

  /// The step after the one the last Next() returned (the start's, first), as Plan()
  /// gives it: for one consumer that takes every step in order (`braid plan`).
  Result<std::shared_ptr<const PlannedStep>> Next();

  /// Attaches (detaches) a trainer rank's client id; returns the ranks attached after.
  /// Once the last rank detached the job has ended: Attach fails with an unavailable
  /// error (the runtime is stopping the job's roles; the rank starts a new job).
  Result<int64_t> Attach(const std::string& client);
  int64_t Detach(const std::string& client);

  /// What the service reports (`braid status`).
  struct Figures {
    int64_t planned_through = -1;  ///< the newest step planned
    int64_t held_steps = 0;
    int64_t replayed_steps = 0;
    int64_t restored_from = 0;  ///< the step planning (re)started from
    int64_t clients = 0;
  };
  Figures figures() const;
  /// The sources' shares each time they changed (runtime.autoscale): the step about to
  /// be planned and every source's share, in config order. The first entry is the
  /// start's. At most kMaxShareChanges are kept (the newest dropped after).
  static constexpr size_t kMaxShareChanges = 256;
  std::vector<ShareChange> share_changes() const;
  /// What each source's stream cost per span of steps, as each step's planning began
  /// (at most ProfileTimeline::kDefaultMaxSpans spans; steps planned again from a
  /// checkpoint on streams of their own are not in it).
  std::vector<ProfileSpan> timeline() const;
  /// The payload of row `row` of file `file` of source `source` when a plan this
  /// service holds has it (Options::index_payloads; a source without images), else an
  /// empty handle. Thread-safe.
  PayloadRef KeptPayload(int32_t source, int32_t file, int64_t row) const;

  /// The sources the planner draws from (their skip counts). Valid until destruction.
  const SourceSet& sources() const { return *sources_; }

  /// Stops planning and the streams; waiting Plan() calls return Cancelled. Idempotent;
  /// a call made while another thread stops returns once that stop is complete.
  void Stop();

 private:
  PlannerService(const Config& config, Options options, const PlannerState& start);
  // Plans state_.next_step() with planner_. REQUIRES: plan_mu_ held.
  Result<std::shared_ptr<const PlannedStep>> PlanNext();
  // Applies `update` under mu_, then commits the journal if it changed.
  void ApplyAndCommit(const PlannerServiceState::Update& update,
                      std::unique_lock<std::mutex>* lock);
  void Loop();
  // Shares the pool and the budget for planning `step` (runtime.autoscale). REQUIRES:
  // plan_mu_ held, or no planning started yet.
  void Rescale(int64_t step);
  // Plans `step` again from the newest checkpoint before it.
  Result<std::shared_ptr<const PlannedStep>> Replay(int64_t step, PlannerState from);

  const Config config_;
  const Options options_;
  OpenSources open_;
  std::unique_ptr<SourceSet> sources_;
  std::unique_ptr<Planner> planner_;  // draws from sources_; GUARDED_BY(plan_mu_)
  std::mutex plan_mu_;                // one step planned at a time
  std::mutex stop_mu_;  // held through Stop(): a second caller returns once it is done
  mutable std::mutex mu_;
  std::condition_variable cv_;
  PlannerServiceState state_;  // GUARDED_BY(mu_)
  Status error_;               // GUARDED_BY(mu_): the planner's first error
  int64_t error_step_ = -1;    // GUARDED_BY(mu_): the step that failed
  bool stopped_ = false;       // GUARDED_BY(mu_)
  std::mutex commit_mu_;       // commits in order
  int64_t journal_version_ = 0;    // GUARDED_BY(mu_)
  int64_t committed_version_ = 0;  // GUARDED_BY(commit_mu_)
  std::thread thread_;
  int64_t next_ = 0;  // the step Next() returns next
  mutable std::mutex shares_mu_;
  std::vector<SourceShare> shares_;         // GUARDED_BY(shares_mu_) the ones applied
  std::vector<ShareChange> share_changes_;  // GUARDED_BY(shares_mu_)
  ProfileTimeline timeline_;                // GUARDED_BY(shares_mu_)
};

}  // namespace braid
