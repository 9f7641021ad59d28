// How a runtime of several processes (the Ray runtime) hosts the services: where the
// sources' payloads are served, and the services' settings that follow from the config.
//
// Placement. By default one host process per node with trainer ranks: the job's first
// node's (`JOB.planner`) hosts the planner, the sources and that node's constructor,
// which then builds from the plans themselves, their payloads read by the planner's own
// streams (one read of each row, as in the embedded runtime); every other node's host
// runs its constructor, which fetches pieces by key from the first, whose source
// services answer from the payloads of the plans its planner holds (index_payloads,
// SourceService::ServeFromPlans) before reading a row again. With
// runtime.source_actors or runtime.actor_resources the roles get processes of their
// own: the planner (`JOB.planner`, placed by Ray, on nodes with actor_resources when
// given); the sources' payloads served by the planner's process (source_actors: 0) or
// by K processes of their own (`JOB.sources.K`; K defaults to 1 with actor_resources),
// each source to the process with the least share so far, largest share first (its
// largest share of a step over the weight schedules and phases: the share of the job's
// pieces it serves at its busiest), so the K processes serve about equal parts of each
// step; a host per node for its constructor. runtime.shadow gives every
// source host a hot standby in a process of its own; without it a standby is started
// when a host cannot be reached (its node is gone). A source host's number is the same
// in every process of the job: PieceSource's `host`.
//
// Thread-safe: pure functions of the config.
#pragma once

#include <cstdint>
#include <vector>

#include "braid/config/config.h"
#include "braid/service/constructor_service.h"
#include "braid/service/planner_service.h"

namespace braid {

struct Placement {
  enum class Sources : int8_t {
    kNode,     ///< with the planner, in the host process of the job's first node
    kPlanner,  ///< in the planner's own process
    kActors,   ///< in processes of their own
  };
  Sources sources = Sources::kNode;
  int32_t hosts = 1;                    ///< processes that serve the sources' payloads
  std::vector<int32_t> host_of_source;  ///< per source, the host that serves it
  std::vector<std::vector<int32_t>> sources_of_host;  ///< per host, its sources
  bool standby = false;                 ///< hot standbys that hedge (runtime.shadow)
};

/// Where `config`'s sources are served.
Placement PlaceSources(const Config& config);

/// Per source (config order), its largest share of a step's tokens over the job: at step
/// 0 and wherever a weight schedule has a point or a phase begins.
std::vector<double> LargestShares(const Config& config);

/// A planner service for consumers in other processes: planning on a thread of its own
/// runtime.steps_in_flight + 1 steps ahead of the newest step asked for, wire messages
/// held (no payloads), the last 2 * steps_in_flight + 6 steps kept (ranks of a job move
/// within a few steps of each other; an older step is planned again from a checkpoint).
PlannerService::Options SharedPlannerOptions(const Config& config);

/// The planner of the job's first node's host (Placement kNode): SharedPlannerOptions,
/// one step ahead of the newest asked for (its constructor asks in process), planning
/// from streams that read the payloads (`open`, SourceSet kPayloads) for the
/// constructor beside it, the plans themselves kept runtime.steps_in_flight + 2 steps
/// (then only their wire messages) with their payloads indexed by row (for the other
/// nodes' fetches), replays from metadata only.
PlannerService::Options CoHostedPlannerOptions(const Config& config);

/// A node's constructor service: steps_in_flight steps built ahead, four builds at a
/// time (their waits on the planner and the source hosts overlap the others' image
/// decoding), builds and views kept steps_in_flight + 2 steps behind the newest step
/// asked for (a node's ranks move within about a step of each other and ask about two
/// steps ahead of what they consume; a rank further behind gets its micro-batches built
/// again, the same bytes).
ConstructorService::Options NodeConstructorOptions(const Config& config);

}  // namespace braid
