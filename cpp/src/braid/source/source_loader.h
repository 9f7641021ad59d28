// The source loader: one source's seeded sample stream, read ahead on the job's pool.
//
// Order. Each epoch has its own seeded order: the files are permuted, then the row groups
// within each file; consecutive row groups form shuffle windows of at least
// `shuffle_window_rows` rows and at most `shuffle_window_bytes` (a row group larger than
// that is cut into consecutive blocks, read as record batches), and the rows of a window
// are permuted. Every row appears
// exactly once per epoch; when the source runs out, the next epoch starts with a new
// order. The order depends only on (seed, source index, epoch), never on other sources.
//
// Cursor. A StreamPos (epoch, window, offset) names a point in the order; a loader made
// at a StreamPos starts there without replaying anything before it.
//
// Transforms. Each row goes through the source's Transform (token column pass-through,
// text tokenization, chat template, a user function; transform/transform.h).
//
// Skips. A row without a sample (empty, or null / failed under on_error: skip) is
// delivered flagged by meta.skip and logged on stderr naming source, file, row group, row
// and reason: the first 10 skips of a source, then every 1000th with the count.
//
// Unreadable files (on_error: skip; source_files.h). A file that did not open
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
// Threading. A loader owns no thread. Its reading runs as tasks on a ReadPool
// (exec/read_pool.h) that the job's loaders share (Options::pool; without one the loader
// makes a private pool of `workers` + 1 threads). A read step loads the next window's row
// groups when the window before is done, transforms a batch of its rows (on up to
// `sources[].workers` pool threads, or what SetShare gives it, each result in its own
// slot) and queues them in the seeded order, so the stream is the same for any thread and
// worker count. At most one read step of a loader runs at a time; it resubmits itself
// while the queue holds less than `read_ahead_bytes` (the source's share of the job's
// memory budget) and otherwise stops, and Next() resubmits it once the queue is half
// empty. A pool thread never blocks on a full queue. The first Next() (or Start())
// submits the first step; a Next() that finds the queue empty makes the pending step
// urgent. A batch holds at most 256 rows per worker (or the transform's batch_rows(),
// if larger: 1024 for a token column) and about a quarter of `read_ahead_bytes` of
// estimated payload. A queued sample is charged its payload bytes,
// or, without payloads (planning), the bytes its row decoded to, so planning reads ahead
// as far as a run would. Next() is called from one consumer thread; Stop() and the
// destructor may be called from any thread, cut the current batch short and wait for the
// loader's tasks.
//
// Planning. Without payloads (Options::read_payloads false), a token source reads no
// token: a window's row groups are read as token counts (SourceFiles::ReadLengths: the
// source's length_column, else the token lists' lengths from their Parquet levels) and
// each row's metadata made from its count (Transform::ApplyLength), the same as from its
// list. Other sources read their columns and drop them once the metadata is made; with
// runtime.length_cache, a text, chat or image-caption source first looks each window
// entry up there and reads no column for an entry found, and keeps the counts of the
// entries it had to transform (io/length_cache.h).
//
// Metadata first, payloads on demand. For a transform that defers (image-caption:
// Transform::defers), a row's metadata comes from the image header alone and the sample
// is queued at once with a PayloadRef::OnDemand(): its images are decoded on the pool
// only once the payload is wanted (PayloadRef::Want(), which the embedded runtime calls
// for the pieces of its own ranks once a step is planned, or Get()). A process so decodes
// only the images of the micro-batches it builds, and an image nobody wants is never
// decoded (its row group's columns go with the last copy of its handle). A queued sample
// with such a payload is charged its exact finished size (known from the header) until
// Next() takes it, as any sample; decoded images of planned steps are bounded by the
// plans in flight. A body that does not decode becomes, with on_error: fail, an error
// from Get() naming file, row group and row; with on_error: skip, a blank payload
// (pixels 0, loss mask 0) that keeps the published token count, logged and counted
// (blanked_payloads(), by the process that wanted it). Without payloads nothing is
// decoded. After Stop(), a payload whose decode had started completes (decoded, or
// Cancelled) and one wanted later is Cancelled at once: no Get() blocks.
//
// Counts shared between processes, payloads where built (Options::own_payloads). A
// process that builds some of the buckets (one of a node's embedded ranks) and reads a
// tokenized source with runtime.length_cache looks each window entry up there before
// it transforms it, under the entry's lock (LengthCache::Lock): the first process to
// reach an entry transforms its rows (payloads included) and keeps their counts; the
// others wait for it, then take the counts and queue each row's sample with a
// PayloadRef::OnDemand() whose producer transforms the row (Transform::Apply, then
// Finish) on the pool when the payload is wanted. A node's ranks so tokenize each row
// about twice between them (its count, and the payload where it is built) rather than
// once in every process. The lock is held only while the entry is read and transformed
// (one at a time, waiting on nothing else). The stream is the same: the counts are the
// ones the transform gives (the cache's key names the file's row group and the
// tokenizer), and a payload made on demand whose count differs is an error naming the
// row. The window's rows are transformed (or taken from the cache) when it loads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "braid/config/config.h"
#include "braid/io/length_cache.h"
#include "braid/source/profile.h"
#include "braid/source/sample.h"
#include "braid/io/source_files.h"
#include "braid/transform/transform.h"
#include "braid/status.h"
#include "braid/util/log_internal.h"

namespace braid {

class Transform;
class ReadPool;
struct RowLocation;
struct RowOutput;

/// The row groups of one shuffle window, in read order: (file, row group) pairs. With a
/// byte bound, a row group larger than the bound is cut into blocks of `block_rows[i]`
/// rows (0: the whole row group) and entry i is its block `blocks[i]`; a row group's
/// blocks follow each other in the order.
struct ShuffleWindow {
  std::vector<std::pair<int32_t, int32_t>> row_groups;
  std::vector<int64_t> block_rows;  ///< per entry; 0: the whole row group
  std::vector<int64_t> blocks;      ///< per entry; the block index
  int64_t rows = 0;
  int64_t bytes = 0;  ///< estimated from the footers (File::row_group_bytes)
};

/// True if a unit of `rows` rows and `bytes` estimated bytes is read in two blocks or
/// more at `window_bytes` (BlockRows).
bool ReadInSeveralBlocks(int64_t rows, int64_t bytes, int64_t window_bytes);

/// Which of `shards` loaders reads the units (row groups, files) of a source whose units
/// are larger than `window_bytes` and read in blocks: per file, per row group. The units
/// of two blocks or more go round in turn, in sorted path order (each loader so owns one
/// in every epoch, when there are at least `shards`); the others by their index. Empty
/// when no unit is cut into blocks (windows then go round: WindowOwners).
std::vector<std::vector<int64_t>> UnitOwners(const std::vector<SourceFiles::File>& files,
                                             int64_t window_bytes, int64_t shards);

/// Which of `shards` loaders reads each window of an epoch (source/sharded_source.h).
/// Without cut units (`unit_owners` empty) window w goes to loader w % shards; with them,
/// a window goes to the owner of its first entry's unit, so one loader reads every block
/// of a unit, whose stream it then decodes once (another loader would decode the unit
/// up to its own block again: a stream cannot seek).
std::vector<int64_t> WindowOwners(const std::vector<ShuffleWindow>& windows,
                                  const std::vector<std::vector<int64_t>>& unit_owners,
                                  int64_t shards);

/// The rows of each block of a row group of `rows` rows and `bytes` estimated bytes when
/// windows hold at most `window_bytes` (0: not cut, read whole).
int64_t BlockRows(int64_t rows, int64_t bytes, int64_t window_bytes);

/// The windows of one epoch of a source, in order. Pure function of its inputs. A window
/// closes once it holds `window_rows` rows or before a row group (or block) that would
/// take it past `window_bytes` (0: no byte bound; a row group larger than window_bytes is
/// cut into blocks of at most that size, by its footer's uncompressed size).
std::vector<ShuffleWindow> EpochWindows(const SourceFiles& files, uint64_t seed,
                                        int32_t source_index, int64_t epoch,
                                        int64_t window_rows, int64_t window_bytes = 0);
/// The same over a file list.
std::vector<ShuffleWindow> EpochWindows(const std::vector<SourceFiles::File>& files,
                                        uint64_t seed, int32_t source_index,
                                        int64_t epoch, int64_t window_rows,
                                        int64_t window_bytes = 0);

class SourceLoader : public SampleStream {
 public:
  struct Options {
    bool read_payloads = true;  ///< false: metadata only (token counts), for planning
    int64_t read_ahead_bytes = int64_t{64} << 20;
    /// Sharding (source/sharded_source.h): this loader reads only the windows of each
    /// epoch that WindowOwners gives shard_index (w % shard_count when no unit is cut
    /// into blocks, else by their first unit's owner), and Next() yields their samples
    /// in order.
    /// REQUIRES: 0 <= shard_index < shard_count.
    int64_t shard_index = 0;
    int64_t shard_count = 1;
    /// Rate limit of the skip log lines (shared by the shards of one source); null: the
    /// loader makes its own.
    std::shared_ptr<internal::LogEveryN> skip_log;
    /// The job's reader/transform threads, shared with other loaders; null: the loader
    /// makes its own of `workers` + 1 threads when it starts.
    std::shared_ptr<ReadPool> pool;
    /// With payloads: share a tokenized source's counts through runtime.length_cache
    /// and make the payloads of rows counted elsewhere on demand (see the header). No
    /// effect without runtime.length_cache or on a source the cache does not keep.
    bool own_payloads = false;
    /// Called on a pool thread before it reads the row groups of a window (tests).
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
  /// until a read step has queued it. Errors (bad file, null with on_error: fail) are
  /// returned in stream order and then repeated.
  Result<Sample> Next() override;
  int64_t rows_per_epoch() const override { return total_rows_; }

  /// A skip-log rate limit with the loader's defaults: the first 10, then every 1000th.
  static std::shared_ptr<internal::LogEveryN> NewSkipLog();

  /// Starts reading now rather than at the first Next() (read-ahead begins).
  /// Idempotent; does nothing after Stop().
  void Start();

  /// Stops reading and waits for the loader's tasks on the pool. Later Next() calls
  /// return Cancelled.
  void Stop();
  /// The loader's share of the job's threads and memory from now on (exec/allocation.h):
  /// its transform loop's workers (at least 1) and the bytes it reads ahead. `ahead`
  /// false: it reads only while the consumer's queue is empty (one batch at a time) and
  /// Start() does not start it; true: it starts if Start() was called, and resumes
  /// reading ahead when its queue has room. Never changes the stream. Thread-safe.
  void SetShare(int64_t workers, int64_t read_ahead_bytes, bool ahead);
  /// The workers its transform loop may use now (SetShare's, at least 1). Thread-safe.
  int64_t workers() const { return workers_.load(std::memory_order_relaxed); }
  /// Stop() without the wait: the loader's queued tasks return at once when they run.
  /// Stopping many loaders: RequestStop() each, then Stop() each.
  void RequestStop();

  /// Window entries (row groups or blocks) whose counts came from runtime.length_cache
  /// instead of their columns (planning a tokenized source). Thread-safe.
  int64_t length_cache_hits() const {
    return length_cache_hits_.load(std::memory_order_relaxed);
  }

  /// What loading this loader's share of the source has cost so far (source/profile.h).
  /// Thread-safe.
  SourceProfile profile() const { return profile_.Snapshot(); }

  /// Samples published with a payload that then failed to finish (an image whose header
  /// read but whose body did not decode) and were blanked under on_error: skip.
  int64_t blanked_payloads() const { return blanked_.load(std::memory_order_relaxed); }

  /// The files skipped so far under on_error: skip, in whole or part, as indexes in
  /// sorted path order: those that did not open, and those with a row group this
  /// loader could not read (found when read: read-ahead included). Sorted. Thread-safe.
  std::vector<int32_t> skipped_files() const;

  const SourceFiles& files() const { return *files_; }
  /// The source's files in sorted path order.
  const std::vector<SourceFiles::File>& file_list() const { return files_->files(); }

 private:
  SourceLoader(const Config& config, int32_t source_index, StreamPos start,
               Options options, std::unique_ptr<SourceFiles> files,
               std::unique_ptr<Transform> transform);
  // Submits a read step (REQUIRES: mu_ held, !stopping_); `urgent` when the consumer
  // waits for it. A step submitted earlier and not yet running becomes a no-op. `next`:
  // submitted by the running step as its last act (ReadPool::SubmitNext).
  void ScheduleLocked(bool urgent, bool next = false);
  // Runs one read step if `ticket` is still the current one.
  void ReadTask(uint64_t ticket);
  // Loads the next window if none is loaded, then transforms and queues one batch.
  Status ReadStep();
  Status LoadWindow();
  // Submits a task to the pool, counted in in_flight_ until it returns; `next` as for
  // ScheduleLocked.
  void SubmitCounted(std::function<void()> task, bool urgent, bool next = false);
  // One row of the loaded window.
  struct RowRef {
    int32_t file = 0;
    int64_t row = 0;
    int32_t row_group = 0;
    int64_t array_index = 0;  // into the row group's arrays
    int64_t arrays_slot = 0;
  };
  // Logs a skipped row (rate-limited by skip_log_).
  void LogSkip(const RowLocation& where, const RowOutput& out);
  // Logs "source 'NAME' skipped WHAT" with the skip count (rate-limited by skip_log_).
  void LogSkipLine(const std::string& what);
  // An unreadable row group: an error with on_error: fail; with skip, counts and logs it
  // and returns OK unless no file of the source is left readable.
  Status SkipRowGroup(int file, int row_group, const Status& error, bool was_lost);
  // A payload Apply left to Transform::Finish, with what Finish reads.
  // Or, with `payload` null, a whole payload to make on demand (Apply, then Finish) for a
  // row whose count came from the length cache.
  struct Deferred {
    std::shared_ptr<Payload> payload;
    Columns cols;  // the row group's columns, kept alive for Finish
    int64_t index = 0;
    RowLocation where;
    int64_t tokens = 0;  // `payload` null: the count Apply must give
  };
  // How on-demand payloads reach their loader: `loader` until it stops (null after).
  struct DecodeGate {
    std::mutex mu;
    SourceLoader* loader = nullptr;  // GUARDED_BY(mu)
    std::string source_name;
  };
  struct Queued {
    Sample sample;
    int64_t bytes = 0;  // charged while queued
  };
  // Queues the samples in order (charging each `charges[j]`), waking the consumer once;
  // false when stopping.
  bool PushBatch(std::vector<Sample>* batch, const std::vector<int64_t>& charges);
  // An on-demand payload that has been wanted: its decode on the pool, or Cancelled when
  // stopping.
  void SubmitFinish(Deferred d, const PayloadRef& ref, bool urgent);
  // Finishes a deferred payload and completes `ref` (runs on the pool).
  void FinishPayload(const Deferred& d, const PayloadRef& ref);
  // Adds the running read step's figures to profile_, once: before its samples are
  // queued (a consumer never sees a sample the profile does not count yet), or when the
  // step ends without queuing any.
  void CountStep();

  const SourceConfig source_;
  const uint64_t seed_;
  const int32_t source_index_;
  const StreamPos start_;
  const Options options_;
  std::unique_ptr<SourceFiles> files_;    // used by the running read step only
  std::unique_ptr<Transform> transform_;  // const; shared by the workers
  std::shared_ptr<ReadPool> pool_;        // set before the first step is submitted
  std::shared_ptr<DecodeGate> gate_;      // shared with the on-demand payloads' producers
  std::atomic<int64_t> blanked_{0};
  ProfileCounters profile_;
  // The running read step's figures for profile_ (read steps run one at a time).
  int64_t step_start_ns_ = 0;  // its thread's CPU clock when it began
  int64_t helper_cpu_ns_ = 0;  // its transform loops' helper threads
  int64_t step_rows_ = 0, step_samples_ = 0, step_tokens_ = 0;
  bool step_counted_ = false;  // CountStep() ran for it
  std::shared_ptr<internal::LogEveryN> skip_log_;
  int64_t total_rows_ = 0;
  std::atomic<bool> stop_requested_{false};  // Stop() was called; workers cut short
  mutable std::mutex skipped_mu_;
  std::vector<int32_t> skipped_files_;  // GUARDED_BY(skipped_mu_) sorted, row-group skips

  // The read cursor, used by the running read step only (steps run one at a time; the
  // mutex hand-over between them orders their accesses).
  StreamPos next_window_;  // the window to load next (its offset: the first row)
  int64_t windows_epoch_ = -1;
  std::vector<ShuffleWindow> windows_;  // of windows_epoch_
  std::vector<int64_t> owners_;         // the loader of each of windows_ (WindowOwners)
  std::vector<std::vector<int64_t>> unit_owners_;  // UnitOwners of the source's files
  bool loaded_ = false;                 // a window is loaded and not finished
  StreamPos loaded_pos_;                // its epoch and window; offset: the next row
  std::vector<Columns> arrays_;         // per row group (or block chunk) of the window
  // Without payloads, for a transform whose metadata follows from token counts: per row
  // group (or block) of the window, its row group's counts (arrays_ stays empty).
  const bool lengths_only_;
  std::vector<std::shared_ptr<const std::vector<RowLength>>> lengths_;
  // Per entry of arrays_: why its row group was not read ("": read; its rows are then
  // delivered as skips, and arrays_ holds no columns for it).
  std::vector<std::string> unread_;
  bool unreadable_logged_ = false;  // the files whose footers did not read, logged once
  std::vector<RowRef> rows_;
  std::vector<int64_t> order_;
  // Without payloads: every row's output, made when the window loads (arrays_ dropped).
  bool precomputed_ = false;
  std::vector<RowOutput> outputs_;  // per row of rows_
  std::vector<Status> output_status_;
  std::vector<int64_t> estimates_;
  // Planning a tokenized source with runtime.length_cache (io/length_cache.h): the
  // loaded window's entries found in the cache (by slot of arrays_, which holds no
  // columns for them), and those read whose counts are to be kept, with their slots.
  std::unique_ptr<LengthCache> length_cache_;  // null: none
  std::atomic<int64_t> length_cache_hits_{0};
  std::unordered_map<int64_t, std::vector<CachedRow>> cached_;
  struct CacheWrite {
    LengthCacheEntry entry;
    int64_t first_slot = 0;
    int64_t end_slot = -1;  // -1 while its entry is being read
  };
  std::vector<CacheWrite> to_cache_;
  // Writes the counts of to_cache_'s entries whose rows all transformed cleanly.
  void KeepLengths();
  // Writes `entry`'s counts from the outputs of rows [first, end) of rows_, unless one
  // of them has a message to repeat (a null, an error).
  void KeepEntry(const LengthCacheEntry& entry, int64_t first, int64_t end);
  // Transforms rows [first, end) of rows_ into outputs_ (and output_status_, estimates_)
  // on the loader's workers; an unread row becomes a skip, a row of cached_ takes its
  // count.
  void TransformRows(int64_t first, int64_t end, bool want_payload);
  // Options::own_payloads: the loaded entry whose rows are rows_[first, rows_.size()).
  struct SharedEntry {
    int64_t first = 0;
    std::optional<LengthCacheEntry> entry;       // its cache entry (none: a lost file)
    std::optional<std::vector<CachedRow>> kept;  // its counts, when the cache had them
    internal::LockFile lock;                     // held while this process counts it
  };
  // Makes the outputs of `e`'s rows: from its kept counts (payloads on demand), or by
  // transforming them with payloads, keeping their counts when clean; then releases the
  // entry's lock.
  void FinishSharedEntry(SharedEntry* e);
  std::vector<char> apply_later_;  // per row of rows_: its payload is made on demand

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;     // GUARDED_BY(mu_)
  int64_t queued_bytes_ = 0;     // GUARDED_BY(mu_)
  Status error_;                 // GUARDED_BY(mu_); set once, after the queued samples
  bool stopping_ = false;        // GUARDED_BY(mu_)
  bool started_ = false;         // GUARDED_BY(mu_)
  bool ahead_ = true;            // GUARDED_BY(mu_) read ahead of the consumer (SetShare)
  bool start_asked_ = false;     // GUARDED_BY(mu_) Start() was called
  // The share (SetShare): read by read steps without mu_.
  std::atomic<int64_t> workers_{1};
  std::atomic<int64_t> read_ahead_bytes_{0};
  bool finished_ = false;        // GUARDED_BY(mu_) reading ended (error or stop)
  bool reading_ = false;         // GUARDED_BY(mu_) a read step is submitted or running
  bool running_ = false;         // GUARDED_BY(mu_) a read step is running
  bool urgent_ = false;          // GUARDED_BY(mu_) the submitted step is urgent
  uint64_t ticket_ = 0;          // GUARDED_BY(mu_) the current read step's
  int64_t in_flight_ = 0;        // GUARDED_BY(mu_) tasks of this loader on the pool
  bool consumer_waiting_ = false;  // GUARDED_BY(mu_)
};

}  // namespace braid
