#include "braid/runtime/engine.h"

#include "braid/construct/constructor.h"
#include "braid/construct/views.h"
#include "braid/exec/budget.h"
#include "braid/exec/read_pool.h"

namespace braid {

Engine::Engine(const Config& config, Options options)
    : config_(config),
      options_(std::move(options)),
      plans_(static_cast<size_t>(config.runtime.prefetch_steps)),
      batches_(static_cast<size_t>(2 * config.micro_batches_per_rank() *
                                   (options_.dp_ranks.empty()
                                        ? config.topology.buckets()
                                        : int64_t(options_.dp_ranks.size())))) {}

Result<std::unique_ptr<Engine>> Engine::Make(const Config& config, Options options) {
  const int64_t buckets = config.topology.buckets();
  for (int64_t r : options.dp_ranks) {
    if (r < 0 || r >= buckets) {
      return ConfigError("rank", "DP rank (bucket) " + std::to_string(r) +
                                     " is outside the " + std::to_string(buckets) +
                                     " buckets of the topology (dp=" +
                                     std::to_string(config.topology.dp) + ")");
    }
  }
  if (options.view) {
    const RankCoords& v = *options.view;
    const Topology& t = config.topology;
    if (v.tp < 0 || v.tp >= t.tp || v.pp < 0 || v.pp >= t.pp || v.cp < 0 ||
        v.cp >= t.cp) {
      return ConfigError("rank", "view coordinates (tp " + std::to_string(v.tp) +
                                     ", pp " + std::to_string(v.pp) + ", cp " +
                                     std::to_string(v.cp) + ") are outside the topology");
    }
  }
  std::unique_ptr<Engine> engine(new Engine(config, std::move(options)));
  if (engine->options_.dp_ranks.empty()) {
    for (int64_t r = 0; r < buckets; ++r) engine->options_.dp_ranks.push_back(r);
  }
  if (engine->options_.state_json.empty()) {
    engine->start_state_ = Planner::InitialState(config);
  } else {
    ARROW_ASSIGN_OR_RAISE(engine->start_state_,
                          PlannerStateFromJson(engine->options_.state_json, config,
                                               &engine->skip_first_));
    if (engine->skip_first_ >=
        engine->local_micro_batches_per_step(engine->start_state_.step)) {
      return ConfigError("state.consumed_micro_batches",
                         "exceeds the micro-batches per step of this rank");
    }
  }
  engine->pool_ = std::make_shared<ReadPool>(ReadThreads(config));
  const std::vector<int64_t> shares = SourceShares(config);
  // The sources open (listing, footers) in parallel on the pool; the first error in
  // config order is returned.
  const int64_t n = static_cast<int64_t>(config.sources.size());
  std::vector<Status> opened(static_cast<size_t>(n));
  engine->loaders_.resize(size_t(n));
  engine->pool_->ParallelFor(n, OpenThreads(config, *engine->pool_), [&](int64_t i) {
    SourceLoader::Options loader_options;
    loader_options.read_ahead_bytes = shares[size_t(i)];
    loader_options.pool = engine->pool_;
    auto loader = ShardedSource::Make(config, static_cast<int32_t>(i),
                                      engine->start_state_.sources[size_t(i)].next,
                                      loader_options, config.sources[size_t(i)].loaders);
    if (loader.ok()) {
      engine->loaders_[size_t(i)] = std::move(*loader);
    } else {
      opened[size_t(i)] = loader.status();
    }
  });
  for (const Status& st : opened) ARROW_RETURN_NOT_OK(st);
  std::vector<SampleStream*> streams;
  for (auto& loader : engine->loaders_) streams.push_back(loader.get());
  ARROW_ASSIGN_OR_RAISE(engine->planner_,
                        Planner::Make(config, streams, engine->start_state_));
  // Every source's first read is queued on the pool now, in the order the planner asks.
  for (auto& loader : engine->loaders_) loader->Start();
  engine->last_plan_ = nullptr;
  engine->planner_thread_ = std::thread([e = engine.get()] { e->PlannerLoop(); });
  engine->constructor_thread_ = std::thread([e = engine.get()] { e->ConstructorLoop(); });
  return engine;
}

Engine::~Engine() { Stop(); }

void Engine::Stop() {
  plans_.Close();
  batches_.Close();
  for (auto& loader : loaders_) {
    if (loader) loader->RequestStop();
  }
  for (auto& loader : loaders_) {
    if (loader) loader->Stop();
  }
  if (planner_thread_.joinable()) planner_thread_.join();
  if (constructor_thread_.joinable()) constructor_thread_.join();
}

int64_t Engine::local_micro_batches_per_step(int64_t step) const {
  return config_.MicroBatchesPerRankAt(step) *
         static_cast<int64_t>(options_.dp_ranks.size());
}

void Engine::PlannerLoop() {
  while (true) {
    auto plan = planner_->PlanStep();
    if (!plan.ok()) {
      plans_.Push(PlanItem{plan.status(), nullptr});
      return;
    }
    if (options_.on_plan) options_.on_plan(*plan);
    WantOwnPayloads(*plan);
    auto shared = std::make_shared<const StepPlan>(std::move(*plan));
    if (!plans_.Push(PlanItem{Status::OK(), std::move(shared)})) return;
  }
}

void Engine::WantOwnPayloads(const StepPlan& plan) const {
  if (plan.arena.pieces_without_payloads()) return;
  for (int64_t dp : options_.dp_ranks) {
    for (const MicroBatch& mb : plan.ranks[size_t(dp)].micro_batches) {
      for (const Sequence& seq : mb.sequences) {
        for (const DocPiece& piece : seq.docs) piece.payload.Want();
      }
    }
  }
}

void Engine::ConstructorLoop() {
  bool first = true;
  while (true) {
    auto item = plans_.Pop();
    if (!item) return;
    if (!item->status.ok()) {
      batches_.Push(BatchItem{item->status, nullptr, nullptr, 0});
      return;
    }
    int64_t index = 0;
    for (int64_t dp : options_.dp_ranks) {
      const auto& rank = item->plan->ranks[size_t(dp)];
      for (int64_t mb = 0; mb < static_cast<int64_t>(rank.micro_batches.size());
           ++mb, ++index) {
        if (first && index < skip_first_) continue;
        auto batch = BuildMicroBatch(*item->plan, dp, mb);
        if (batch.ok() && options_.view) batch = View(std::move(*batch));
        if (!batch.ok()) {
          batches_.Push(BatchItem{batch.status(), nullptr, nullptr, 0});
          return;
        }
        if (!batches_.Push(BatchItem{Status::OK(), item->plan,
                                     std::make_shared<const Batch>(std::move(*batch)),
                                     index})) {
          return;
        }
      }
    }
    first = false;
  }
}

Result<Batch> Engine::View(Batch batch) const {
  Topology topology = config_.topology;
  RankCoords coords = WithBucket(topology, *options_.view, batch.dp);
  if (!options_.split_context && topology.slices_context()) {
    topology.cp = 1;
    coords.cp = 0;
  }
  return ViewFor(batch, topology, coords);
}

Result<std::shared_ptr<const Batch>> Engine::Next() {
  if (!failed_.ok()) return failed_;
  auto item = batches_.Pop();
  if (!item) return Status::Cancelled("the engine was stopped");
  if (!item->status.ok()) {
    failed_ = item->status;
    return failed_;
  }
  last_plan_ = item->plan;
  last_index_ = item->local_index;
  return item->batch;
}

Result<std::vector<std::shared_ptr<const Batch>>> Engine::NextViews(
    const std::vector<RankCoords>& coords) {
  if (options_.view) {
    return ConfigError("rank", "NextViews needs an engine made without Options::view");
  }
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<const Batch> batch, Next());
  std::vector<std::shared_ptr<const Batch>> views;
  for (RankCoords c : coords) {
    c = WithBucket(config_.topology, c, batch->dp);
    ARROW_ASSIGN_OR_RAISE(Batch view, ViewFor(*batch, config_.topology, c));
    views.push_back(std::make_shared<const Batch>(std::move(view)));
  }
  return views;
}

std::vector<int64_t> Engine::blanked_payloads() const {
  std::vector<int64_t> out;
  for (const auto& source : loaders_) out.push_back(source ? source->blanked_payloads() : 0);
  return out;
}

std::vector<int64_t> Engine::skipped_files() const {
  std::vector<int64_t> out;
  for (const auto& source : loaders_) {
    out.push_back(static_cast<int64_t>(source->skipped_files().size()));
  }
  return out;
}

std::vector<int64_t> Engine::unreadable_files() const {
  std::vector<int64_t> out;
  for (const auto& source : loaders_) out.push_back(source->unreadable_files());
  return out;
}

std::string Engine::StateJson() const {
  if (last_plan_ == nullptr) {
    return PlannerStateToJson(start_state_, config_, skip_first_);
  }
  return ClientStateJson(last_plan_->state_before, last_plan_->state_after,
                         last_index_ + 1, local_micro_batches_per_step(last_plan_->step),
                         config_);
}

}  // namespace braid
