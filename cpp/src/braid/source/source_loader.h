// The source loader: one source's seeded sample stream, read ahead on its own thread.
//
// Order. Each epoch has its own seeded order: the files are permuted, then the row groups
// within each file; consecutive row groups form shuffle windows of at least
// `shuffle_window_rows` rows, and the rows of a window are permuted. Every row appears
// exactly once per epoch; when the source runs out, the next epoch starts with a new
// order. The order depends only on (seed, source index, epoch), never on other sources.
//
// Cursor. A StreamPos (epoch, window, offset) names a point in the order; a loader made at
// a StreamPos starts there without replaying anything before it.
//
// Transforms. Each row goes through the source's Transform (token column pass-through,
// text tokenization, chat template, a user function; source/transform.h).
//
// Skips. A row without a sample (empty, or null / failed under on_error: skip) is
// delivered flagged by meta.skip and logged on stderr naming source, file, row group, row
// and reason: the first 10 skips of a source, then every 1000th with the count.
//
// Unreadable files (on_error: skip; source_files.h). A file whose footer did not read
// has no row groups and yields nothing; it is logged once (by shard 0, when its reader
// starts). A row group that cannot be read (after retries, for storage failures) keeps
// its place in the order: each of its rows is delivered as a skip (SkipReason::kError),
// so positions and the rest of the stream do not move, and the row group is logged once
// (not per row). Both count in skipped_files(). When no file of the source is left
// readable, the stream fails (data error naming the source and its path). With
// on_error: fail, an unreadable row group is an error naming the file and row group.
//
// Sharding. Options::shard_index / shard_count make the loader one of several that share
// the source: it reads only its own windows (source/sharded_source.h merges them).
//
// Threading. A loader owns one reader thread, started lazily by the first Next() (a source
// that is never asked costs nothing). The reader reads a window's row groups, then
// transforms its rows in batches on `sources[].workers` threads (itself plus a pool),
// each result in its own slot, and queues them in the seeded order: the stream is the
// same for any worker count. A batch holds at most 256 rows per worker and about a quarter
// of `read_ahead_bytes` of estimated payload. The queue is bounded by `read_ahead_bytes`
// of payload and the reader blocks when it is full; Next() blocks while it is empty.
// Next() is called from one consumer thread; Stop() and the destructor may be called
// from any thread, cut the current batch short and join the reader and its pool.
//
// Metadata first. For a transform that defers (image-caption: Transform::defers), a
// row's metadata comes from the image header alone and the sample is queued at once with
// a PayloadRef::Pending(); a TaskRunner of `workers` threads decodes the images in stream
// order and completes each payload (the reader does the header / caption work alone).
// The planner can so plan a step while its images still decode; the constructor's
// PayloadRef::Get() waits for them. A pending payload is charged its exact finished
// size (known from the header) from queueing until it is both taken by Next() and
// finished. A body that does not decode becomes, with on_error: fail, an error from
// Get() naming file, row group and row; with on_error: skip, a blank payload (pixels 0,
// loss mask 0) that keeps the published token count, logged and counted
// (blanked_payloads()). Without payloads nothing is decoded. Stop() completes every
// pending payload (decoded, or Cancelled).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "braid/config/config.h"
#include "braid/source/sample.h"
#include "braid/source/source_files.h"
#include "braid/source/transform.h"
#include "braid/status.h"
#include "braid/util/log_internal.h"

namespace braid {

class Transform;
class WorkerPool;
class TaskRunner;
struct RowLocation;
struct RowOutput;

/// The row groups of one shuffle window, in read order: (file, row group) pairs.
struct ShuffleWindow {
  std::vector<std::pair<int32_t, int32_t>> row_groups;
  int64_t rows = 0;
};

/// The windows of one epoch of a source, in order. Pure function of its inputs.
std::vector<ShuffleWindow> EpochWindows(const SourceFiles& files, uint64_t seed,
                                        int32_t source_index, int64_t epoch,
                                        int64_t window_rows);
/// The same over a file list.
std::vector<ShuffleWindow> EpochWindows(const std::vector<SourceFiles::File>& files,
                                        uint64_t seed, int32_t source_index,
                                        int64_t epoch, int64_t window_rows);

class SourceLoader : public SampleStream {
 public:
  struct Options {
    bool read_payloads = true;  ///< false: metadata only (token counts), for planning
    int64_t read_ahead_bytes = int64_t{64} << 20;
    /// Sharding (source/sharded_source.h): this loader reads only the windows w of each
    /// epoch with w % shard_count == shard_index, and Next() yields their samples in
    /// order. REQUIRES: 0 <= shard_index < shard_count.
    int64_t shard_index = 0;
    int64_t shard_count = 1;
    /// Rate limit of the skip log lines (shared by the shards of one source); null: the
    /// loader makes its own.
    std::shared_ptr<internal::LogEveryN> skip_log;
    /// Called on the reader thread before it reads the row groups of a window (tests).
    std::function<void(int64_t shard_index, int64_t epoch, int64_t window)>
        on_read_window;
  };

  /// Opens the files of config.sources[source_index] and positions the stream at `start`.
  /// Fails as SourceFiles::Open does, or if `start` lies outside the epoch's order.
  static Result<std::unique_ptr<SourceLoader>> Make(const Config& config,
                                                    int32_t source_index, StreamPos start,
                                                    Options options);
  ~SourceLoader();

  /// The next sample in the order (skipped ones included, flagged by meta.skip). Blocks
  /// until the reader thread has it. Errors (bad file, null with on_error: fail) are
  /// returned in stream order and then repeated.
  Result<Sample> Next() override;
  int64_t rows_per_epoch() const override { return total_rows_; }

  /// A skip-log rate limit with the loader's defaults: the first 10, then every 1000th.
  static std::shared_ptr<internal::LogEveryN> NewSkipLog();

  /// Starts the reader thread now rather than at the first Next() (read-ahead begins).
  /// Idempotent; does nothing after Stop().
  void Start();

  /// Stops and joins the reader thread. Later Next() calls return Cancelled.
  void Stop();

  /// Samples published with a payload that then failed to finish (an image whose header
  /// read but whose body did not decode) and were blanked under on_error: skip.
  int64_t blanked_payloads() const { return blanked_.load(std::memory_order_relaxed); }

  /// The files skipped so far under on_error: skip, in whole or part, as indexes in
  /// sorted path order: those whose footer did not read, and those with a row group this
  /// loader could not read (found when read: read-ahead included). Sorted. Thread-safe.
  std::vector<int32_t> skipped_files() const;

  const SourceFiles& files() const { return *files_; }
  /// The source's files in sorted path order.
  const std::vector<SourceFiles::File>& file_list() const { return files_->files(); }

 private:
  SourceLoader(const Config& config, int32_t source_index, StreamPos start,
               Options options, std::unique_ptr<SourceFiles> files,
               std::unique_ptr<Transform> transform);
  void ReaderLoop();
  Result<std::vector<std::shared_ptr<arrow::Array>>> ReadColumns(int file, int row_group);
  Status ReadWindow(int64_t epoch, int64_t window, const ShuffleWindow& w,
                    int64_t first_offset);
  // Logs a skipped row (rate-limited by skip_log_).
  void LogSkip(const RowLocation& where, const RowOutput& out);
  // Logs "source 'NAME' skipped WHAT" with the skip count (rate-limited by skip_log_).
  void LogSkipLine(const std::string& what);
  // An unreadable row group: an error with on_error: fail; with skip, counts and logs it
  // and returns OK unless no file of the source is left readable.
  Status SkipRowGroup(int file, int row_group, const Status& error, bool was_lost);
  // A payload Apply left to Transform::Finish: sample `sample` of the batch.
  struct Deferred {
    size_t sample = 0;
    std::shared_ptr<Payload> payload;
    Columns cols;  // the row group's columns, kept alive for Finish
    int64_t index = 0;
    RowLocation where;
    int64_t bytes = 0;  // the finished payload's
  };
  // The read-ahead charge of a pending payload, released when the sample has been taken
  // by Next() and its payload finished, whichever is last.
  struct PendingCharge {
    int64_t bytes = 0;
    int holds = 2;  // GUARDED_BY(mu_)
  };
  struct Queued {
    Sample sample;
    int64_t bytes = 0;                      // charged while queued (0 if pending)
    std::shared_ptr<PendingCharge> pending;  // set for a pending payload
  };
  // Queues the samples in order, waking the consumer once, and hands each deferred
  // payload (in sample order) to decoder_ once its sample is queued; false when stopping.
  bool PushBatch(std::vector<Sample>* batch, std::vector<Deferred>* deferred);
  // Finishes a deferred payload and completes `ref` (runs on decoder_).
  void FinishPayload(const Deferred& d, const PayloadRef& ref,
                     const std::shared_ptr<PendingCharge>& charge);
  // REQUIRES: mu_ held.
  void ReleaseLocked(PendingCharge* charge);

  const SourceConfig source_;
  const uint64_t seed_;
  const int32_t source_index_;
  const StreamPos start_;
  const Options options_;
  std::unique_ptr<SourceFiles> files_;    // used by the reader thread only
  std::unique_ptr<Transform> transform_;  // const; shared by the workers
  std::unique_ptr<WorkerPool> pool_;      // made and used by the reader thread
  std::unique_ptr<TaskRunner> decoder_;   // deferred payloads; made by the reader thread
  std::atomic<int64_t> blanked_{0};
  std::shared_ptr<internal::LogEveryN> skip_log_;
  int64_t total_rows_ = 0;
  std::atomic<bool> stop_requested_{false};  // Stop() was called; workers cut short
  mutable std::mutex skipped_mu_;
  std::vector<int32_t> skipped_files_;  // GUARDED_BY(skipped_mu_) sorted, row-group skips

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;     // GUARDED_BY(mu_)
  int64_t queued_bytes_ = 0;     // GUARDED_BY(mu_)
  Status error_;                 // GUARDED_BY(mu_); set once, after the queued samples
  bool stopping_ = false;        // GUARDED_BY(mu_)
  int waiting_ = 0;              // GUARDED_BY(mu_) threads inside cv_.wait in Next/Push
  bool started_ = false;         // GUARDED_BY(mu_)
  std::thread reader_;
};

}  // namespace braid
