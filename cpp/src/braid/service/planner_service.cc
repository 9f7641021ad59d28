#include "braid/service/planner_service.h"

#include "braid/exec/budget.h"
#include "braid/exec/read_pool.h"
#include "braid/source/source_loader.h"

namespace braid {

Result<std::unique_ptr<PlannerService>> PlannerService::Make(const Config& config,
                                                             const PlannerState& start) {
  std::unique_ptr<PlannerService> service(new PlannerService());
  service->pool_ = std::make_shared<ReadPool>(ReadThreads(config));
  const std::vector<int64_t> shares = SourceShares(config);
  const int64_t n = static_cast<int64_t>(config.sources.size());
  service->loaders_.resize(static_cast<size_t>(n));
  std::vector<Status> opened(static_cast<size_t>(n));
  service->pool_->ParallelFor(n, OpenThreads(config, *service->pool_), [&](int64_t i) {
    SourceLoader::Options options;
    options.read_payloads = false;
    options.read_ahead_bytes = shares[size_t(i)];
    options.pool = service->pool_;
    auto loader = SourceLoader::Make(config, static_cast<int32_t>(i),
                                     start.sources[size_t(i)].next, options);
    if (loader.ok()) {
      service->loaders_[size_t(i)] = std::move(*loader);
    } else {
      opened[size_t(i)] = loader.status();
    }
  });
  for (const Status& st : opened) ARROW_RETURN_NOT_OK(st);
  std::vector<SampleStream*> streams;
  for (auto& loader : service->loaders_) streams.push_back(loader.get());
  ARROW_ASSIGN_OR_RAISE(service->planner_, Planner::Make(config, streams, start));
  // Every source's first read is queued now, in the order the planner asks.
  for (auto& loader : service->loaders_) loader->Start();
  return service;
}

PlannerService::~PlannerService() {
  planner_.reset();  // holds the streams; the loaders outlive it
  for (auto& loader : loaders_) {
    if (loader) loader->RequestStop();  // then each destructor waits
  }
}

Result<StepPlan> PlannerService::Next() { return planner_->PlanStep(); }

const PlannerState& PlannerService::state() const { return planner_->state(); }

}  // namespace braid
