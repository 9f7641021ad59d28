// One source read by several loader instances, merged back into the source's one order.
//
// A ShardedSource owns n SourceLoaders of the same source; loader k reads only the
// shuffle windows of each epoch that WindowOwners gives it (source_loader.h: in turn,
// w % n, or, when units are cut into blocks, by the unit a window begins with, so one
// loader reads all the blocks of a unit and decodes its stream once), each reading on
// the job's pool with up to `workers` threads. Next() walks the source's order
// (EpochWindows is a pure function, so every loader and the merge agree on it) and takes
// each window's samples from the loader that owns it, so the stream (metadata, payloads,
// skips, errors) is identical to one loader's for every n. This is the step towards
// spreading one source over several machines: a shard needs only (config, source, shard,
// n, start), never another shard's data.
//
// n is `sources[].loaders`, lowered to MostLoaders (every loader then owns a window in
// every epoch; one without would spin through epochs): the fewest windows any epoch can
// have or, with units cut into blocks, the units of two blocks or more (a source of one
// large JSON Lines file, read in blocks, has one loader).
// Each loader buffers the source's share / n; the first Next() (or Start()) starts every
// loader's read-ahead, so each reads ahead of its turn.
//
// Thread-compatible like SourceLoader: Next() from one consumer thread; Stop() and the
// destructor from any thread.
#pragma once

#include <memory>
#include <vector>

#include "braid/config/config.h"
#include "braid/exec/allocation.h"
#include "braid/source/sample.h"
#include "braid/source/source_loader.h"
#include "braid/status.h"

namespace braid {

class ShardedSource : public SampleStream {
 public:
  /// Opens `shards` loaders of config.sources[source_index] positioned at `start` (a
  /// shard whose next window comes later starts there). `options` apply to each loader,
  /// read_ahead_bytes divided among them. Fails as SourceLoader::Make does, or Invalid
  /// if shards < 1.
  static Result<std::unique_ptr<ShardedSource>> Make(
      const Config& config, int32_t source_index, StreamPos start,
      SourceLoader::Options options, int64_t shards);
  ~ShardedSource() override;

  /// The next sample in the source's order, from the loader that owns its window.
  /// Errors are those of that loader, in stream order, then repeated.
  Result<Sample> Next() override;
  int64_t rows_per_epoch() const override { return loaders_.front()->rows_per_epoch(); }

  /// Starts every loader's read-ahead now rather than at the first Next().
  void Start();

  /// Stops every loader (see SourceLoader::Stop).
  void Stop();
  /// The source's share of threads and memory (exec/allocation.h), divided among the
  /// loaders: each gets the workers / n (rounded up) and the read-ahead / n
  /// (SourceLoader::SetShare). Never changes the stream.
  void SetShare(const SourceShare& share);
  /// Asks every loader to stop without waiting (SourceLoader::RequestStop).
  void RequestStop();

  /// The number of loaders (sources[].loaders, lowered as the header says).
  int64_t shards() const { return static_cast<int64_t>(loaders_.size()); }
  SourceLoader& loader(int64_t k) { return *loaders_[size_t(k)]; }
  /// Payloads blanked after publishing, over every loader (SourceLoader::blanked_payloads).
  int64_t blanked_payloads() const {
    int64_t n = 0;
    for (const auto& l : loaders_) n += l->blanked_payloads();
    return n;
  }
  /// The loading cost so far, summed over every loader (SourceLoader::profile).
  SourceProfile profile() const {
    SourceProfile p;
    for (const auto& l : loaders_) p += l->profile();
    return p;
  }
  /// The workers its loaders' transform loops may use now, summed. Thread-safe.
  int64_t workers() const {
    int64_t n = 0;
    for (const auto& l : loaders_) n += l->workers();
    return n;
  }
  /// Files skipped so far under on_error: skip, over every loader (indexes in sorted path
  /// order; SourceLoader::skipped_files). Thread-safe.
  std::vector<int32_t> skipped_files() const;
  /// Files that did not open (their rows are unknown), among skipped_files().
  int64_t unreadable_files() const {
    return loaders_.front()->files().unreadable_files();
  }

 private:
  ShardedSource(const Config& config, int32_t source_index, StreamPos start,
                std::vector<std::unique_ptr<SourceLoader>> loaders);
  // Computes the windows of `epoch` into windows_.
  void LoadEpoch(int64_t epoch);

  const uint64_t seed_;
  const int32_t source_index_;
  const int64_t window_rows_;
  const int64_t window_bytes_;
  std::vector<std::unique_ptr<SourceLoader>> loaders_;
  // The position of the next sample and the rows of each window of its epoch. Used only
  // with more than one loader (one loader is passed through).
  StreamPos next_;
  std::vector<int64_t> window_rows_of_epoch_;
  std::vector<std::vector<int64_t>> unit_owners_;  // UnitOwners of the source's files
  std::vector<int64_t> owner_of_window_;  // WindowOwners of the epoch's windows
  Status error_;  // the first error, repeated
  bool started_ = false;  // the loaders' reader threads were started
};

/// The fewest shuffle windows an epoch of these files can have: every window but the last
/// holds at least `window_rows` rows and fewer than window_rows + the largest row group.
int64_t MinWindowsPerEpoch(const std::vector<SourceFiles::File>& files,
                           int64_t window_rows);

/// The most loaders a source can have, each owning a window in every epoch: with units
/// cut into blocks at `window_bytes` (UnitOwners), the units of two blocks or more (each
/// begins a window with its second block); otherwise MinWindowsPerEpoch.
int64_t MostLoaders(const std::vector<SourceFiles::File>& files, int64_t window_rows,
                    int64_t window_bytes);

}  // namespace braid
