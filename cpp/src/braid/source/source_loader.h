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
// text tokenization, chat template; source/transform.h).
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
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "braid/config/config.h"
#include "braid/source/sample.h"
#include "braid/source/source_files.h"
#include "braid/status.h"

namespace braid {

class Transform;
class WorkerPool;

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

  /// Stops and joins the reader thread. Later Next() calls return Cancelled.
  void Stop();

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
  // Queues the samples in order, waking the consumer once; false when stopping.
  bool PushBatch(std::vector<Sample>* batch);

  const SourceConfig source_;
  const uint64_t seed_;
  const int32_t source_index_;
  const StreamPos start_;
  const Options options_;
  std::unique_ptr<SourceFiles> files_;    // used by the reader thread only
  std::unique_ptr<Transform> transform_;  // const; shared by the workers
  std::unique_ptr<WorkerPool> pool_;      // made and used by the reader thread
  int64_t total_rows_ = 0;
  std::atomic<bool> stop_requested_{false};  // Stop() was called; workers cut short

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Sample> queue_;     // GUARDED_BY(mu_)
  int64_t queued_bytes_ = 0;     // GUARDED_BY(mu_)
  Status error_;                 // GUARDED_BY(mu_); set once, after the queued samples
  bool stopping_ = false;        // GUARDED_BY(mu_)
  int waiting_ = 0;              // GUARDED_BY(mu_) threads inside cv_.wait in Next/Push
  bool started_ = false;         // GUARDED_BY(mu_)
  std::thread reader_;
};

}  // namespace braid
