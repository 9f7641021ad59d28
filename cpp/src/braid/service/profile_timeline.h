// Each source's loading cost over the run, step by step: what the planner service's
// source streams cost (CPU, samples, tokens, bytes) and how long the planner waited on
// each of them, per span of steps (docs/sources.md, "Auto-partitioning": which source
// held the planning up, and when).
//
// The planner service records its streams' cumulative profiles (source/profile.h) as it
// begins planning each step, with the time and each source's threads (the workers its
// loaders' transform loops may use, as runtime.autoscale or sources[].workers set them);
// a span holds the difference between two records, its wall time, and per source the
// thread time it was given: its threads since a record times the time to the next. A
// source's read CPU over its thread time is how busy its threads were (1: they were the
// limit). Spans
// cover `width` steps each; when there would be more than `max_spans`, neighbours are
// merged in pairs and the width doubles, so a run of any length keeps at most
// `max_spans` spans of equal width (the last one open) and the sum of the spans is the
// whole run's cost since the first record. A step recorded again (planned again, or
// recorded twice as a service starts) adds what it cost since to the span open then
// (before the first span: to the first span).
//
// Thread-compatible (the planner service guards it with a mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "braid/source/profile.h"

namespace braid {

/// The cost of steps [first_step, end_step), per source in config order.
struct ProfileSpan {
  int64_t first_step = 0;
  int64_t end_step = 0;
  std::vector<SourceProfile> sources;
  int64_t wall_ns = 0;             ///< from the span's first record to its last
  std::vector<int64_t> thread_ns;  ///< per source: its threads x the time they held
};

class ProfileTimeline {
 public:
  static constexpr size_t kDefaultMaxSpans = 128;

  explicit ProfileTimeline(size_t max_spans = kDefaultMaxSpans);

  /// The sources' cumulative profiles as the planning of `step` begins, at `now_ns` (a
  /// steady clock), and each source's threads from now on (config order).
  void Record(int64_t step, const std::vector<SourceProfile>& cumulative, int64_t now_ns,
              const std::vector<int64_t>& threads);

  /// The spans so far, oldest first.
  const std::vector<ProfileSpan>& spans() const { return spans_; }
  /// Steps per span (the last one may hold fewer).
  int64_t width() const { return width_; }

 private:
  size_t max_spans_;
  int64_t width_ = 1;
  bool recorded_ = false;
  int64_t last_step_ = 0;
  std::vector<SourceProfile> last_;
  int64_t last_ns_ = 0;
  std::vector<int64_t> last_threads_;  // each source's threads since the last record
  ProfileSpan before_;                 // recorded before the first span
  std::vector<ProfileSpan> spans_;
};

}  // namespace braid
