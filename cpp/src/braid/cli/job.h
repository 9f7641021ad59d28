// Whole jobs on the embedded runtime, as the CLI runs them: `plan` and `run`.
//
// Thread-compatible: each call owns its engine and loaders.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "braid/config/config.h"
#include "braid/exec/allocation.h"
#include "braid/service/profile_timeline.h"
#include "braid/plan/step_plan.h"
#include "braid/source/profile.h"
#include "braid/status.h"

namespace braid {

/// Plans `steps` steps from metadata alone (no payloads are read) and passes each step's
/// JSON line to `on_line`. Starts from `state_in` (empty: fresh). Returns the state
/// after the last step, as JSON.
Result<std::string> RunPlanJob(const Config& config, int64_t steps,
                               const std::string& state_in,
                               const std::function<Status(const std::string&)>& on_line);

struct RunSummary {
  int64_t steps = 0;
  int64_t tokens = 0;  ///< token slots received (documents and padding)
  int64_t micro_batches = 0;
  double seconds = 0;
  double tokens_per_s = 0;         ///< whole run, start-up (opening sources) included
  double steady_tokens_per_s = 0;  ///< after the first step (0 until two steps ran)
  double imbalance_mean = 0;
  double imbalance_max = 0;
  double sequential_imbalance_mean = 0;  ///< same sequences assigned in order
  int64_t peak_rss_bytes = 0;
  std::vector<std::string> source_names;
  std::vector<int64_t> source_tokens;
  std::vector<double> source_share;  ///< achieved share of tokens
  std::vector<double> target_share;  ///< mean normalized weight over the steps
  std::vector<int64_t> skipped;      ///< samples skipped per source, whole run
  /// Per source: payloads blanked after publishing (undecodable image bodies, skip).
  std::vector<int64_t> blanked;
  /// Per source: files skipped under on_error: skip, in whole or part (a footer or a row
  /// group that did not read; the rows of a skipped row group are among `skipped`).
  std::vector<int64_t> skipped_files;
  /// Per source: those of skipped_files that did not open, so their rows are
  /// unknown (not among `skipped`).
  std::vector<int64_t> skipped_files_rows_unknown;
  /// Per source: what loading it cost this process (source/profile.h), whole run.
  std::vector<SourceProfile> source_profile;
  /// The sources' shares each time runtime.autoscale changed them (exec/allocation.h).
  std::vector<ShareChange> share_changes;
  /// Per span of steps, what each source cost and the planner's wait on it (filled at
  /// the end of the run, not in the summaries handed to progress).
  std::vector<ProfileSpan> source_timeline;
  int64_t padding_tokens = 0;  ///< slots not filled by a document (slack, postponed images)
  int64_t multimodal_cut = 0;  ///< multimodal documents cut for lack of room (StepPlan)
  /// Multimodal documents deferred to a later step (StepPlan::multimodal_deferred).
  int64_t multimodal_deferred = 0;
  std::vector<double> step_imbalance;
  std::vector<double> step_seconds;  ///< wall time to receive each step's micro-batches
  // --- Planner: context and share drift (docs/plan-format.md) ---
  /// Per source: mean context / bound of its tokens over the run (planner.h ContextOf).
  std::vector<double> source_context;
  /// Per source: share drift after the last step (tokens received less its share of the
  /// tokens planned) and the largest |drift| over the steps, in tokens.
  std::vector<double> source_drift;
  std::vector<double> source_drift_max;
  int64_t max_seq_len = 0;  ///< the longest sequence of the run's steps
};


/// Builds a RunSummary step by step, from each step's plan figures and what the
/// simulated ranks received; both runtimes' `braid run` use it. Thread-compatible.
class RunRecorder {
 public:
  explicit RunRecorder(const Config& config);
  /// Records one step whose micro-batches were all received: `tokens` slots in
  /// `micro_batches` micro-batches, `step_seconds` after the previous step, `elapsed`
  /// since the run started.
  void AddStep(const PlanFigures& plan, int64_t tokens, int64_t micro_batches,
               double step_seconds, double elapsed);
  RunSummary& summary() { return summary_; }

 private:
  const Config& config_;
  RunSummary summary_;
  double imbalance_sum_ = 0, sequential_sum_ = 0;
  int64_t first_step_tokens_ = 0;
  std::vector<double> target_sum_;
  std::vector<double> context_sum_, bound_sum_;
};

/// Runs the whole pipeline for `steps` steps with every DP rank simulated in this process:
/// receives every micro-batch of every rank, as trainer ranks would, and measures.
/// `progress` (may be empty) is called after each step with the summary so far.
Result<RunSummary> RunJob(const Config& config, int64_t steps,
                          const std::function<void(const RunSummary&)>& progress);

/// Peak resident set size of this process, bytes.
int64_t PeakRssBytes();

}  // namespace braid
