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
  p.host_of_source.assign(size_t(n), 0);
  // Largest share first, each to the host with the least share so far (the lowest
  // number on a tie): sources of equal weight go round the hosts in config order.
  const std::vector<double> share = LargestShares(config);
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) order[size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return share[size_t(a)] > share[size_t(b)]; });
  std::vector<double> load(size_t(p.hosts), 0.0);
  for (int32_t i : order) {
    const auto host = static_cast<int32_t>(
        std::min_element(load.begin(), load.end()) - load.begin());
    p.host_of_source[size_t(i)] = host;
    load[size_t(host)] += share[size_t(i)];
  }
  for (int32_t i = 0; i < n; ++i) {
    p.sources_of_host[size_t(p.host_of_source[size_t(i)])].push_back(i);
  }
  p.standby = config.runtime.shadow;
  return p;
}

std::vector<double> LargestShares(const Config& config) {
  const size_t n = config.sources.size();
  // Shares change only where a schedule's point or a phase begins (linear in between:
  // a share's extremes are at the points).
  std::vector<int64_t> steps = {0};
  auto add_points = [&](const WeightSchedule& w) {
    for (const auto& [step, weight] : w.points) steps.push_back(std::max<int64_t>(0, step));
  };
  for (const auto& s : config.sources) add_points(s.weight);
  for (const auto& phase : config.phases) {
    steps.push_back(phase.until_step);
    for (const auto& w : phase.weights) {
      if (w) add_points(*w);
    }
  }
  std::vector<double> out(n, 0.0);
  for (int64_t step : steps) {
    const std::vector<double> w = WeightSharesAt(config, step);
    for (size_t i = 0; i < n; ++i) out[i] = std::max(out[i], w[i]);
  }
  return out;
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
  o.index_payloads = true;  // the other nodes' fetches are answered from them
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
