#include "braid/runtime/job.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include <nlohmann/json.hpp>

#include "braid/plan/planner.h"
#include "braid/runtime/engine.h"
#include "braid/source/budget.h"
#include "braid/source/read_pool.h"
#include "braid/source/source_loader.h"

namespace braid {

int64_t PeakRssBytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

Status CheckStateOrder(const std::string& state_json, const Config& config) {
  Config rows_only = config;
  for (auto& s : rows_only.sources) s.shuffle_window_bytes = 0;
  const std::string old_fp = rows_only.Fingerprint();
  if (old_fp == config.Fingerprint()) return Status::OK();
  nlohmann::json in = nlohmann::json::parse(state_json, nullptr, /*allow_exceptions=*/false);
  if (!in.is_object() || !in.contains("fingerprint") || !in["fingerprint"].is_string() ||
      in["fingerprint"].get<std::string>() != old_fp) {
    return Status::OK();
  }
  return ConfigError("state.fingerprint",
                     "the state was saved with shuffle windows bounded in rows only (the "
                     "order before sources[].shuffle_window_bytes); bounding them in bytes "
                     "changes the order of large row groups and windows. Resume it with "
                     "shuffle_window_bytes: 0 on every source, or start afresh");
}

Result<std::string> RunPlanJob(const Config& config, int64_t steps,
                               const std::string& state_in,
                               const std::function<Status(const std::string&)>& on_line) {
  if (steps < 0) return ConfigError("--steps", "must be >= 0");
  PlannerState state = Planner::InitialState(config);
  if (!state_in.empty()) {
    ARROW_RETURN_NOT_OK(CheckStateOrder(state_in, config));
    int64_t consumed = 0;
    ARROW_ASSIGN_OR_RAISE(state, PlannerStateFromJson(state_in, config, &consumed));
    if (consumed != 0) {
      return ConfigError("state.consumed_micro_batches",
                         "the state is inside a step; plan resumes at step boundaries");
    }
  }
  auto pool = std::make_shared<ReadPool>(ReadThreads(config));
  const std::vector<int64_t> shares = SourceShares(config);
  // The sources open (listing, footers) in parallel on the pool; the first error in
  // config order is returned.
  const int64_t n = static_cast<int64_t>(config.sources.size());
  std::vector<std::unique_ptr<SourceLoader>> loaders(static_cast<size_t>(n));
  std::vector<Status> opened(static_cast<size_t>(n));
  pool->ParallelFor(n, OpenThreads(config, *pool), [&](int64_t i) {
    SourceLoader::Options options;
    options.read_payloads = false;
    options.read_ahead_bytes = shares[size_t(i)];
    options.pool = pool;
    auto loader = SourceLoader::Make(config, static_cast<int32_t>(i),
                                     state.sources[size_t(i)].next, options);
    if (loader.ok()) {
      loaders[size_t(i)] = std::move(*loader);
    } else {
      opened[size_t(i)] = loader.status();
    }
  });
  for (const Status& st : opened) ARROW_RETURN_NOT_OK(st);
  std::vector<SampleStream*> streams;
  for (auto& loader : loaders) streams.push_back(loader.get());
  ARROW_ASSIGN_OR_RAISE(auto planner, Planner::Make(config, streams, state));
  for (auto& loader : loaders) loader->Start();  // first reads queued in planner order
  for (int64_t s = 0; s < steps; ++s) {
    ARROW_ASSIGN_OR_RAISE(StepPlan plan, planner->PlanStep());
    ARROW_RETURN_NOT_OK(on_line(StepPlanToJson(plan, config)));
  }
  for (auto& loader : loaders) loader->RequestStop();  // then each destructor waits
  return PlannerStateToJson(planner->state(), config);
}

Result<RunSummary> RunJob(const Config& config, int64_t steps,
                          const std::function<void(const RunSummary&)>& progress) {
  if (steps <= 0) return ConfigError("--steps", "must be > 0");
  const size_t n = config.sources.size();
  RunSummary summary;
  for (const auto& s : config.sources) summary.source_names.push_back(s.name);
  summary.source_tokens.assign(n, 0);
  summary.target_share.assign(n, 0.0);
  summary.skipped.assign(n, 0);

  // The planner thread reports each plan; the receiving loop below reads them per step.
  std::mutex mu;
  std::vector<double> imbalance;                      // GUARDED_BY(mu)
  std::vector<double> sequential;                     // GUARDED_BY(mu)
  std::vector<std::vector<int64_t>> tokens_by_step;   // GUARDED_BY(mu)
  std::vector<std::vector<int64_t>> skipped_by_step;  // GUARDED_BY(mu)
  std::vector<int64_t> padding_by_step;                // GUARDED_BY(mu)
  std::vector<int64_t> cut_by_step;                    // GUARDED_BY(mu)
  std::vector<int64_t> deferred_by_step;               // GUARDED_BY(mu)
  Engine::Options options;
  options.on_plan = [&](const StepPlan& plan) {
    std::lock_guard<std::mutex> lock(mu);
    imbalance.push_back(plan.imbalance);
    sequential.push_back(plan.sequential_imbalance);
    tokens_by_step.push_back(plan.source_tokens);
    std::vector<int64_t> skipped;
    for (const auto& c : plan.state_after.sources) skipped.push_back(c.skipped);
    skipped_by_step.push_back(std::move(skipped));
    int64_t filled = 0;
    for (int64_t t : plan.source_tokens) filled += t;
    padding_by_step.push_back(plan.seq_len * config.SequencesAt(plan.step) - filled);
    cut_by_step.push_back(plan.multimodal_cut);
    deferred_by_step.push_back(plan.multimodal_deferred);
  };
  const auto t0 = std::chrono::steady_clock::now();
  ARROW_ASSIGN_OR_RAISE(auto engine, Engine::Make(config, std::move(options)));
  // Micro-batches per step change with a phase's seq_len (global_tokens is constant).
  const int64_t local_ranks = engine->local_micro_batches_per_step(0) /
                              config.MicroBatchesPerRankAt(0);
  auto last = t0;
  double imbalance_sum = 0, sequential_sum = 0;
  int64_t first_step_tokens = 0;
  std::vector<double> target_sum(n, 0.0);
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t per_step = config.MicroBatchesPerRankAt(step) * local_ranks;
    for (int64_t k = 0; k < per_step; ++k) {
      ARROW_ASSIGN_OR_RAISE(auto batch, engine->Next());
      summary.tokens += batch->Find("input_ids")->num_elements();
      ++summary.micro_batches;
    }
    const auto now = std::chrono::steady_clock::now();
    summary.step_seconds.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
    summary.steps = step + 1;
    {
      std::lock_guard<std::mutex> lock(mu);
      summary.step_imbalance.push_back(imbalance[size_t(step)]);
      sequential_sum += sequential[size_t(step)];
      imbalance_sum += imbalance[size_t(step)];
      summary.imbalance_max = std::max(summary.imbalance_max, imbalance[size_t(step)]);
      double total_weight = 0;
      for (size_t i = 0; i < n; ++i) total_weight += config.WeightAt(i, step);
      for (size_t i = 0; i < n; ++i) {
        summary.source_tokens[i] += tokens_by_step[size_t(step)][i];
        target_sum[i] += config.WeightAt(i, step) / total_weight;
      }
      summary.skipped = skipped_by_step[size_t(step)];
      summary.padding_tokens += padding_by_step[size_t(step)];
      summary.multimodal_cut += cut_by_step[size_t(step)];
      summary.multimodal_deferred += deferred_by_step[size_t(step)];
    }
    summary.imbalance_mean = imbalance_sum / static_cast<double>(summary.steps);
    summary.sequential_imbalance_mean = sequential_sum / static_cast<double>(summary.steps);
    summary.seconds = std::chrono::duration<double>(now - t0).count();
    summary.tokens_per_s = summary.tokens / std::max(summary.seconds, 1e-9);
    if (step == 0) first_step_tokens = summary.tokens;
    if (summary.steps >= 2) {  // from the end of the first step: start-up excluded
      summary.steady_tokens_per_s =
          double(summary.tokens - first_step_tokens) /
          std::max(summary.seconds - summary.step_seconds.front(), 1e-9);
    }
    summary.blanked = engine->blanked_payloads();
    summary.skipped_files = engine->skipped_files();
    summary.skipped_files_rows_unknown = engine->unreadable_files();
    summary.source_share.assign(n, 0.0);
    int64_t document_tokens = 0;  // the shares are of document tokens, not padding
    for (int64_t t : summary.source_tokens) document_tokens += t;
    for (size_t i = 0; i < n; ++i) {
      summary.source_share[i] = static_cast<double>(summary.source_tokens[i]) /
                                static_cast<double>(std::max<int64_t>(document_tokens, 1));
      summary.target_share[i] = target_sum[i] / static_cast<double>(summary.steps);
    }
    if (progress) progress(summary);
  }
  summary.peak_rss_bytes = PeakRssBytes();
  return summary;
}

}  // namespace braid
