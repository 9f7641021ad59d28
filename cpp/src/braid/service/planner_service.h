// The planner role on its own: the planner and the metadata-only source loaders it draws
// from, without payloads, constructors or clients.
//
// `braid plan` runs it in-process (cli/job.h); the Ray runtime hosts it in the
// planner actor and sends each plan to the constructors as EncodeStepPlan's message
// (service/wire.h). It reads token counts only: no payload is read or held, and the
// source loaders' read-ahead is bounded by their share of runtime.memory_bytes as in the
// embedded runtime. The plans are those of the embedded runtime for the same config and
// state (the same Planner over the same streams).
//
// Owns its ReadPool, one SourceLoader per source and the Planner. Thread-compatible: call
// Next() from one thread at a time; the destructor stops the loaders and waits for them.
#pragma once

#include <memory>
#include <vector>

#include "braid/config/config.h"
#include "braid/plan/planner.h"
#include "braid/plan/step_plan.h"
#include "braid/status.h"

namespace braid {

class ReadPool;
class SourceLoader;

class PlannerService {
 public:
  /// Opens every source (listing and footers in parallel on the pool) at `start`'s
  /// cursors and queues each source's first read. Fails as SourceLoader::Make does (the
  /// first failing source in config order).
  static Result<std::unique_ptr<PlannerService>> Make(const Config& config,
                                                      const PlannerState& start);
  ~PlannerService();

  /// Plans the next step (StepPlan::state_before is the state after the previous one).
  Result<StepPlan> Next();

  /// The state after the last planned step.
  const PlannerState& state() const;

 private:
  PlannerService() = default;
  std::shared_ptr<ReadPool> pool_;
  std::vector<std::unique_ptr<SourceLoader>> loaders_;
  std::unique_ptr<Planner> planner_;
};

}  // namespace braid
