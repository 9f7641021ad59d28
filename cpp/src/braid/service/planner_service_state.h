// The planner service's state, and the one place where it changes.
//
// PlannerServiceState holds what a PlannerService knows about its job beyond the planner
// itself: the steps planned so far (and the plans still held for consumers that ask),
// how far ahead consumers want plans, the checkpoint states a dropped or lost step is
// planned again from, and the ranks attached to the job. Every change is an Update passed
// to Apply (the tf.data service's DispatcherState is the model), so planning, asking,
// attaching, replaying and restoring are one state machine, tested without a runtime.
//
// The journal is the part that must outlive the service's process: the job's start state,
// the newest `committed` checkpoints of steps a consumer has asked for (not those planned
// ahead of every consumer: where a restart resumes follows the consumers, not how far
// ahead the planner ran) and the attached ranks, as JSON. A runtime persists it whenever
// Apply says it changed (the Ray runtime in its key-value store) and a restarted service
// restores it (Restore), then resumes planning from the newest checkpoint; the plans are
// a pure function of (config, state), so a step planned again is the step planned before.
//
// Thread-compatible: the PlannerService applies updates under its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "braid/config/config.h"
#include "braid/plan/step_plan.h"
#include "braid/status.h"

namespace braid {

/// The payloads of one plan's pieces by row: (source, file, row) in increasing order,
/// each row once, with its payload handle (PayloadIndex::Find).
struct PayloadIndex {
  struct Entry {
    int32_t source = 0;
    int32_t file = 0;
    int64_t row = 0;
    PayloadRef payload;
  };
  std::vector<Entry> entries;

  /// The pieces of `plan` whose source's payloads carry no images (their sources
  /// transform rows into tokens the same way in any process), by row.
  static std::shared_ptr<const PayloadIndex> Of(const StepPlan& plan,
                                                const Config& config);
  /// The payload of row `row` of file `file` of source `source`, or an empty handle.
  PayloadRef Find(int32_t source, int32_t file, int64_t row) const;
};

/// One planned step as a planner service hands it out: in process, the plan itself
/// (payload handles included); across processes, its wire message and states as JSON.
struct PlannedStep {
  int64_t step = 0;
  /// The plan, every bucket (in-process consumers). Null in a step that crossed
  /// processes (it holds `encoded`) or when the service encodes only.
  std::shared_ptr<const StepPlan> plan;
  /// The plan's payloads by row (PlannerService::Options::index_payloads): built by the
  /// first KeptPayload that looks into this step, under the planner service's lock, and
  /// dropped with the plan; consumers of the plan do not touch it.
  mutable std::shared_ptr<const PayloadIndex> payloads;
  /// EncodeStepPlan's message (every bucket, or SliceStepPlan's slice across processes).
  std::vector<int64_t> encoded;
  /// The planner's state before and after the step (what a client's state is made of).
  PlannerState state_before, state_after;
  /// The same as JSON (PlannerStateToJson), filled where the step crosses processes.
  std::string state_before_json, state_after_json;
  /// What a run's summary takes from the plan.
  PlanFigures figures;
};

class PlannerServiceState {
 public:
  struct Options {
    /// Steps planned ahead of the newest step asked for.
    int64_t plan_ahead = 1;
    /// Plans held behind the newest step asked for (older ones are planned again on
    /// demand).
    int64_t keep_steps = 1;
    /// Of them, how many keep the plan itself (PlannedStep::plan: its payload handles
    /// hold payloads in memory); older ones keep their wire message only. -1: all.
    int64_t keep_plan_steps = -1;
    /// Every checkpoint_every-th step's state is kept to plan dropped steps again from;
    /// the newest max_checkpoints of them (and the start), `committed` in the journal.
    int64_t checkpoint_every = 16;
    int64_t max_checkpoints = 64;
    int64_t committed = 4;
  };

  /// A step was planned (the next one, in order).
  struct Planned {
    std::shared_ptr<const PlannedStep> step;
  };
  /// A consumer asked for a step: the planner plans up to plan_ahead beyond it.
  struct Asked {
    int64_t step = 0;
  };
  /// A trainer rank attached to or detached from the job (its client id); an ended job
  /// (every rank detached) takes no more.
  struct Attached {
    std::string client;
  };
  struct Detached {
    std::string client;
  };
  /// A dropped step was planned again from a checkpoint.
  struct Replayed {
    int64_t step = 0;
  };
  using Update = std::variant<Planned, Asked, Attached, Detached, Replayed>;

  /// A job that starts at `start`.
  PlannerServiceState(const Config& config, const PlannerState& start, Options options);

  /// Restores a journal written by Journal() (a restarted service): its checkpoints and
  /// attached ranks; planning resumes at the newest checkpoint. Fails (config error naming
  /// "journal") on malformed JSON or states of another config; changes nothing then.
  Status Restore(const std::string& journal);

  /// Applies `update`. Returns whether the journal changed (persist Journal() then).
  /// REQUIRES: Planned updates come in step order from next_step().
  bool Apply(const Update& update);

  /// The journal: the start state, the newest `committed` checkpoints, the attached
  /// ranks; empty once the last attached rank detached (the job ended: a runtime drops
  /// what it persisted).
  std::string Journal() const;

  int64_t first_step() const { return first_step_; }
  /// The step the planner plans next; the planner resumes here after a restore.
  int64_t next_step() const { return next_step_; }
  /// The state next_step() is planned from when nothing was planned yet (start or restore).
  const PlannerState& resume_state() const;
  /// Plans are wanted up to (excluding) this step.
  int64_t horizon() const { return horizon_; }
  /// Step `step`'s plan when still held, else null.
  std::shared_ptr<const PlannedStep> Held(int64_t step) const;
  /// The payload of a row that a held plan has (the newest such plan's; each plan
  /// indexed by row the first time it is looked into), or an empty handle.
  PayloadRef KeptPayload(int32_t source, int32_t file, int64_t row) const;
  /// The newest checkpoint state at or before `step`. REQUIRES: step >= first_step().
  const PlannerState& CheckpointBefore(int64_t step) const;

  int64_t restored_from() const { return restored_from_; }
  int64_t replays() const { return replays_; }
  int64_t clients() const { return static_cast<int64_t>(clients_.size()); }
  /// The last attached rank detached: the job ended and takes no more ranks.
  bool ended() const { return ended_; }
  int64_t held_steps() const { return static_cast<int64_t>(held_.size()); }

 private:
  // Drops the held plans older than keep_steps behind the newest step asked for.
  void DropOld();
  // Checkpoints up to this step go into the journal: those of steps a consumer asked for.
  int64_t journaled_through() const { return newest_asked_; }

  const Config& config_;
  const Options options_;
  int64_t first_step_ = 0;
  int64_t next_step_ = 0;
  int64_t horizon_ = 0;
  int64_t newest_asked_ = 0;
  int64_t restored_from_ = 0;
  int64_t replays_ = 0;
  // INVARIANT: holds first_step_'s state (the start) and at most max_checkpoints others.
  std::map<int64_t, PlannerState> checkpoints_;
  std::map<int64_t, std::shared_ptr<const PlannedStep>> held_;
  std::set<std::string> clients_;
  bool ended_ = false;  // every attached rank detached
};

}  // namespace braid
