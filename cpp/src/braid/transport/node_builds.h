// Builds shared by the processes of one node that build the same bucket: the embedded
// runtime's TP / PP / CP peers of a DP group, which would each build (and decode the
// images of) the same micro-batches.
//
// A folder on the node (tmpfs: /dev/shm) holds one file per (step, bucket): its
// micro-batches' tensors, written once by the first peer to build it and mapped by the
// others (copy-on-write: a trainer may write to its arrays). A peer that reaches a
// (step, bucket) no file holds takes its lock (an exclusive flock of `<file>.lock`,
// polled) and looks again; the first to get the lock builds and writes it, the others
// wait for the lock and map the file. A process holds one such lock at a time, only
// while it builds, so peers that meet in collectives cannot deadlock on it.
//
// A file names the plan it was built from: a digest of the bucket's pieces
// (BucketDigest), with the step and bucket, checked by every reader against its own plan
// (each process plans every step), so a file of another run or plan is never taken. A
// process removes the files it wrote when they fall `keep_steps` behind the newest step
// it built, and the rest when it goes; a peer that finds no file builds the step itself
// (the same bytes: builds are deterministic). A file that does not read is a miss.
//
// File: "braid-build-1\n", a little-endian u64 header length, the header (digest, step,
// bucket, then per micro-batch its step, dp, micro_batch and tensors: name, dtype,
// shape, offset, bytes), then the tensors' bytes at page-aligned offsets from the start.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "braid/batch.h"
#include "braid/plan/step_plan.h"
#include "braid/service/constructor_service.h"
#include "braid/status.h"

namespace braid {

class NodeBuilds : public BuildShare {
 public:
  /// The builds kept in folder `dir` (made if missing); `keep_steps` steps of them are
  /// kept behind the newest this process built. Fails with an IO error naming `dir`.
  static Result<std::shared_ptr<NodeBuilds>> Make(std::string dir, int64_t keep_steps);
  /// Removes the files this process wrote and the lock files it took, and the folder if
  /// that leaves it empty.
  ~NodeBuilds() override;
  NodeBuilds(const NodeBuilds&) = delete;
  NodeBuilds& operator=(const NodeBuilds&) = delete;

  /// The micro-batches of the plan's (step, bucket) a peer wrote from the same plan
  /// (BucketDigest), or nullopt when no good file holds them.
  std::optional<std::vector<std::shared_ptr<const Batch>>> Find(const StepPlan& plan,
                                                                 int64_t bucket) override;
  /// Waits until this process holds (step, bucket)'s lock and returns it; null once
  /// `stop` returns true, or when the lock file cannot be made.
  std::shared_ptr<void> Claim(const StepPlan& plan, int64_t bucket,
                              const std::function<bool()>& stop) override;
  /// Writes the micro-batches of (step, bucket) for the peers (a failure is ignored:
  /// they build it themselves), then removes this process's files of steps more than
  /// keep_steps behind it.
  void Put(const StepPlan& plan, int64_t bucket,
           const std::vector<std::shared_ptr<const Batch>>& batches) override;

  const std::string& dir() const { return dir_; }

 private:
  NodeBuilds(std::string dir, int64_t keep_steps)
      : dir_(std::move(dir)), keep_steps_(keep_steps) {}
  std::string FileFor(int64_t step, int64_t bucket) const;

  const std::string dir_;
  const int64_t keep_steps_;
  std::mutex mu_;
  std::map<std::pair<int64_t, int64_t>, std::string> written_;  // GUARDED_BY(mu_)
  // GUARDED_BY(mu_): the lock files this process took, by (step, bucket), removed once
  // keep_steps behind the newest it took and when it goes.
  std::map<std::pair<int64_t, int64_t>, std::string> claimed_;
};

/// A digest of bucket `bucket` of `plan`: the step and every piece's key (source, file,
/// row, epoch, start, length, document tokens) in build order.
uint64_t BucketDigest(const StepPlan& plan, int64_t bucket);

/// Where the builds of this run's peers on this node meet: a folder under /dev/shm (else
/// the temporary folder) named by the user, the config's fingerprint and the run's
/// identity as its launcher gives every rank of it (TORCHELASTIC_RUN_ID; else
/// MASTER_ADDR and MASTER_PORT; else SLURM_JOB_ID and SLURM_STEP_ID); "" when the
/// environment names no run (the peers then build each their own).
std::string NodeBuildsFolder(const std::string& fingerprint);

}  // namespace braid
