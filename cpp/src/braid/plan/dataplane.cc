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

DataPlane::DataPlane(Config base) : config_(std::move(base)) {
  const char* axes[] = {"dp", "cp", "world"};
  axis_ = axes[static_cast<int>(config_.topology.distribute)];
}

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

DataPlane& DataPlane::Distribute(const std::string& axis, int64_t group) {
  Topology::Axis a;
  if (axis == "dp") {
    a = Topology::Axis::kDp;
  } else if (axis == "cp") {
    a = Topology::Axis::kCp;
  } else if (axis == "world") {
    a = Topology::Axis::kWorld;
  } else {
    Fail(ConfigError("distribute",
                     "unknown axis '" + axis + "' (must be one of dp | cp | world)"));
    return *this;
  }
  if (group <= 0) {
    Fail(ConfigError("distribute.group", "must be > 0, got " + std::to_string(group)));
    return *this;
  }
  axis_ = axis;
  distributed_ = true;
  config_.topology.distribute = a;
  config_.topology.group = group;
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

DataPlane& DataPlane::Cost(double attn, double linear, double vision,
                           const std::string& mode) {
  if (!std::isfinite(vision) || vision < 0) {
    Fail(ConfigError("cost.vision", "must be a finite number >= 0, got " + Num(vision)));
    return *this;
  }
  BalanceConfig::CostMode m;
  if (mode == "hybrid") {
    m = BalanceConfig::CostMode::kHybrid;
  } else if (mode == "backbone") {
    m = BalanceConfig::CostMode::kBackbone;
  } else {
    Fail(ConfigError("cost.mode",
                     "unknown mode '" + mode + "' (must be one of hybrid | backbone)"));
    return *this;
  }
  Cost(attn, linear);
  if (status_.ok()) {
    config_.balance.vision = vision;
    config_.balance.cost_mode = m;
  }
  return *this;
}

DataPlane& DataPlane::Phase(int64_t until_step, int64_t seq_len,
                            const std::vector<std::pair<std::string, WeightSchedule>>& weights) {
  if (!phased_) {
    config_.phases.clear();
    phased_ = true;
  }
  const std::string path = "phase[" + std::to_string(config_.phases.size()) + "]";
  if (until_step <= 0 ||
      (!config_.phases.empty() && until_step <= config_.phases.back().until_step)) {
    Fail(ConfigError(path + ".until_step",
                     "must be > 0 and greater than the previous phase's, got " +
                         std::to_string(until_step)));
    return *this;
  }
  if (seq_len < 0) {
    Fail(ConfigError(path + ".seq_len", "must be > 0, got " + std::to_string(seq_len)));
    return *this;
  }
  PhaseConfig phase;
  phase.until_step = until_step;
  phase.seq_len = seq_len == 0 ? config_.batch.seq_len : seq_len;
  phase.weights.resize(config_.sources.size());
  for (const auto& [name, ws] : weights) {
    const std::string wpath = path + ".weights." + name;
    const int i = SourceIndex(name);
    if (i < 0) {
      Fail(ConfigError(wpath, "is not a source name"));
      return *this;
    }
    Status st = (!ws.stepwise && ws.points.size() == 1 && ws.points[0].first == 0)
                    ? CheckWeight(ws.points[0].second, wpath)
                    : CheckSchedule(ws, wpath);
    if (!st.ok()) {
      Fail(std::move(st));
      return *this;
    }
    phase.weights[static_cast<size_t>(i)] = ws;
  }
  config_.phases.push_back(std::move(phase));
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
  Topology t = config_.topology;
  ApplyBroadcast(&t);
  std::vector<std::string> dims;
  if (!t.distributed(Dim::kTp)) dims.push_back("tp");
  if (!t.distributed(Dim::kPp)) dims.push_back("pp");
  return dims;
}

void DataPlane::ApplyBroadcast(Topology* t) const {
  if (t->distribute != Topology::Axis::kWorld) {
    t->broadcast_tp = t->broadcast_pp = true;
    return;
  }
  // distribute("world"): only what BroadcastAt named (a base with distribute: world keeps
  // its own broadcast_at when BroadcastAt was not called).
  if (broadcast_.empty() && !distributed_) return;
  t->broadcast_tp = t->broadcast_pp = false;
  for (const auto& d : broadcast_) (d == "tp" ? t->broadcast_tp : t->broadcast_pp) = true;
}

Result<Config> DataPlane::Plan() const {
  ARROW_RETURN_NOT_OK(status_);
  Config config = config_;
  ApplyBroadcast(&config.topology);
  const Topology& t = config.topology;
  Status topo = CheckTopology(t);
  if (!topo.ok()) {
    return ConfigError("distribute.group",
                       "must divide the ranks that receive different buckets, got " +
                           std::to_string(t.group));
  }
  Status st = ValidateConfig(config);
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
  return config;
}

}  // namespace braid
