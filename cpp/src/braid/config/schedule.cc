// Weights over steps: the parsing of weight schedules and phases (config_internal.h), and
// what the planner asks of them: WeightSchedule::At and Config's per-step accessors
// (PhaseAt, SeqLenAt, WeightAt; docs/planner.md).
//
// Thread-safe: the accessors read an immutable Config.
#include <algorithm>
#include <iterator>
#include <unordered_map>

#include "braid/config/config.h"
#include "braid/config/config_internal.h"
#include "braid/config/limits_internal.h"

namespace braid {
namespace internal {

Result<WeightSchedule> ParseWeight(const YAML::Node& node, const std::string& path) {
  WeightSchedule ws;
  if (node.IsScalar()) {
    ARROW_ASSIGN_OR_RAISE(double w, Weight(node, path));
    ws.points = {{0, w}};
    return ws;
  }
  ARROW_RETURN_NOT_OK(CheckMap(node, path, {"schedule", "steps"}));
  // Planner: {steps: ...} is piecewise constant, {schedule: ...} piecewise linear.
  if (node["schedule"] && node["steps"]) {
    return ConfigError(Join(path, "steps"), "give either schedule or steps, not both");
  }
  ws.stepwise = static_cast<bool>(node["steps"]);
  const std::string spath = Join(path, ws.stepwise ? "steps" : "schedule");
  const YAML::Node sched = node[ws.stepwise ? "steps" : "schedule"];
  if (!sched || !sched.IsSequence() || sched.size() == 0) {
    return ConfigError(spath, "must be a non-empty list of [step, weight] pairs");
  }
  ARROW_RETURN_NOT_OK(Visit(sched.size(), spath));
  ws.points.clear();
  for (size_t i = 0; i < sched.size(); ++i) {
    const std::string ipath = Index(spath, i);
    const YAML::Node pt = sched[i];
    if (!pt.IsSequence() || pt.size() != 2) {
      return ConfigError(ipath, "must be a [step, weight] pair");
    }
    ARROW_ASSIGN_OR_RAISE(int64_t step,
                          Scalar<int64_t>(pt[0], Index(ipath, 0), "a step"));
    ARROW_ASSIGN_OR_RAISE(double w, Weight(pt[1], Index(ipath, 1)));
    if (step < 0 || (!ws.points.empty() && step <= ws.points.back().first)) {
      return ConfigError(Index(ipath, 0), "steps must be >= 0 and strictly increasing");
    }
    ws.points.emplace_back(step, w);
  }
  return ws;
}

Result<std::vector<PhaseConfig>> ParsePhases(const YAML::Node& node, const Config& c) {
  if (!node.IsSequence()) {
    return ConfigError("phases", "must be a list of {until_step, seq_len, weights}");
  }
  ARROW_RETURN_NOT_OK(Visit(node.size(), "phases"));
  std::unordered_map<std::string, size_t> index;  // source name -> config order
  for (size_t k = 0; k < c.sources.size(); ++k) index.emplace(c.sources[k].name, k);
  std::vector<PhaseConfig> out;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string path = Index("phases", i);
    const YAML::Node ph = node[i];
    ARROW_RETURN_NOT_OK(CheckMap(ph, path, {"until_step", "seq_len", "weights"}));
    PhaseConfig phase;
    if (!ph["until_step"]) return ConfigError(Join(path, "until_step"), "is required");
    ARROW_ASSIGN_OR_RAISE(phase.until_step,
                          PositiveInt(ph["until_step"], Join(path, "until_step")));
    if (!out.empty() && phase.until_step <= out.back().until_step) {
      return ConfigError(Join(path, "until_step"),
                         "must be greater than the previous phase's (" +
                             std::to_string(out.back().until_step) + ")");
    }
    phase.seq_len = c.batch.seq_len;
    if (ph["seq_len"]) {
      ARROW_ASSIGN_OR_RAISE(phase.seq_len,
                            PositiveInt(ph["seq_len"], Join(path, "seq_len")));
    }
    phase.weights.resize(c.sources.size());
    if (const YAML::Node w = ph["weights"]) {
      const std::string wpath = Join(path, "weights");
      if (!w.IsMap()) return ConfigError(wpath, "must map source names to weights");
      ARROW_RETURN_NOT_OK(Visit(w.size(), wpath));
      std::vector<bool> given(c.sources.size(), false);
      for (const auto& kv : w) {
        if (!kv.first.IsScalar()) {
          return ConfigError(wpath,
                             "keys must be source names" + Position(kv.first.Mark()));
        }
        const std::string name = kv.first.Scalar();
        const auto it = index.find(name);
        if (it == index.end()) {
          return ConfigError(Join(wpath, name), "is not a source name");
        }
        const size_t k = it->second;
        if (given[k]) return ConfigError(Join(wpath, name), "appears twice");
        given[k] = true;
        ARROW_ASSIGN_OR_RAISE(phase.weights[k],
                              ParseWeight(kv.second, Join(wpath, name)));
      }
    }
    out.push_back(std::move(phase));
  }
  return out;
}

}  // namespace internal

double WeightSchedule::At(int64_t step) const {
  if (step <= points.front().first) return points.front().second;
  // Binary searches (points sorted by step): a schedule may have many points.
  const auto by_step = [](const std::pair<int64_t, double>& p, int64_t s) {
    return p.first < s;
  };
  if (stepwise) {  // planner: piecewise constant, the last point at or before `step`
    const auto after = std::upper_bound(
        points.begin(), points.end(), step,
        [](int64_t s, const std::pair<int64_t, double>& p) { return s < p.first; });
    return std::prev(after)->second;
  }
  // The first point at or after `step` (not the first point: step > its step).
  const auto it = std::lower_bound(points.begin(), points.end(), step, by_step);
  if (it == points.end()) return points.back().second;
  const auto& [s0, w0] = *std::prev(it);
  const auto& [s1, w1] = *it;
  const double t = static_cast<double>(step - s0) / static_cast<double>(s1 - s0);
  return w0 + t * (w1 - w0);
}

const PhaseConfig* Config::PhaseAt(int64_t step) const {
  // The first phase with step < until_step (until_step strictly increasing).
  const auto it = std::upper_bound(
      phases.begin(), phases.end(), step,
      [](int64_t s, const PhaseConfig& p) { return s < p.until_step; });
  return it == phases.end() ? nullptr : &*it;
}

int64_t Config::SeqLenAt(int64_t step) const {
  const PhaseConfig* p = PhaseAt(step);
  return p ? p->seq_len : batch.seq_len;
}

double Config::WeightAt(size_t source, int64_t step) const {
  const PhaseConfig* p = PhaseAt(step);
  if (p && source < p->weights.size() && p->weights[source]) {
    return p->weights[source]->At(step);
  }
  return sources[source].weight.At(step);
}

}  // namespace braid
