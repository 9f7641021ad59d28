// How a runtime of several processes (the Ray runtime) hosts the services: where the
// sources' payloads are served, and the services' settings that follow from the config.
//
// Placement (runtime.source_actors):
//   unset   the sources are served by the host process of the node that starts the job,
//           beside that node's constructor: one process per node, and that node's
//           constructor fetches its pieces in process (the default)
//   0       by the planner's process
//   K > 0   by K processes of their own, source i by process i % K (placed by Ray, on
//           nodes with runtime.actor_resources when given)
// runtime.shadow gives every source host a hot standby in a process of its own; without
// it a standby is started when a host cannot be reached (its node is gone). A host's
// number is the same in every process of the job: PieceSource's `host`.
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
    kNode,     ///< in the host process of the job's first node
    kPlanner,  ///< in the planner's process
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

/// A planner service for consumers in other processes: planning on a thread of its own
/// runtime.steps_in_flight + 1 steps ahead of the newest step asked for, wire messages
/// held (no payloads), the last 2 * steps_in_flight + 6 steps kept (ranks of a job move
/// within a few steps of each other; an older step is planned again from a checkpoint).
PlannerService::Options SharedPlannerOptions(const Config& config);

/// A node's constructor service: steps_in_flight steps built ahead, four builds at a
/// time (their waits on the planner and the source hosts overlap the others' image
/// decoding), builds kept steps_in_flight + 2 steps (a node's ranks move within about a
/// step of each other; a rank further behind gets its micro-batches built again).
ConstructorService::Options NodeConstructorOptions(const Config& config);

}  // namespace braid
