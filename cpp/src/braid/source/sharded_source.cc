#include "braid/source/sharded_source.h"

#include <algorithm>

namespace braid {

int64_t MinWindowsPerEpoch(const std::vector<SourceFiles::File>& files,
                           int64_t window_rows) {
  int64_t total = 0, largest = 0;
  for (const auto& f : files) {
    for (int64_t rows : f.row_group_rows) {
      total += rows;
      largest = std::max(largest, rows);
    }
  }
  if (total == 0) return 1;
  const int64_t most_per_window = window_rows + std::max<int64_t>(largest, 1) - 1;
  return (total + most_per_window - 1) / most_per_window;
}

int64_t MostLoaders(const std::vector<SourceFiles::File>& files, int64_t window_rows,
                    int64_t window_bytes) {
  int64_t cut = 0;  // units of two blocks or more
  for (const auto& f : files) {
    for (size_t rg = 0; rg < f.row_group_rows.size(); ++rg) {
      const int64_t bytes = rg < f.row_group_bytes.size() ? f.row_group_bytes[rg] : 0;
      cut += ReadInSeveralBlocks(f.row_group_rows[rg], bytes, window_bytes);
    }
  }
  return cut > 0 ? cut : MinWindowsPerEpoch(files, window_rows);
}

ShardedSource::ShardedSource(const Config& config, int32_t source_index, StreamPos start,
                             std::vector<std::unique_ptr<SourceLoader>> loaders)
    : seed_(config.seed),
      source_index_(source_index),
      window_rows_(config.sources[size_t(source_index)].shuffle_window_rows),
      window_bytes_(config.sources[size_t(source_index)].shuffle_window_bytes),
      loaders_(std::move(loaders)),
      next_(start) {
  if (loaders_.size() == 1) return;
  unit_owners_ = UnitOwners(loaders_.front()->file_list(), window_bytes_,
                            static_cast<int64_t>(loaders_.size()));
  // Normalize as SourceLoader::Make does: one past a window's end is the next window.
  LoadEpoch(next_.epoch);
  if (next_.offset == window_rows_of_epoch_[size_t(next_.window)]) {
    next_.offset = 0;
    if (++next_.window == static_cast<int64_t>(window_rows_of_epoch_.size())) {
      next_ = StreamPos{next_.epoch + 1, 0, 0};
      LoadEpoch(next_.epoch);
    }
  }
}

Result<std::unique_ptr<ShardedSource>> ShardedSource::Make(const Config& config,
                                                           int32_t source_index,
                                                           StreamPos start,
                                                           SourceLoader::Options options,
                                                           int64_t shards) {
  if (shards < 1) {
    return ConfigError("sources[" + std::to_string(source_index) + "].loaders",
                       "must be >= 1");
  }
  if (!options.skip_log) options.skip_log = SourceLoader::NewSkipLog();  // one per source
  const int64_t read_ahead = options.read_ahead_bytes;
  auto make = [&](int64_t k, int64_t n) {
    SourceLoader::Options o = options;
    o.shard_index = k;
    o.shard_count = n;
    o.read_ahead_bytes = std::max<int64_t>(1, read_ahead / n);
    return SourceLoader::Make(config, source_index, start, o);
  };
  std::vector<std::unique_ptr<SourceLoader>> loaders;
  ARROW_ASSIGN_OR_RAISE(auto first, make(0, shards));
  const SourceConfig& source = config.sources[size_t(source_index)];
  const int64_t n =
      std::min(shards, MostLoaders(first->file_list(), source.shuffle_window_rows,
                                   source.shuffle_window_bytes));
  if (n != shards) {
    ARROW_ASSIGN_OR_RAISE(first, make(0, n));
  }
  loaders.push_back(std::move(first));
  for (int64_t k = 1; k < n; ++k) {
    ARROW_ASSIGN_OR_RAISE(auto loader, make(k, n));
    loaders.push_back(std::move(loader));
  }
  return std::unique_ptr<ShardedSource>(
      new ShardedSource(config, source_index, start, std::move(loaders)));
}

ShardedSource::~ShardedSource() { Stop(); }

void ShardedSource::Start() {
  started_ = true;
  for (auto& loader : loaders_) loader->Start();
}

void ShardedSource::SetShare(const SourceShare& share) {
  const auto n = static_cast<int64_t>(loaders_.size());
  for (auto& loader : loaders_) {
    loader->SetShare((share.workers + n - 1) / n,
                     std::max<int64_t>(1, share.read_ahead_bytes / n), share.active);
  }
}

void ShardedSource::RequestStop() {
  for (auto& loader : loaders_) loader->RequestStop();
}

void ShardedSource::Stop() {
  RequestStop();  // every loader's tasks return at once, then wait for each
  for (auto& loader : loaders_) loader->Stop();
}

std::vector<int32_t> ShardedSource::skipped_files() const {
  std::vector<int32_t> out;
  for (const auto& loader : loaders_) {
    const auto files = loader->skipped_files();
    out.insert(out.end(), files.begin(), files.end());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void ShardedSource::LoadEpoch(int64_t epoch) {
  const auto windows = EpochWindows(loaders_.front()->file_list(), seed_, source_index_,
                                    epoch, window_rows_, window_bytes_);
  window_rows_of_epoch_.clear();
  for (const auto& w : windows) window_rows_of_epoch_.push_back(w.rows);
  owner_of_window_ =
      WindowOwners(windows, unit_owners_, static_cast<int64_t>(loaders_.size()));
}

Result<Sample> ShardedSource::Next() {
  if (loaders_.size() == 1) return loaders_.front()->Next();
  if (!error_.ok()) return error_;
  if (!started_) {  // every loader reads ahead from the start, not when its turn comes
    started_ = true;
    for (auto& loader : loaders_) loader->Start();
  }
  const int64_t owner = owner_of_window_[size_t(next_.window)];
  Result<Sample> sample = loaders_[size_t(owner)]->Next();
  if (!sample.ok()) {
    error_ = sample.status();
    return error_;
  }
  if (sample->meta.pos != next_) {
    const StreamPos& got = sample->meta.pos;
    const auto& files = loaders_[size_t(owner)]->file_list();
    const std::string file = size_t(sample->meta.file) < files.size()
                                 ? files[size_t(sample->meta.file)].path
                                 : "sources[" + std::to_string(source_index_) + "]";
    error_ = DataError(
        DataLocation(file, -1, sample->meta.row),
        "sources[" + std::to_string(source_index_) + "] loader " + std::to_string(owner) +
            " delivered (epoch " + std::to_string(got.epoch) + ", window " +
            std::to_string(got.window) + ", offset " + std::to_string(got.offset) +
            ") where (epoch " + std::to_string(next_.epoch) + ", window " +
            std::to_string(next_.window) + ", offset " + std::to_string(next_.offset) +
            ") was due; did the source's files change?");
    return error_;
  }
  if (++next_.offset == window_rows_of_epoch_[size_t(next_.window)]) {
    next_.offset = 0;
    if (++next_.window == static_cast<int64_t>(window_rows_of_epoch_.size())) {
      next_ = StreamPos{next_.epoch + 1, 0, 0};
      LoadEpoch(next_.epoch);
    }
  }
  return sample;
}

}  // namespace braid
