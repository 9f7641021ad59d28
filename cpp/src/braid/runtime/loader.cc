// braid::Loader (braid/loader.h): a rank -> its coordinates and bucket
// (client/topology.h), then an Engine that builds that one bucket and returns the rank's
// view of each micro-batch. The same steps as the Python Loader's
// (python/braid/loader.py).
#include "braid/loader.h"

#include <utility>

#include "braid/client/topology.h"
#include "braid/config/job_config_internal.h"
#include "braid/runtime/engine.h"

namespace braid {

class Loader::Impl {
 public:
  Impl(int64_t rank, RankCoords coords, int64_t bucket)
      : rank_(rank), coords_(coords), bucket_(bucket) {}

  const int64_t rank_;
  const RankCoords coords_;
  const int64_t bucket_;
  std::unique_ptr<Engine> engine_;  // copies the config it is made from
};

namespace {

Result<RankCoords> CoordsFor(const Topology& topology, const Loader::Options& options) {
  if (!options.coordinates) return CoordsOf(topology, options.rank);
  const RankCoordinates& c = *options.coordinates;
  const int64_t values[] = {c.dp, c.tp, c.pp, c.cp};
  const int64_t sizes[] = {topology.dp, topology.tp, topology.pp, topology.cp};
  const char* names[] = {"dp", "tp", "pp", "cp"};
  for (int d = 0; d < 4; ++d) {
    if (values[d] < 0 || values[d] >= sizes[d]) {
      return ConfigError("rank", std::string("coordinate ") + names[d] + " " +
                                     std::to_string(values[d]) +
                                     " is outside the topology (" + names[d] + " = " +
                                     std::to_string(sizes[d]) + ")");
    }
  }
  return RankCoords{c.dp, c.tp, c.pp, c.cp};
}

}  // namespace

Loader::Loader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Loader::~Loader() = default;

Result<std::unique_ptr<Loader>> Loader::Make(const JobConfig& config, Options options) {
  const Config& c = JobConfigInternal::Get(config);
  if (c.runtime.kind != RuntimeConfig::Kind::kLocal) {
    return ConfigError("runtime.kind",
                       "the C++ Loader embeds every role in this process and needs "
                       "'local'; the Ray runtime is served by the Python package "
                       "(braid.Loader)");
  }
  const Topology& t = c.topology;
  if (options.world_size != 0 && options.world_size != t.world_size()) {
    return ConfigError("world_size", std::to_string(options.world_size) +
                                         " does not match the topology (dp*tp*pp*cp = " +
                                         std::to_string(t.world_size()) + ")");
  }
  ARROW_ASSIGN_OR_RAISE(const RankCoords coords, CoordsFor(t, options));
  const int64_t bucket = BucketOf(t, coords);
  auto impl = std::make_unique<Impl>(RankOf(t, coords), coords, bucket);

  Engine::Options engine;
  engine.buckets = {bucket};
  engine.state_json = std::move(options.state_json);
  engine.view = coords;
  engine.split_context = options.split_context;
  ARROW_ASSIGN_OR_RAISE(impl->engine_, Engine::Make(c, std::move(engine)));
  return std::unique_ptr<Loader>(new Loader(std::move(impl)));
}

Result<std::shared_ptr<const Batch>> Loader::Next() { return impl_->engine_->Next(); }

std::string Loader::StateJson() const { return impl_->engine_->StateJson(); }

void Loader::Stop() { impl_->engine_->Stop(); }

int64_t Loader::rank() const { return impl_->rank_; }

RankCoordinates Loader::coordinates() const {
  const RankCoords& c = impl_->coords_;
  return RankCoordinates{c.dp, c.tp, c.pp, c.cp};
}

int64_t Loader::bucket() const { return impl_->bucket_; }

int64_t Loader::MicroBatchesAt(int64_t step) const {
  return impl_->engine_->local_micro_batches_per_step(step);
}

}  // namespace braid
