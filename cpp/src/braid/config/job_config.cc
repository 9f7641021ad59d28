// braid::JobConfig (braid/config.h): an immutable Config behind a shared pointer.
#include <utility>

#include "braid/config.h"
#include "braid/config/config.h"
#include "braid/config/job_config_internal.h"

namespace braid {

class JobConfig::Impl {
 public:
  explicit Impl(Config c) : config(std::move(c)) {}
  const Config config;
};

JobConfig::JobConfig(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

JobConfig JobConfigInternal::Wrap(Config config) {
  return JobConfig(std::make_shared<const JobConfig::Impl>(std::move(config)));
}

const Config& JobConfigInternal::Get(const JobConfig& job) { return job.impl_->config; }

Result<JobConfig> JobConfig::FromFile(const std::string& path) {
  ARROW_ASSIGN_OR_RAISE(Config config, LoadConfigFile(path));
  return JobConfigInternal::Wrap(std::move(config));
}

Result<JobConfig> JobConfig::FromString(const std::string& text,
                                        const std::string& base_dir) {
  ARROW_ASSIGN_OR_RAISE(Config config, ParseConfig(text, base_dir));
  return JobConfigInternal::Wrap(std::move(config));
}

Result<JobConfig> JobConfig::WithDataParallel(int64_t dp) const {
  Config copy = impl_->config;
  ARROW_RETURN_NOT_OK(SetDataParallel(&copy, dp));
  return JobConfigInternal::Wrap(std::move(copy));
}

uint64_t JobConfig::seed() const { return impl_->config.seed; }
int64_t JobConfig::seq_len() const { return impl_->config.batch.seq_len; }
int64_t JobConfig::SeqLenAt(int64_t step) const { return impl_->config.SeqLenAt(step); }
int64_t JobConfig::global_tokens() const { return impl_->config.batch.global_tokens; }
int64_t JobConfig::micro_batch_size() const {
  return impl_->config.batch.micro_batch_size;
}

TopologySizes JobConfig::topology() const {
  const Topology& t = impl_->config.topology;
  return TopologySizes{t.dp, t.tp, t.pp, t.cp};
}

int64_t JobConfig::num_buckets() const { return impl_->config.topology.buckets(); }
int64_t JobConfig::micro_batches_per_rank() const {
  return impl_->config.micro_batches_per_rank();
}
int64_t JobConfig::MicroBatchesPerRankAt(int64_t step) const {
  return impl_->config.MicroBatchesPerRankAt(step);
}
int64_t JobConfig::num_sources() const {
  return static_cast<int64_t>(impl_->config.sources.size());
}

std::vector<std::string> JobConfig::source_names() const {
  std::vector<std::string> names;
  names.reserve(impl_->config.sources.size());
  for (const auto& s : impl_->config.sources) names.push_back(s.name);
  return names;
}

std::string JobConfig::Fingerprint() const { return impl_->config.Fingerprint(); }

}  // namespace braid
