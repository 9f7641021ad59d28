#include "braid/service/profile_timeline.h"

#include <algorithm>
#include <utility>

namespace braid {
namespace {

SourceProfile Minus(const SourceProfile& a, const SourceProfile& b) {
  SourceProfile d;
  d.samples = a.samples - b.samples;
  d.tokens = a.tokens - b.tokens;
  d.rows_read = a.rows_read - b.rows_read;
  d.bytes_read = a.bytes_read - b.bytes_read;
  d.read_cpu_ns = a.read_cpu_ns - b.read_cpu_ns;
  d.payloads_finished = a.payloads_finished - b.payloads_finished;
  d.finish_cpu_ns = a.finish_cpu_ns - b.finish_cpu_ns;
  d.consumer_wait_ns = a.consumer_wait_ns - b.consumer_wait_ns;
  return d;
}

// Adds `more`'s costs, wall time and thread time to `into` (its steps are the caller's).
void Add(ProfileSpan* into, const ProfileSpan& more) {
  auto& sources = into->sources;
  if (sources.size() < more.sources.size()) sources.resize(more.sources.size());
  for (size_t i = 0; i < more.sources.size(); ++i) sources[i] += more.sources[i];
  auto& thread_ns = into->thread_ns;
  if (thread_ns.size() < more.thread_ns.size()) thread_ns.resize(more.thread_ns.size());
  for (size_t i = 0; i < more.thread_ns.size(); ++i) thread_ns[i] += more.thread_ns[i];
  into->wall_ns += more.wall_ns;
}

}  // namespace

ProfileTimeline::ProfileTimeline(size_t max_spans) : max_spans_(std::max<size_t>(2, max_spans)) {}

void ProfileTimeline::Record(int64_t step, const std::vector<SourceProfile>& cumulative,
                             int64_t now_ns, const std::vector<int64_t>& threads) {
  if (!recorded_) {
    recorded_ = true;
    last_step_ = step;
    last_ = cumulative;
    last_ns_ = now_ns;
    last_threads_ = threads;
    return;
  }
  // What the sources cost since the last record, how long that took, and the thread
  // time each was given (the threads it had since then).
  ProfileSpan delta;
  delta.sources.resize(cumulative.size());
  for (size_t i = 0; i < cumulative.size(); ++i) {
    delta.sources[i] = i < last_.size() ? Minus(cumulative[i], last_[i]) : cumulative[i];
  }
  delta.wall_ns = std::max<int64_t>(0, now_ns - last_ns_);
  delta.thread_ns.resize(last_threads_.size());
  for (size_t i = 0; i < last_threads_.size(); ++i) {
    delta.thread_ns[i] = last_threads_[i] * delta.wall_ns;
  }
  last_ = cumulative;
  last_ns_ = now_ns;
  last_threads_ = threads;
  if (step <= last_step_) {  // planned again: its cost goes to the span open now
    Add(spans_.empty() ? &before_ : &spans_.back(), delta);
    return;
  }
  // Steps [last_step_, step) were planned since the last record.
  delta.first_step = last_step_;
  delta.end_step = step;
  if (spans_.empty()) {
    Add(&delta, before_);  // what the first step's records before it cost
    before_ = ProfileSpan{};
    spans_.push_back(std::move(delta));
  } else if (spans_.back().end_step - spans_.back().first_step >= width_) {
    spans_.push_back(std::move(delta));
  } else {
    spans_.back().end_step = step;
    Add(&spans_.back(), delta);
  }
  last_step_ = step;
  if (spans_.size() > max_spans_) {  // merge neighbours in pairs; the width doubles
    std::vector<ProfileSpan> merged;
    for (size_t i = 0; i < spans_.size(); i += 2) {
      ProfileSpan s = std::move(spans_[i]);
      if (i + 1 < spans_.size()) {
        s.end_step = spans_[i + 1].end_step;
        Add(&s, spans_[i + 1]);
      }
      merged.push_back(std::move(s));
    }
    spans_ = std::move(merged);
    width_ *= 2;
  }
}

}  // namespace braid
