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

void Add(std::vector<SourceProfile>* into, const std::vector<SourceProfile>& more) {
  if (into->size() < more.size()) into->resize(more.size());
  for (size_t i = 0; i < more.size(); ++i) (*into)[i] += more[i];
}

}  // namespace

ProfileTimeline::ProfileTimeline(size_t max_spans) : max_spans_(std::max<size_t>(2, max_spans)) {}

void ProfileTimeline::Record(int64_t step, const std::vector<SourceProfile>& cumulative) {
  if (!recorded_) {
    recorded_ = true;
    last_step_ = step;
    last_ = cumulative;
    return;
  }
  std::vector<SourceProfile> delta(cumulative.size());
  for (size_t i = 0; i < cumulative.size(); ++i) {
    delta[i] = i < last_.size() ? Minus(cumulative[i], last_[i]) : cumulative[i];
  }
  last_ = cumulative;
  if (step <= last_step_) {  // planned again: its cost goes to the span open now
    Add(spans_.empty() ? &before_ : &spans_.back().sources, delta);
    return;
  }
  // Steps [last_step_, step) were planned since the last record.
  if (spans_.empty()) {
    Add(&delta, before_);  // what the first step's records before it cost
    before_.clear();
    spans_.push_back(ProfileSpan{last_step_, step, std::move(delta)});
  } else if (spans_.back().end_step - spans_.back().first_step >= width_) {
    spans_.push_back(ProfileSpan{last_step_, step, std::move(delta)});
  } else {
    spans_.back().end_step = step;
    Add(&spans_.back().sources, delta);
  }
  last_step_ = step;
  if (spans_.size() > max_spans_) {  // merge neighbours in pairs; the width doubles
    std::vector<ProfileSpan> merged;
    for (size_t i = 0; i < spans_.size(); i += 2) {
      ProfileSpan s = std::move(spans_[i]);
      if (i + 1 < spans_.size()) {
        s.end_step = spans_[i + 1].end_step;
        Add(&s.sources, spans_[i + 1].sources);
      }
      merged.push_back(std::move(s));
    }
    spans_ = std::move(merged);
    width_ *= 2;
  }
}

}  // namespace braid
