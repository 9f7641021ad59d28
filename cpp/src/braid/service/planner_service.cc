#include "braid/service/planner_service.h"

#include <chrono>
#include <cmath>
#include <limits>

#include "braid/exec/allocation.h"
#include "braid/exec/budget.h"
#include "braid/plan/planner.h"
#include "braid/service/wire.h"

namespace braid {
namespace {

// The PlannedStep of `plan`, holding what `options` ask for.
std::shared_ptr<const PlannedStep> MakePlanned(StepPlan plan, const Config& config,
                                               const PlannerService::Options& options) {
  auto out = std::make_shared<PlannedStep>();
  out->step = plan.step;
  out->state_before = plan.state_before;
  out->state_after = plan.state_after;
  out->figures = FiguresOf(plan, config);
  if (options.encode) {
    out->encoded = EncodeStepPlan(plan);
    out->state_before_json = PlannerStateToJson(plan.state_before, config);
    out->state_after_json = PlannerStateToJson(plan.state_after, config);
  }
  if (options.keep_plan) out->plan = std::make_shared<const StepPlan>(std::move(plan));
  return out;
}

}  // namespace

PlannerService::PlannerService(const Config& config, Options options,
                               const PlannerState& start)
    : config_(config),
      options_(std::move(options)),
      state_(config_, start, options_.state),
      next_(start.step) {}

PlannerService::OpenSources PlannerService::MetadataOnly(const Config& config) {
  return [config](const PlannerState& at) {
    return SourceSet::Open(config, at, SourceService::Stream::kMetadata, /*serve=*/false);
  };
}

Result<std::unique_ptr<PlannerService>> PlannerService::Make(const Config& config,
                                                             const PlannerState& start,
                                                             OpenSources open,
                                                             Options options,
                                                             const std::string& journal) {
  std::unique_ptr<PlannerService> service(
      new PlannerService(config, std::move(options), start));
  if (!journal.empty()) ARROW_RETURN_NOT_OK(service->state_.Restore(journal));
  const PlannerState from = service->state_.resume_state();
  service->open_ = std::move(open);
  ARROW_ASSIGN_OR_RAISE(service->sources_, service->open_(from));
  ARROW_ASSIGN_OR_RAISE(service->planner_,
                        Planner::Make(config, service->sources_->streams(), from));
  // Every source's first read is queued now, in the order the planner asks (an inactive
  // source's at its first Next()).
  service->Rescale(from.step);
  service->sources_->Start();
  if (service->options_.background) {
    service->thread_ = std::thread([s = service.get()] { s->Loop(); });
  }
  return service;
}

PlannerService::~PlannerService() {
  Stop();
  planner_.reset();  // holds the streams; the sources outlive it
}

void PlannerService::Stop() {
  // Never taken by the planning thread, so holding it while joining cannot deadlock.
  std::lock_guard<std::mutex> stopping(stop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  cv_.notify_all();
  // A planner blocked on a stream returns Cancelled once the streams stop.
  if (sources_) {
    for (const auto& s : sources_->services()) s->RequestStop();
  }
  if (thread_.joinable()) thread_.join();
  if (sources_) sources_->Stop();
}

void PlannerService::Rescale(int64_t step) {
  std::lock_guard<std::mutex> lock(shares_mu_);
  const std::vector<SourceProfile> profiles = sources_->profiles();
  if (config_.runtime.autoscale) {
    std::vector<SourceShare> shares =
        AllocateSources(config_, step, profiles, sources_->threads(),
                        MemoryBudgetBytes(config_), shares_);
    if (shares != shares_) {
      sources_->SetShares(shares);
      shares_ = shares;
      if (share_changes_.size() < kMaxShareChanges) {
        share_changes_.push_back(ShareChange{step, std::move(shares)});
      }
    }
  }
  // The costs so far, and each source's threads from now on.
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  timeline_.Record(step, profiles,
                   std::chrono::duration_cast<std::chrono::nanoseconds>(now).count(),
                   sources_->workers());
}

PayloadRef PlannerService::KeptPayload(int32_t source, int32_t file, int64_t row) const {
  if (!options_.index_payloads) return PayloadRef();
  std::lock_guard<std::mutex> lock(mu_);
  return state_.KeptPayload(source, file, row);
}

std::vector<ProfileSpan> PlannerService::timeline() const {
  std::lock_guard<std::mutex> lock(shares_mu_);
  return timeline_.spans();
}

std::vector<ShareChange> PlannerService::share_changes() const {
  std::lock_guard<std::mutex> lock(shares_mu_);
  return share_changes_;
}

Result<std::shared_ptr<const PlannedStep>> PlannerService::PlanNext() {
  Rescale(planner_->state().step);
  ARROW_ASSIGN_OR_RAISE(StepPlan plan, planner_->PlanStep());
  if (options_.on_plan) options_.on_plan(plan);
  return MakePlanned(std::move(plan), config_, options_);
}

void PlannerService::ApplyAndCommit(const PlannerServiceState::Update& update,
                                    std::unique_lock<std::mutex>* lock) {
  const bool changed = state_.Apply(update);
  cv_.notify_all();
  if (!changed || !options_.commit) return;
  const std::string journal = state_.Journal();
  const int64_t version = ++journal_version_;
  lock->unlock();
  {
    std::lock_guard<std::mutex> commit(commit_mu_);
    if (version > committed_version_) {  // a newer journal may have gone out already
      options_.commit(journal);
      committed_version_ = version;
    }
  }
  lock->lock();
}

void PlannerService::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopped_ || state_.next_step() < state_.horizon(); });
    if (stopped_) return;
    const int64_t step = state_.next_step();
    lock.unlock();
    Result<std::shared_ptr<const PlannedStep>> planned;
    {
      std::lock_guard<std::mutex> plan(plan_mu_);
      planned = PlanNext();
    }
    lock.lock();
    if (!planned.ok()) {  // reported to every waiter of this step and later ones
      error_ = planned.status();
      error_step_ = step;
      cv_.notify_all();
      return;
    }
    ApplyAndCommit(PlannerServiceState::Planned{std::move(*planned)}, &lock);
  }
}

Result<std::shared_ptr<const PlannedStep>> PlannerService::Plan(int64_t step,
                                                                double timeout_s) {
  // An infinite timeout (the embedded runtime: nothing crosses a process) waits as long
  // as the planning takes.
  const bool forever = !std::isfinite(timeout_s);
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(forever ? 0.0 : timeout_s));
  std::unique_lock<std::mutex> lock(mu_);
  if (step < state_.first_step()) {
    return ConfigError("step " + std::to_string(step),
                       "before the job's first step " +
                           std::to_string(state_.first_step()));
  }
  ApplyAndCommit(PlannerServiceState::Asked{step}, &lock);
  if (!options_.background) {  // plan on this thread, one caller at a time
    lock.unlock();
    std::lock_guard<std::mutex> plan(plan_mu_);
    lock.lock();
    while (!stopped_ && error_.ok() && state_.next_step() <= step) {
      const int64_t next = state_.next_step();
      lock.unlock();
      auto planned = PlanNext();
      lock.lock();
      if (!planned.ok()) {
        error_ = planned.status();
        error_step_ = next;
        break;
      }
      ApplyAndCommit(PlannerServiceState::Planned{std::move(*planned)}, &lock);
    }
  }
  while (true) {
    if (auto held = state_.Held(step)) return held;
    if (step < state_.next_step()) break;  // planned and dropped: plan it again
    if (!error_.ok() && step >= error_step_) return error_;
    if (stopped_) return Status::Cancelled("the planner service was stopped");
    if (forever) {
      cv_.wait(lock);
      continue;
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
        state_.Held(step) == nullptr && step >= state_.next_step() && error_.ok() &&
        !stopped_) {
      return TimeoutError("planner", "step " + std::to_string(step) +
                                         ": not planned within " +
                                         std::to_string(timeout_s) +
                                         " s (runtime.timeout_s)");
    }
  }
  if (!options_.replay) {
    return ConfigError("step " + std::to_string(step),
                       "no longer held by the planner (it keeps " +
                           std::to_string(options_.state.keep_steps) + " steps)");
  }
  const PlannerState from = state_.CheckpointBefore(step);
  lock.unlock();
  auto replayed = Replay(step, from);
  lock.lock();
  if (replayed.ok()) state_.Apply(PlannerServiceState::Replayed{step});
  return replayed;
}

Result<std::shared_ptr<const PlannedStep>> PlannerService::Replay(int64_t step,
                                                                  PlannerState from) {
  // A step older than the held ones (a consumer far behind, or restarted): the plan is
  // a pure function of (config, state), so it is the one handed out before.
  ARROW_ASSIGN_OR_RAISE(auto sources,
                        options_.reopen ? options_.reopen(from) : open_(from));
  ARROW_ASSIGN_OR_RAISE(auto planner, Planner::Make(config_, sources->streams(), from));
  sources->Start();
  while (true) {
    ARROW_ASSIGN_OR_RAISE(StepPlan plan, planner->PlanStep());
    if (plan.step == step) return MakePlanned(std::move(plan), config_, options_);
  }
}

Result<std::shared_ptr<const PlannedStep>> PlannerService::Next() {
  ARROW_ASSIGN_OR_RAISE(auto planned,
                        Plan(next_, std::numeric_limits<double>::infinity()));
  ++next_;
  return planned;
}

Result<int64_t> PlannerService::Attach(const std::string& client) {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_.ended()) {
    // The runtime stops an ended job's roles (docs/distributed.md): a rank that arrives
    // now would be served by roles about to go, so it attaches again to a new job.
    return UnavailableError("planner", "the job ended (its last rank detached) and is "
                                       "stopping; attach again to start it anew");
  }
  ApplyAndCommit(PlannerServiceState::Attached{client}, &lock);
  return state_.clients();
}

int64_t PlannerService::Detach(const std::string& client) {
  std::unique_lock<std::mutex> lock(mu_);
  ApplyAndCommit(PlannerServiceState::Detached{client}, &lock);
  return state_.clients();
}

PlannerService::Figures PlannerService::figures() const {
  std::lock_guard<std::mutex> lock(mu_);
  Figures f;
  f.planned_through = state_.next_step() - 1;
  f.held_steps = state_.held_steps();
  f.replayed_steps = state_.replays();
  f.restored_from = state_.restored_from();
  f.clients = state_.clients();
  return f;
}

}  // namespace braid
