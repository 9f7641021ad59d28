// braid::DataPlane (braid/dataplane.h): the builder's state is a Config and what the
// calls said; Plan() applies the broadcast dimensions and validates.
#include "braid/dataplane.h"

#include <cmath>
#include <sstream>

#include "braid/config/config.h"
#include "braid/config/job_config_internal.h"

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

class DataPlane::Impl {
 public:
  explicit Impl(Config base) : config(std::move(base)) {
    const char* axes[] = {"dp", "cp", "world"};
    axis = axes[static_cast<int>(config.topology.distribute)];
  }

  void Fail(Status st) {
    if (status.ok()) status = std::move(st);
  }
  int SourceIndex(const std::string& name) const;
  // Sets `t`'s broadcast flags from the BroadcastAt calls (see BroadcastAt).
  void ApplyBroadcast(Topology* t) const;

  Config config;
  Status status;
  bool mixed = false;
  bool phased = false;       // Phase() was called: the base's phases are replaced
  bool distributed = false;  // Distribute() was called
  std::string axis = "dp";
  std::vector<std::string> broadcast;  // BroadcastAt's dimensions, in call order
};

DataPlane::DataPlane(const JobConfig& base)
    : impl_(std::make_unique<Impl>(JobConfigInternal::Get(base))) {}
DataPlane::~DataPlane() = default;
DataPlane::DataPlane(const DataPlane& other)
    : impl_(std::make_unique<Impl>(*other.impl_)) {}
DataPlane& DataPlane::operator=(const DataPlane& other) {
  if (this != &other) impl_ = std::make_unique<Impl>(*other.impl_);
  return *this;
}
DataPlane::DataPlane(DataPlane&& other) noexcept = default;
DataPlane& DataPlane::operator=(DataPlane&& other) noexcept = default;

const Status& DataPlane::status() const { return impl_->status; }
const std::string& DataPlane::distribute_axis() const { return impl_->axis; }

int DataPlane::Impl::SourceIndex(const std::string& name) const {
  for (size_t i = 0; i < config.sources.size(); ++i) {
    if (config.sources[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

DataPlane& DataPlane::Mix(const std::string& source, double weight) {
  WeightSchedule ws;
  ws.points = {{0, weight}};
  const std::string path = "mix." + source;
  Status st = CheckWeight(weight, path);
  if (!st.ok()) {
    impl_->Fail(std::move(st));
    return *this;
  }
  return Mix(source, std::move(ws));
}

DataPlane& DataPlane::Mix(const std::string& source, WeightSchedule weight) {
  const std::string path = "mix." + source;
  const int i = impl_->SourceIndex(source);
  if (i < 0) {
    std::string names;
    for (const auto& s : impl_->config.sources)
      names += (names.empty() ? "" : ", ") + s.name;
    impl_->Fail(ConfigError(path, "unknown source (sources: " + names + ")"));
    return *this;
  }
  // A constant weight is one point at step 0; report it as "mix.NAME", not
  // ".schedule[0]".
  Status st =
      (!weight.stepwise && weight.points.size() == 1 && weight.points[0].first == 0)
          ? CheckWeight(weight.points[0].second, path)
          : CheckSchedule(weight, path);
  if (!st.ok()) {
    impl_->Fail(std::move(st));
    return *this;
  }
  impl_->config.sources[static_cast<size_t>(i)].weight = std::move(weight);
  impl_->mixed = true;
  return *this;
}

DataPlane& DataPlane::Mix(
    const std::vector<std::pair<std::string, WeightSchedule>>& weights) {
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
    impl_->Fail(ConfigError(
        "distribute", "unknown axis '" + axis + "' (must be one of dp | cp | world)"));
    return *this;
  }
  if (group <= 0) {
    impl_->Fail(
        ConfigError("distribute.group", "must be > 0, got " + std::to_string(group)));
    return *this;
  }
  impl_->axis = axis;
  impl_->distributed = true;
  impl_->config.topology.distribute = a;
  impl_->config.topology.group = group;
  return *this;
}

DataPlane& DataPlane::Cost(double attn, double linear) {
  if (!std::isfinite(attn) || attn < 0) {
    impl_->Fail(
        ConfigError("cost.attn", "must be a finite number >= 0, got " + Num(attn)));
    return *this;
  }
  if (!std::isfinite(linear) || linear < 0) {
    impl_->Fail(
        ConfigError("cost.linear", "must be a finite number >= 0, got " + Num(linear)));
    return *this;
  }
  impl_->config.balance.attn = attn;
  impl_->config.balance.linear = linear;
  return *this;
}

DataPlane& DataPlane::Cost(double attn, double linear, double vision,
                           const std::string& mode) {
  if (!std::isfinite(vision) || vision < 0) {
    impl_->Fail(
        ConfigError("cost.vision", "must be a finite number >= 0, got " + Num(vision)));
    return *this;
  }
  BalanceConfig::CostMode m;
  if (mode == "hybrid") {
    m = BalanceConfig::CostMode::kHybrid;
  } else if (mode == "backbone") {
    m = BalanceConfig::CostMode::kBackbone;
  } else {
    impl_->Fail(ConfigError(
        "cost.mode", "unknown mode '" + mode + "' (must be one of hybrid | backbone)"));
    return *this;
  }
  Cost(attn, linear);
  if (impl_->status.ok()) {
    impl_->config.balance.vision = vision;
    impl_->config.balance.cost_mode = m;
  }
  return *this;
}

DataPlane& DataPlane::Phase(
    int64_t until_step, int64_t seq_len,
    const std::vector<std::pair<std::string, WeightSchedule>>& weights) {
  if (!impl_->phased) {
    impl_->config.phases.clear();
    impl_->phased = true;
  }
  const std::string path = "phase[" + std::to_string(impl_->config.phases.size()) + "]";
  if (until_step <= 0 || (!impl_->config.phases.empty() &&
                          until_step <= impl_->config.phases.back().until_step)) {
    impl_->Fail(ConfigError(path + ".until_step",
                            "must be > 0 and greater than the previous phase's, got " +
                                std::to_string(until_step)));
    return *this;
  }
  if (seq_len < 0) {
    impl_->Fail(
        ConfigError(path + ".seq_len", "must be > 0, got " + std::to_string(seq_len)));
    return *this;
  }
  PhaseConfig phase;
  phase.until_step = until_step;
  phase.seq_len = seq_len == 0 ? impl_->config.batch.seq_len : seq_len;
  phase.weights.resize(impl_->config.sources.size());
  for (const auto& [name, ws] : weights) {
    const std::string wpath = path + ".weights." + name;
    const int i = impl_->SourceIndex(name);
    if (i < 0) {
      impl_->Fail(ConfigError(wpath, "is not a source name"));
      return *this;
    }
    Status st = (!ws.stepwise && ws.points.size() == 1 && ws.points[0].first == 0)
                    ? CheckWeight(ws.points[0].second, wpath)
                    : CheckSchedule(ws, wpath);
    if (!st.ok()) {
      impl_->Fail(std::move(st));
      return *this;
    }
    phase.weights[static_cast<size_t>(i)] = ws;
  }
  impl_->config.phases.push_back(std::move(phase));
  return *this;
}

DataPlane& DataPlane::Balance(const std::string& method) {
  if (method == "karmarkar_karp") {
    impl_->config.balance.algorithm = BalanceAlgorithm::kKarmarkarKarp;
  } else if (method == "greedy") {
    impl_->config.balance.algorithm = BalanceAlgorithm::kGreedy;
  } else if (method == "none") {
    impl_->config.balance.algorithm = BalanceAlgorithm::kNone;
  } else {
    impl_->Fail(
        ConfigError("balance", "unknown method '" + method +
                                   "' (must be one of karmarkar_karp | greedy | none)"));
  }
  return *this;
}

DataPlane& DataPlane::BroadcastAt(const std::string& dim) {
  if (dim == "tp" || dim == "pp") {
    for (const auto& d : impl_->broadcast) {
      if (d == dim) return *this;
    }
    impl_->broadcast.push_back(dim);
  } else if (dim == "dp") {
    impl_->Fail(ConfigError(
        "broadcast_at", "'dp' ranks receive different micro-batches (use distribute)"));
  } else if (dim == "cp") {
    impl_->Fail(ConfigError("broadcast_at",
                            "'cp' ranks receive slices of each sequence, not copies "
                            "(docs/parallelism.md)"));
  } else {
    impl_->Fail(ConfigError("broadcast_at",
                            "unknown dimension '" + dim + "' (must be one of tp | pp)"));
  }
  return *this;
}

std::vector<std::string> DataPlane::broadcast_dims() const {
  Topology t = impl_->config.topology;
  impl_->ApplyBroadcast(&t);
  std::vector<std::string> dims;
  if (!t.distributed(Dim::kTp)) dims.push_back("tp");
  if (!t.distributed(Dim::kPp)) dims.push_back("pp");
  return dims;
}

void DataPlane::Impl::ApplyBroadcast(Topology* t) const {
  if (t->distribute != Topology::Axis::kWorld) {
    t->broadcast_tp = t->broadcast_pp = true;
    return;
  }
  // distribute("world"): only what BroadcastAt named (a base with distribute: world keeps
  // its own broadcast_at when BroadcastAt was not called).
  if (broadcast.empty() && !distributed) return;
  t->broadcast_tp = t->broadcast_pp = false;
  for (const auto& d : broadcast) (d == "tp" ? t->broadcast_tp : t->broadcast_pp) = true;
}

Result<JobConfig> DataPlane::Plan() const {
  ARROW_RETURN_NOT_OK(impl_->status);
  Config config = impl_->config;
  impl_->ApplyBroadcast(&config.topology);
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
    if (impl_->mixed && detail != nullptr && detail->where() == "sources") {
      std::string msg = st.message();
      const std::string prefix = "sources: ";
      if (msg.rfind(prefix, 0) == 0) msg = msg.substr(prefix.size());
      return ConfigError("mix", msg);
    }
    return st;
  }
  return JobConfigInternal::Wrap(std::move(config));
}

}  // namespace braid
