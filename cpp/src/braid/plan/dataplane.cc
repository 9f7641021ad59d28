#include "braid/plan/dataplane.h"

#include <cmath>
#include <sstream>

namespace braid {

namespace {

std::string Num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

Status CheckWeight(double w, const std::string& path) {
  if (!std::isfinite(w) || w < 0) {
    return ConfigError(path, "must be a finite number >= 0, got " + Num(w));
  }
  return Status::OK();
}

// The rules of config.cc's ParseWeight, with "mix.NAME" for "sources[i].weight".
Status CheckSchedule(const WeightSchedule& ws, const std::string& path) {
  const std::string spath = path + (ws.stepwise ? ".steps" : ".schedule");
  if (ws.points.empty()) {
    return ConfigError(spath, "must be a non-empty list of [step, weight] pairs");
  }
  for (size_t i = 0; i < ws.points.size(); ++i) {
    const std::string ipath = spath + "[" + std::to_string(i) + "]";
    const auto [step, w] = ws.points[i];
    if (step < 0 || (i > 0 && step <= ws.points[i - 1].first)) {
      return ConfigError(ipath + "[0]", "steps must be >= 0 and strictly increasing");
    }
    ARROW_RETURN_NOT_OK(CheckWeight(w, ipath + "[1]"));
  }
  return Status::OK();
}

}  // namespace

DataPlane::DataPlane(Config base) : config_(std::move(base)) {}

void DataPlane::Fail(Status st) {
  if (status_.ok()) status_ = std::move(st);
}

int DataPlane::SourceIndex(const std::string& name) const {
  for (size_t i = 0; i < config_.sources.size(); ++i) {
    if (config_.sources[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

DataPlane& DataPlane::Mix(const std::string& source, double weight) {
  WeightSchedule ws;
  ws.points = {{0, weight}};
  const std::string path = "mix." + source;
  Status st = CheckWeight(weight, path);
  if (!st.ok()) {
    Fail(std::move(st));
    return *this;
  }
  return Mix(source, std::move(ws));
}

DataPlane& DataPlane::Mix(const std::string& source, WeightSchedule weight) {
  const std::string path = "mix." + source;
  const int i = SourceIndex(source);
  if (i < 0) {
    std::string names;
    for (const auto& s : config_.sources) names += (names.empty() ? "" : ", ") + s.name;
    Fail(ConfigError(path, "unknown source (sources: " + names + ")"));
    return *this;
  }
  // A constant weight is one point at step 0; report it as "mix.NAME", not ".schedule[0]".
  Status st = (!weight.stepwise && weight.points.size() == 1 && weight.points[0].first == 0)
                  ? CheckWeight(weight.points[0].second, path)
                  : CheckSchedule(weight, path);
  if (!st.ok()) {
    Fail(std::move(st));
    return *this;
  }
  config_.sources[static_cast<size_t>(i)].weight = std::move(weight);
  mixed_ = true;
  return *this;
}

DataPlane& DataPlane::Mix(const std::vector<std::pair<std::string, WeightSchedule>>& weights) {
  for (const auto& [name, ws] : weights) Mix(name, ws);
  return *this;
}

DataPlane& DataPlane::Distribute(const std::string& axis) {
  if (axis != "dp" && axis != "cp" && axis != "world") {
    Fail(ConfigError("distribute",
                     "unknown axis '" + axis + "' (must be one of dp | cp | world)"));
    return *this;
  }
  axis_ = axis;
  return *this;
}

DataPlane& DataPlane::Cost(double attn, double linear) {
  if (!std::isfinite(attn) || attn < 0) {
    Fail(ConfigError("cost.attn", "must be a finite number >= 0, got " + Num(attn)));
    return *this;
  }
  if (!std::isfinite(linear) || linear < 0) {
    Fail(ConfigError("cost.linear", "must be a finite number >= 0, got " + Num(linear)));
    return *this;
  }
  config_.balance.attn = attn;
  config_.balance.linear = linear;
  return *this;
}

DataPlane& DataPlane::Balance(const std::string& method) {
  if (method == "karmarkar_karp") {
    config_.balance.algorithm = BalanceAlgorithm::kKarmarkarKarp;
  } else if (method == "greedy") {
    config_.balance.algorithm = BalanceAlgorithm::kGreedy;
  } else if (method == "none") {
    config_.balance.algorithm = BalanceAlgorithm::kNone;
  } else {
    Fail(ConfigError("balance", "unknown method '" + method +
                                    "' (must be one of karmarkar_karp | greedy | none)"));
  }
  return *this;
}

DataPlane& DataPlane::BroadcastAt(const std::string& dim) {
  if (dim == "tp" || dim == "pp") {
    for (const auto& d : broadcast_) {
      if (d == dim) return *this;
    }
    broadcast_.push_back(dim);
  } else if (dim == "dp") {
    Fail(ConfigError("broadcast_at",
                     "'dp' ranks receive different micro-batches (use distribute)"));
  } else if (dim == "cp") {
    Fail(ConfigError("broadcast_at",
                     "'cp' ranks receive slices of each sequence, not copies "
                     "(docs/parallelism.md)"));
  } else {
    Fail(ConfigError("broadcast_at",
                     "unknown dimension '" + dim + "' (must be one of tp | pp)"));
  }
  return *this;
}

std::vector<std::string> DataPlane::broadcast_dims() const {
  if (broadcast_.empty()) return {"tp", "pp"};
  return broadcast_;
}

Result<Config> DataPlane::Plan() const {
  ARROW_RETURN_NOT_OK(status_);
  const Topology& t = config_.topology;
  if (axis_ == "cp" && t.cp != 1) {
    return ConfigError("distribute",
                       "axis 'cp' with topology.cp = " + std::to_string(t.cp) +
                           " is not supported: the runtime builds one bucket per DP rank "
                           "and gives CP ranks slices of it (use 'dp')");
  }
  if (axis_ == "world" && t.world_size() != t.dp) {
    return ConfigError("distribute",
                       "axis 'world' with tp * pp * cp = " +
                           std::to_string(t.world_size() / t.dp) +
                           " is not supported: the runtime builds one bucket per DP rank "
                           "(use 'dp')");
  }
  Status st = ValidateConfig(config_);
  if (!st.ok()) {
    // Name the primitive that set what failed: all-zero weights come from mix.
    const ErrorDetail* detail = GetErrorDetail(st);
    if (mixed_ && detail != nullptr && detail->where() == "sources") {
      std::string msg = st.message();
      const std::string prefix = "sources: ";
      if (msg.rfind(prefix, 0) == 0) msg = msg.substr(prefix.size());
      return ConfigError("mix", msg);
    }
    return st;
  }
  return config_;
}

}  // namespace braid
