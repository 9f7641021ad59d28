#include "braid/service/hosting.h"

#include <algorithm>

#include "braid/client/topology.h"
#include "braid/exec/budget.h"

namespace braid {

Placement PlaceSources(const Config& config) {
  Placement p;
  const int64_t actors = config.runtime.source_actors;
  const int32_t n = static_cast<int32_t>(config.sources.size());
  if (actors < 0 && config.runtime.actor_resources.empty()) {
    p.sources = Placement::Sources::kNode;
    p.hosts = 1;
  } else if (actors == 0) {
    p.sources = Placement::Sources::kPlanner;
    p.hosts = 1;
  } else {
    p.sources = Placement::Sources::kActors;
    p.hosts = static_cast<int32_t>(
        std::min<int64_t>(std::max<int64_t>(actors, 1), std::max<int32_t>(n, 1)));
  }
  p.sources_of_host.resize(size_t(p.hosts));
  for (int32_t i = 0; i < n; ++i) {
    p.host_of_source.push_back(i % p.hosts);
    p.sources_of_host[size_t(i % p.hosts)].push_back(i);
  }
  p.standby = config.runtime.shadow;
  return p;
}

PlannerService::Options SharedPlannerOptions(const Config& config) {
  PlannerService::Options o;
  o.background = true;
  o.encode = true;
  o.keep_plan = false;
  o.replay = true;
  o.state.plan_ahead = config.runtime.steps_in_flight + 1;
  o.state.keep_steps = 2 * config.runtime.steps_in_flight + 6;
  return o;
}

PlannerService::Options CoHostedPlannerOptions(const Config& config) {
  PlannerService::Options o = SharedPlannerOptions(config);
  o.state.plan_ahead = 1;  // its constructor asks in process: no latency to hide
  o.keep_plan = true;
  o.state.keep_plan_steps = config.runtime.steps_in_flight + 2;
  o.reopen = PlannerService::MetadataOnly(config);
  return o;
}

ConstructorService::Options NodeConstructorOptions(const Config& config) {
  ConstructorService::Options o;
  o.steps_in_flight = config.runtime.steps_in_flight;
  o.keep_steps = config.runtime.steps_in_flight + 2;
  // A bucket's ranks usually share a node (TP peers): once all were served a build, it
  // goes. Where they span nodes, no node's count completes and keep_steps bounds it.
  o.receivers.assign(size_t(config.topology.buckets()), 0);
  for (int64_t rank = 0; rank < config.topology.world_size(); ++rank) {
    const auto coords = CoordsOf(config.topology, rank);
    if (coords.ok()) ++o.receivers[size_t(BucketOf(config.topology, *coords))];
  }
  // A node's constructor decodes the images of every rank on the node (their pieces
  // arrive encoded): as many builds at once as the node's read threads, at least 4 so
  // that builds waiting on other roles overlap.
  o.build_threads = std::max<int64_t>(4, ReadThreads(config));
  o.timeout_s = config.runtime.timeout_s;
  o.host_of_source = PlaceSources(config).host_of_source;
  o.standby = config.runtime.shadow;
  // Node delivery hands the ranks each view's tensors in shared-memory files: built
  // there, never copied for a rank.
  o.shared_memory = config.runtime.delivery == RuntimeConfig::Delivery::kNode;
  return o;
}

}  // namespace braid
