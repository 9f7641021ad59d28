// braid/config.h: a Braid job's configuration as a value (docs/config.md).
//
// A JobConfig is a parsed and validated config file: the seed, the sources and their
// weights, the batch shape, the trainer's topology, the planner's balance and the
// runtime's limits. It is what Loader::Make and DataPlane take. The fields themselves
// stay inside the library; the accessors below are the few a trainer needs to size its
// loop, and the config file (YAML or JSON) is the way to set everything else.
//
// Thread-safe: a JobConfig is immutable, and its copies share one parsed config.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "braid/status.h"

namespace braid {

/// A source weight as a function of the global step: piecewise linear between points,
/// constant before the first and after the last. A constant weight is one point. In YAML,
/// `sources[].weight: {schedule: [[step, w], ...]}` (or `{steps: ...}` with `stepwise`).
struct WeightSchedule {
  // INVARIANT: non-empty, steps strictly increasing, weights >= 0.
  std::vector<std::pair<int64_t, double>> points{{0, 1.0}};
  /// Planner (docs/planner.md): true for `{steps: ...}`, piecewise constant (each point's
  /// weight holds until the next point); false for `{schedule: ...}`, piecewise linear.
  bool stepwise = false;

  /// The weight at `step`.
  double At(int64_t step) const;
};

/// The sizes of the trainer's parallel dimensions (`topology.dp`, `tp`, `pp`, `cp`).
struct TopologySizes {
  int64_t dp = 1, tp = 1, pp = 1, cp = 1;
  int64_t world_size() const { return dp * tp * pp * cp; }
};

class JobConfigInternal;

/// A parsed, validated job configuration. Cheap to copy (the copies share it).
class JobConfig {
 public:
  /// Reads and parses the YAML or JSON file at `path`; relative source paths resolve
  /// against its folder. Fails with Invalid: the message starts with the file's path and
  /// names the key path of the bad key or value ("demo.yaml: batch.seq_len: must be
  /// > 0"), or the line and column of text that is not YAML; the ErrorDetail (status.h)
  /// is of kind kConfig. A file that cannot be opened is Invalid too, naming the path.
  static Result<JobConfig> FromFile(const std::string& path);

  /// Parses YAML or JSON `text`; relative source paths resolve against `base_dir`.
  /// Nothing on disk is read (the sources are opened by Loader::Make). Fails as FromFile,
  /// without the file prefix.
  static Result<JobConfig> FromString(const std::string& text,
                                      const std::string& base_dir);

  /// This config with topology.dp = `dp` (the CLI's --dp). Fails (Invalid, key
  /// "batch.global_tokens" or "--dp") if the batch shape does not divide over `dp`.
  Result<JobConfig> WithDataParallel(int64_t dp) const;

  uint64_t seed() const;
  /// Tokens per sequence (`batch.seq_len`); a phase may use another (SeqLenAt).
  int64_t seq_len() const;
  /// The sequence length at global step `step`: its phase's, else seq_len().
  int64_t SeqLenAt(int64_t step) const;
  /// Tokens per global step over all buckets (`batch.global_tokens`).
  int64_t global_tokens() const;
  /// Sequences per micro-batch (`batch.micro_batch_size`).
  int64_t micro_batch_size() const;
  TopologySizes topology() const;
  /// The number of buckets each step is balanced over (the DP size, by default;
  /// `topology.distribute`, docs/parallelism.md).
  int64_t num_buckets() const;
  /// Micro-batches each rank receives per step at seq_len() (MicroBatchesPerRankAt for a
  /// phase with another sequence length).
  int64_t micro_batches_per_rank() const;
  int64_t MicroBatchesPerRankAt(int64_t step) const;
  int64_t num_sources() const;
  /// The sources' names, in config order.
  std::vector<std::string> source_names() const;
  /// Hash of everything that determines the sample stream (seed, sources, sequence
  /// shape). Weights and topology are not in it: a run may resume with new ones.
  std::string Fingerprint() const;

 private:
  friend class JobConfigInternal;  // the library's side: the typed config inside
  class Impl;
  explicit JobConfig(std::shared_ptr<const Impl> impl);

  std::shared_ptr<const Impl> impl_;  // INVARIANT: non-null
};

}  // namespace braid
