#include "braid/cli/job.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>


#include "braid/plan/planner.h"
#include "braid/runtime/engine.h"
#include "braid/service/planner_service.h"
#include "braid/exec/budget.h"
#include "braid/exec/read_pool.h"
#include "braid/source/source_loader.h"

namespace braid {

int64_t PeakRssBytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

Result<std::string> RunPlanJob(const Config& config, int64_t steps,
                               const std::string& state_in,
                               const std::function<Status(const std::string&)>& on_line) {
  if (steps < 0) return ConfigError("--steps", "must be >= 0");
  PlannerState state = Planner::InitialState(config);
  if (!state_in.empty()) {
    int64_t consumed = 0;
    ARROW_ASSIGN_OR_RAISE(state, PlannerStateFromJson(state_in, config, &consumed));
    if (consumed != 0) {
      return ConfigError("state.consumed_micro_batches",
                         "the state is inside a step; plan resumes at step boundaries");
    }
  }
  PlannerService::Options options;  // on this thread, each plan dropped once printed
  options.state.keep_steps = 0;
  options.replay = false;
  ARROW_ASSIGN_OR_RAISE(auto planner,
                        PlannerService::Make(config, state,
                                             PlannerService::MetadataOnly(config),
                                             std::move(options)));
  for (int64_t s = 0; s < steps; ++s) {
    ARROW_ASSIGN_OR_RAISE(auto planned, planner->Next());
    ARROW_RETURN_NOT_OK(on_line(StepPlanToJson(*planned->plan, config)));
    if (s + 1 == steps) return PlannerStateToJson(planned->state_after, config);
  }
  return PlannerStateToJson(state, config);
}

RunRecorder::RunRecorder(const Config& config) : config_(config) {
  const size_t n = config.sources.size();
  for (const auto& s : config.sources) summary_.source_names.push_back(s.name);
  summary_.source_tokens.assign(n, 0);
  summary_.target_share.assign(n, 0.0);
  summary_.skipped.assign(n, 0);
  target_sum_.assign(n, 0.0);
  summary_.source_context.assign(n, 1.0);
  summary_.source_drift.assign(n, 0.0);
  summary_.source_drift_max.assign(n, 0.0);
  context_sum_.assign(n, 0.0);
  bound_sum_.assign(n, 0.0);
}

void RunRecorder::AddStep(const PlanFigures& plan, int64_t tokens, int64_t micro_batches,
                          double step_seconds, double elapsed) {
  RunSummary& s = summary_;
  const size_t n = s.source_names.size();
  s.tokens += tokens;
  s.micro_batches += micro_batches;
  s.step_seconds.push_back(step_seconds);
  s.steps += 1;
  s.step_imbalance.push_back(plan.imbalance);
  sequential_sum_ += plan.sequential_imbalance;
  imbalance_sum_ += plan.imbalance;
  s.imbalance_max = std::max(s.imbalance_max, plan.imbalance);
  double total_weight = 0;
  for (size_t i = 0; i < n; ++i) total_weight += config_.WeightAt(i, plan.step);
  for (size_t i = 0; i < n; ++i) {
    if (i < plan.source_tokens.size()) s.source_tokens[i] += plan.source_tokens[i];
    target_sum_[i] += config_.WeightAt(i, plan.step) / total_weight;
  }
  if (plan.skipped.size() == n) s.skipped = plan.skipped;
  s.max_seq_len = std::max(s.max_seq_len, plan.seq_len);
  for (size_t i = 0; i < n; ++i) {
    if (i < plan.source_bound.size() && i < plan.source_context.size()) {
      context_sum_[i] += double(plan.source_context[i]);
      bound_sum_[i] += double(plan.source_bound[i]);
      if (bound_sum_[i] > 0) s.source_context[i] = context_sum_[i] / bound_sum_[i];
    }
    if (i < plan.source_drift.size()) {
      s.source_drift[i] = plan.source_drift[i];
      s.source_drift_max[i] =
          std::max(s.source_drift_max[i], std::abs(plan.source_drift[i]));
    }
  }
  s.padding_tokens += plan.padding_tokens;
  s.multimodal_cut += plan.multimodal_cut;
  s.multimodal_deferred += plan.multimodal_deferred;
  s.imbalance_mean = imbalance_sum_ / static_cast<double>(s.steps);
  s.sequential_imbalance_mean = sequential_sum_ / static_cast<double>(s.steps);
  s.seconds = elapsed;
  s.tokens_per_s = s.tokens / std::max(s.seconds, 1e-9);
  if (s.steps == 1) first_step_tokens_ = s.tokens;
  if (s.steps >= 2) {  // from the end of the first step: start-up excluded
    s.steady_tokens_per_s = double(s.tokens - first_step_tokens_) /
                            std::max(s.seconds - s.step_seconds.front(), 1e-9);
  }
  s.source_share.assign(n, 0.0);
  int64_t document_tokens = 0;  // the shares are of document tokens, not padding
  for (int64_t t : s.source_tokens) document_tokens += t;
  for (size_t i = 0; i < n; ++i) {
    s.source_share[i] = static_cast<double>(s.source_tokens[i]) /
                        static_cast<double>(std::max<int64_t>(document_tokens, 1));
    s.target_share[i] = target_sum_[i] / static_cast<double>(s.steps);
  }
}

Result<RunSummary> RunJob(const Config& config, int64_t steps,
                          const std::function<void(const RunSummary&)>& progress) {
  if (steps <= 0) return ConfigError("--steps", "must be > 0");
  RunRecorder recorder(config);
  // The planner thread reports each plan; the receiving loop below reads them per step.
  std::mutex mu;
  std::vector<PlanFigures> figures;  // GUARDED_BY(mu)
  Engine::Options options;
  options.on_plan = [&](const StepPlan& plan) {
    std::lock_guard<std::mutex> lock(mu);
    figures.push_back(FiguresOf(plan, config));
  };
  const auto t0 = std::chrono::steady_clock::now();
  ARROW_ASSIGN_OR_RAISE(auto engine, Engine::Make(config, std::move(options)));
  // Micro-batches per step change with a phase's seq_len (global_tokens is constant).
  const int64_t local_ranks = engine->local_micro_batches_per_step(0) /
                              config.MicroBatchesPerRankAt(0);
  auto last = t0;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t per_step = config.MicroBatchesPerRankAt(step) * local_ranks;
    int64_t tokens = 0;
    for (int64_t k = 0; k < per_step; ++k) {
      ARROW_ASSIGN_OR_RAISE(auto batch, engine->Next());
      tokens += batch->Find("input_ids")->num_elements();
    }
    const auto now = std::chrono::steady_clock::now();
    PlanFigures plan;
    {
      std::lock_guard<std::mutex> lock(mu);
      plan = figures[size_t(step)];
    }
    recorder.AddStep(plan, tokens, per_step,
                     std::chrono::duration<double>(now - last).count(),
                     std::chrono::duration<double>(now - t0).count());
    last = now;
    RunSummary& summary = recorder.summary();
    summary.blanked = engine->blanked_payloads();
    summary.source_profile = engine->source_profiles();
    summary.share_changes = engine->share_changes();
    summary.skipped_files = engine->skipped_files();
    summary.skipped_files_rows_unknown = engine->unreadable_files();
    if (progress) progress(summary);
  }
  // The timeline once, at the end: up to 128 spans a source, too much to copy (and to
  // hand to a progress callback) every step.
  recorder.summary().source_timeline = engine->source_timeline();
  recorder.summary().peak_rss_bytes = PeakRssBytes();
  return recorder.summary();
}

}  // namespace braid
