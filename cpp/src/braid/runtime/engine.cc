#include "braid/runtime/engine.h"

#include <algorithm>
#include <atomic>
#include <limits>

#include "braid/client/rank_cursor.h"
#include "braid/construct/views.h"
#include "braid/io/length_cache.h"
#include "braid/service/constructor_service.h"
#include "braid/service/planner_service.h"
#include "braid/service/source_service.h"
#include "braid/transport/in_process.h"
#include "braid/transport/node_builds.h"
#include "braid/util/log_internal.h"

namespace braid {
namespace {

constexpr double kForever = std::numeric_limits<double>::infinity();

}  // namespace

class Engine::Impl {
 public:
  Impl(const Config& config, Options options)
      : config_(config), options_(std::move(options)) {}
  ~Impl() { Stop(); }

  Status Start();
  Result<std::shared_ptr<const Batch>> Next();
  Result<std::vector<std::shared_ptr<const Batch>>> NextViews(
      const std::vector<RankCoords>& coords);
  std::string StateJson() const;
  void Stop() {
    if (planner_) planner_->Stop();  // a build waiting for a plan returns Cancelled
    if (constructor_) constructor_->Stop();
  }

  const Config config_;
  const Options options_;
  std::shared_ptr<NodeBuilds> share_;  // builds shared with the node's peers, or null
  std::unique_ptr<PlannerService> planner_;
  std::unique_ptr<ConstructorService> constructor_;  // reaches planner_: destroyed first
  std::optional<RankCursor> cursor_;  // over config_

 private:
  // Starts the on-demand payloads (image decodes) of the pieces this process builds; the
  // other processes' pieces are never decoded here.
  void WantOwnPayloads(const StepPlan& plan) const;

  // What the client has received, for StateJson().
  std::optional<RankCursor::Position> last_;
  std::shared_ptr<const DeliveredView> last_view_;
  Status failed_;
  // Set by Options::interrupt's wrapper during the current Next(), which then keeps its
  // position in pending_ for the next call. Next() is called from one thread at a time.
  std::atomic<bool> interrupted_{false};
  std::optional<RankCursor::Position> pending_;
};

Status Engine::Impl::Start() {
  ARROW_ASSIGN_OR_RAISE(cursor_,
                        RankCursor::Make(config_, options_.state_json, options_.buckets));
  PlannerService::Options planning;
  planning.background = true;
  planning.state.plan_ahead = config_.runtime.prefetch_steps;
  planning.state.keep_steps = 1;  // one consumer, in order: a plan is taken once
  planning.replay = false;
  // TP / PP / CP peers on this node build each micro-batch of their group once between
  // them; then its payloads are wanted by the peer that builds it, when it builds.
  const Topology& topology = config_.topology;
  if (options_.view && topology.tp * topology.pp * topology.cp > 1) {
    std::string dir = options_.share_builds_dir;
    if (dir.empty()) {
      dir = NodeBuildsFolder(config_.Fingerprint() + "|topology " +
                             std::to_string(topology.dp) + "x" +
                             std::to_string(topology.tp) + "x" +
                             std::to_string(topology.pp) + "x" +
                             std::to_string(topology.cp));
    }
    if (!dir.empty()) {
      auto made = NodeBuilds::Make(dir, config_.runtime.prefetch_steps +
                                            config_.runtime.steps_in_flight + 2);
      if (made.ok()) share_ = *made;  // else each peer builds its own
    }
  }
  planning.on_plan = [this](const StepPlan& plan) {
    if (options_.on_plan) options_.on_plan(plan);
    if (share_ == nullptr) WantOwnPayloads(plan);
  };
  const Config& config = config_;
  // A process that builds some of the buckets shares the counts of tokenized sources
  // with the other processes (runtime.length_cache) and tokenizes only what it builds.
  const bool some = int64_t(options_.buckets.size()) < config_.topology.buckets();
  const auto stream =
      some ? SourceService::Stream::kOwnPayloads : SourceService::Stream::kPayloads;
  const auto& own = options_.buckets;
  // Said by the processes that build bucket 0 (one, or its TP/PP peers), not every rank.
  if (some && std::find(own.begin(), own.end(), int64_t{0}) != own.end()) {
    for (const SourceConfig& s : config_.sources) {
      if (!s.length_cache_dir.empty() || !LengthCache::Keeps(s)) continue;
      internal::LogLine("braid: source '" + s.name +
                        "' is tokenized to count it in every rank's process; set "
                        "runtime.length_cache: DIR (a local folder) to count it once per "
                        "node and tokenize only the rows each rank builds "
                        "(docs/sources.md, \"Counting once per node\")");
    }
  }
  ARROW_ASSIGN_OR_RAISE(
      planner_,
      PlannerService::Make(
          config_, cursor_->start(),
          [&config, stream](const PlannerState& at) {
            return SourceSet::Open(config, at, stream, /*serve=*/false);
          },
          std::move(planning)));
  ConstructorService::Options building;
  building.buckets = options_.buckets;
  building.steps_in_flight = config_.runtime.steps_in_flight;
  building.keep_steps = 1;
  building.build_threads = 1;
  building.timeout_s = kForever;  // nothing crosses a process: waits end with the work
  building.share = share_;
  if (options_.interrupt) {
    building.interrupt = [this] {
      Status st = options_.interrupt();
      if (!st.ok()) interrupted_ = true;  // on the thread of the Next() that waits
      return st;
    };
  }
  ARROW_ASSIGN_OR_RAISE(
      constructor_,
      ConstructorService::Make(config_, std::move(building),
                               std::make_shared<InProcessPlans>(planner_.get(), kForever),
                               /*pieces=*/nullptr));
  return Status::OK();
}

void Engine::Impl::WantOwnPayloads(const StepPlan& plan) const {
  if (plan.arena.pieces_without_payloads()) return;
  for (int64_t bucket : options_.buckets) {
    for (const MicroBatch& mb : plan.buckets[size_t(bucket)].micro_batches) {
      for (const Sequence& seq : mb.sequences) {
        for (const DocPiece& piece : seq.docs) piece.payload.Want();
      }
    }
  }
}

Result<std::shared_ptr<const Batch>> Engine::Impl::Next() {
  if (!failed_.ok()) return failed_;
  // An interrupted call's micro-batch is still the next one.
  const RankCursor::Position at = pending_ ? *pending_ : cursor_->Next();
  pending_.reset();
  ViewKey key{at.step, at.bucket, at.micro_batch};
  if (options_.view) {
    key.pp = options_.view->pp;
    key.cp = options_.view->cp;
    key.split_context = options_.split_context;
  } else {
    key.whole = true;
  }
  interrupted_ = false;
  auto view = constructor_->View(key);
  if (!view.ok()) {
    if (interrupted_) {
      pending_ = at;
      return view.status();
    }
    failed_ = view.status();
    return failed_;
  }
  last_ = at;
  last_view_ = std::move(*view);
  return last_view_->shared_batch();
}

Result<std::vector<std::shared_ptr<const Batch>>> Engine::Impl::NextViews(
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

std::string Engine::Impl::StateJson() const {
  if (!last_) return cursor_->start_json();
  const PlannedStep& step = last_view_->step();
  return cursor_->StateAfter(*last_, step.state_before, step.state_after);
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::Make(const Config& config, Options options) {
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
  if (options.buckets.empty()) {
    for (int64_t b = 0; b < config.topology.buckets(); ++b) options.buckets.push_back(b);
  }
  auto impl = std::make_unique<Impl>(config, std::move(options));
  ARROW_RETURN_NOT_OK(impl->Start());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Result<std::shared_ptr<const Batch>> Engine::Next() { return impl_->Next(); }

Result<std::vector<std::shared_ptr<const Batch>>> Engine::NextViews(
    const std::vector<RankCoords>& coords) {
  return impl_->NextViews(coords);
}

std::string Engine::StateJson() const { return impl_->StateJson(); }

std::vector<SourceProfile> Engine::source_profiles() const {
  return impl_->planner_->sources().profiles();
}

int64_t Engine::shared_builds() const {
  return impl_->constructor_->figures().shared_buckets;
}

std::vector<ShareChange> Engine::share_changes() const {
  return impl_->planner_->share_changes();
}

std::vector<ProfileSpan> Engine::source_timeline() const {
  return impl_->planner_->timeline();
}

std::vector<int64_t> Engine::blanked_payloads() const {
  return impl_->planner_->sources().blanked_payloads();
}

std::vector<int64_t> Engine::skipped_files() const {
  return impl_->planner_->sources().skipped_files();
}

std::vector<int64_t> Engine::unreadable_files() const {
  return impl_->planner_->sources().unreadable_files();
}

int64_t Engine::local_micro_batches_per_step(int64_t step) const {
  return impl_->cursor_->per_step(step);
}

void Engine::Stop() { impl_->Stop(); }

}  // namespace braid
