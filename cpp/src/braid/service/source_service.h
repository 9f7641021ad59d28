// The source loader role as a service: one source's samples for an in-process planner,
// and the tokens of planned pieces fetched by key (file, row, token range) for
// constructors in other processes.
//
// A SourceService does either or both, as its Options say:
//   - stream: the source's seeded sample stream (source/sharded_source.h:
//     `sources[].loaders` loaders reading on a shared ReadPool within the source's share of
//     runtime.memory_bytes), for a planner in the same process. With payloads (the
//     embedded runtime) the samples carry them to the constructor by handle; without
//     (a planning pass, the Ray runtime's planner) only their metadata is read.
//   - serve: Fetch answers piece requests (wire.h PieceRequests) from the source's files,
//     read through the same SourceFiles and Transform as the loader, so a row's payload
//     is the one the embedded runtime delivers, byte for byte. The key names the row, so
//     any copy of the service (a restarted one, a standby) answers the same request with
//     the same bytes, and a request is idempotent. Row groups (or the blocks of row groups
//     larger than the source's shuffle_window_bytes, as the loader cuts them) are read
//     whole and kept in a cache bounded by `cache_bytes` (least recently used first out):
//     the pieces of one step come from few shuffle windows.
//
// The cache also keeps the payload of a row whose piece asked for does not end the
// document (a source that transforms rows: not a token column, whose payloads are views
// of the unit's ids), until the piece that ends it is asked for or the entry leaves the
// cache: the pieces of one long document, asked for over many steps, transform
// (tokenize) it once while its payload stays cached, and need its unit no more. Units
// and kept rows are entries of one cache, one least-recently-used order and one bound
// (a kept row counts its payload's bytes and the encoded images it holds on to).
//
// Beside a planner whose streams read the payloads (the first node's host of a Ray job),
// Fetch takes a row's payload from the plans that planner holds (ServeFromPlans) before
// reading the row: the same payload, neither read nor transformed again.
//
// The rows of one Fetch that need their transform (not a token column's view) are
// located first, in request order, then transformed side by side on the pool's free
// threads (options.pool), each once, and the reply is assembled in request order: the
// same reply as one row at a time, the first bad piece in request order its error.
// Meanwhile the fetch holds the columns of every unit it touched.
//
// Fetch keeps its own figures (ServeProfile): the calls and pieces answered, the tokens
// and bytes sent, the units read (cache misses) and their bytes, the rows transformed
// and the thread CPU of the calls, and the cache's bytes now and at most.
//
// Fetch errors name the file, row group and row: a row whose tokens no longer cover the
// planned piece (the file changed since it was planned), a row that is now skipped
// (null, empty), an unreadable row group (after SourceFiles' retries). Images are sent
// encoded, as the file holds them, with the grid their header gave; the constructor
// decodes them (AttachPieces, docs/decisions.md 40), so this service decodes none.
//
// SourceSet opens every source of a job (or some of them) in parallel on one pool: what
// the embedded runtime, a planning pass and the Ray runtime's hosts all start from.
//
// Thread-safe: Fetch calls are serialized by a mutex (SourceFiles is thread-compatible);
// the stream is thread-compatible (one consumer, its planner).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "braid/config/config.h"
#include "braid/exec/allocation.h"
#include "braid/io/source_files.h"
#include "braid/plan/step_plan.h"
#include "braid/service/wire.h"
#include "braid/source/profile.h"
#include "braid/source/sample.h"
#include "braid/status.h"
#include "braid/transform/transform.h"

namespace braid {

class ReadPool;
class ShardedSource;

/// What answering piece requests (SourceService::Fetch) cost so far, or a sum over
/// services of one source. A value.
struct ServeProfile {
  int64_t calls = 0;        ///< Fetch calls answered
  int64_t pieces = 0;       ///< pieces sent
  int64_t tokens_sent = 0;  ///< their tokens, the label token after each included
  int64_t bytes_sent = 0;   ///< the replies' arrays (tokens, offsets, masks, images)
  int64_t units_read = 0;   ///< row groups (or blocks) read: the cache's misses
  int64_t bytes_read = 0;   ///< their columns' bytes (Arrow buffers, decompressed)
  int64_t rows_transformed = 0;  ///< rows transformed (a kept row's later pieces: none)
  /// Pieces whose row's payload came from a plan of the planner beside the service
  /// (ServeFromPlans): the row neither read nor transformed again.
  int64_t pieces_from_plans = 0;
  int64_t cpu_ns = 0;            ///< thread CPU of the Fetch calls
  int64_t cached_bytes = 0;      ///< the cache's bytes now (a gauge)
  int64_t peak_cached_bytes = 0; ///< and at most (a sum over services: at most that)

  ServeProfile& operator+=(const ServeProfile& o) {
    calls += o.calls;
    pieces += o.pieces;
    tokens_sent += o.tokens_sent;
    bytes_sent += o.bytes_sent;
    units_read += o.units_read;
    bytes_read += o.bytes_read;
    rows_transformed += o.rows_transformed;
    pieces_from_plans += o.pieces_from_plans;
    cpu_ns += o.cpu_ns;
    cached_bytes += o.cached_bytes;
    peak_cached_bytes += o.peak_cached_bytes;
    return *this;
  }
};

class SourceService {
 public:
  enum class Stream : int8_t {
    kNone,      ///< no stream: Fetch only
    kMetadata,  ///< samples without payloads (token counts): for planning
    kPayloads,  ///< samples with their payloads: the embedded runtime
    /// kPayloads for a process that builds some of the buckets: a tokenized source's
    /// counts are shared with the node's other processes through runtime.length_cache
    /// and a row counted elsewhere is tokenized only when its payload is wanted
    /// (SourceLoader::Options::own_payloads)
    kOwnPayloads,
  };
  struct Options {
    Stream stream = Stream::kNone;
    bool serve = false;  ///< answer Fetch
    /// The stream's start (the source's cursor in a planner state).
    StreamPos start;
    /// Bytes the stream reads ahead (its share of runtime.memory_bytes, exec/budget.h).
    int64_t read_ahead_bytes = int64_t{64} << 20;
    /// The threads the stream reads on, shared with the job's other sources, and those
    /// Fetch transforms a call's rows on (null: one at a time, on the caller's thread).
    /// REQUIRES: set when stream != kNone.
    std::shared_ptr<ReadPool> pool;
    /// Fetch's row-group cache; 0: the source's share of runtime.memory_bytes.
    int64_t cache_bytes = 0;
  };

  /// Opens config.sources[source_index]'s files (listing, footers) for what `options`
  /// ask. Fails as SourceFiles::Open does, or (stream) as ShardedSource::Make does.
  static Result<std::unique_ptr<SourceService>> Make(const Config& config,
                                                     int32_t source_index,
                                                     Options options);
  ~SourceService();

  /// The sample stream. REQUIRES: options.stream != kNone.
  SampleStream* stream();
  /// Starts the stream's read-ahead now rather than at its first Next().
  void Start();
  /// The stream's share of threads and memory (ShardedSource::SetShare); no stream:
  /// nothing.
  void SetShare(const SourceShare& share);
  /// Asks the stream to stop without waiting (the destructor waits).
  void RequestStop();
  /// Stops the stream and waits for its reads; later Next() calls return Cancelled.
  void Stop();

  /// Answers `n` requests of kRequestFields int64 each (wire.h PieceRequests): each
  /// piece's tokens and the label after them, and the loss mask if the source has one.
  /// REQUIRES: options.serve.
  Result<PieceReply> Fetch(const int64_t* requests, int64_t n);

  /// Where Fetch finds a row's payload before reading it: `planned(source, file, row)`,
  /// the payload a plan of the planner beside this service holds (PlannerService::
  /// KeptPayload), used when ready; an empty handle: read as without. Its payloads are
  /// the ones this service would make (the same files and transform), so the replies
  /// do not change. A source with images finds none there (PayloadIndex holds no such
  /// row: their encoded bytes are read from the unit). Call before the first Fetch;
  /// `planned` must stay callable while Fetch runs.
  using PlannedPayloads =
      std::function<PayloadRef(int32_t source, int32_t file, int64_t row)>;
  void ServeFromPlans(PlannedPayloads planned);

  int32_t source_index() const { return source_index_; }
  /// Bytes of row groups cached now (serve).
  int64_t cached_bytes() const;
  /// Fetch calls answered so far.
  int64_t requests() const;
  /// What Fetch cost so far (zeros when it has not been called). Thread-safe.
  ServeProfile serve_profile() const;
  /// The stream's payloads blanked after their metadata was published (an image whose
  /// body did not decode, on_error: skip). Thread-safe.
  int64_t blanked_payloads() const;
  /// The stream's loading cost so far (source/profile.h); zeros without a stream.
  /// Thread-safe.
  SourceProfile profile() const;
  /// The workers the stream's transform loops may use now (ShardedSource::workers); 0
  /// without a stream. Thread-safe.
  int64_t workers() const;
  /// The stream's files skipped so far under on_error: skip, in whole or part (a footer
  /// or a row group that did not read). Thread-safe.
  int64_t skipped_files() const;
  /// Of skipped_files(), those that did not open: their rows are unknown.
  int64_t unreadable_files() const;

 private:
  SourceService() = default;
  using UnitKey = std::tuple<int32_t, int32_t, int64_t>;  // file, row group, block
  using RowKey = std::pair<int32_t, int64_t>;              // file, row
  // An entry of the cache, in its least-recently-used order: a unit or a kept row.
  using EntryKey = std::variant<UnitKey, RowKey>;
  struct KeptRow {  // a row's payload, made for the first piece of it asked for
    TokenPayload payload;
    std::vector<std::string_view> encoded;  // its images' bytes: views into `columns`
    Columns columns;  // the chunk `encoded` points into (none without images)
    int64_t bytes = 0;
    std::list<EntryKey>::iterator lru;
  };
  struct Unit {  // a row group, or one block of one
    std::vector<Columns> chunks;
    std::vector<int64_t> chunk_first;  // row (within the unit) of each chunk's first row
    int64_t first_row = 0;             // file row of the unit's first row
    int64_t bytes = 0;                 // its columns' bytes
    std::list<EntryKey>::iterator lru;
  };
  // Where a row's columns are: its unit's chunk and the row's index in it.
  struct Located {
    Columns cols;
    int64_t index = 0;
    int32_t row_group = 0;
  };
  // A row transformed before Fetch assembles its reply (the rows of one Fetch that need
  // a transform, on the pool side by side).
  struct Transformed {
    Located at;
    RowOutput out;
    Status status;
  };
  using TransformedRows = std::map<RowKey, Transformed>;
  // Drops the least recently used entries other than the newest until the cache holds
  // at most cache_bytes_ (the newest stays even when it alone exceeds it). REQUIRES: mu_.
  void Trim();
  // The unit holding (file, row), read if not cached. REQUIRES: mu_ held.
  Result<Unit*> UnitFor(int32_t file, int64_t row, int32_t* row_group);
  // The columns holding (file, row), its unit read if not cached. REQUIRES: mu_ held.
  Result<Located> Locate(int32_t file, int64_t row);
  // The payload a held plan of the planner beside it has for (file, row), ready; null if
  // none. REQUIRES: mu_ held.
  TokenPayload FromPlans(int32_t file, int64_t row);
  // The rows of requests [0, n) that are neither kept nor in a held plan, each once,
  // located and transformed side by side on the pool (pool threads that are free), when
  // there are at least two and the transform does more than view a token column; empty
  // otherwise (Row transforms inline). Stops locating at the first row that cannot be
  // located (Row reports it, in request order). REQUIRES: mu_ held.
  TransformedRows TransformAhead(const int64_t* requests, int64_t n);
  // The payload of one row, its images not decoded; `encoded`: their bytes (views into
  // the unit's columns). REQUIRES: mu_ held.
  // `more`: a later piece of the row follows, so its payload is kept with its unit until
  // that last piece is asked for. `ahead`: rows already transformed (TransformAhead).
  Result<TokenPayload> Row(int32_t file, int64_t row, bool more,
                           std::vector<std::string_view>* encoded,
                           const TransformedRows& ahead);
  // Adds the images of piece `piece` ([start, start + len) of the row's tokens) to
  // `reply`. REQUIRES: mu_ held.
  Status AddImages(const Payload& payload, const std::vector<std::string_view>& encoded,
                   int64_t piece, int64_t start, int64_t len, int32_t file, int64_t row,
                   PieceReply* reply, std::map<int32_t, int64_t>* path_index) const;

  Config config_;
  int32_t source_index_ = 0;
  std::unique_ptr<ShardedSource> stream_;
  // What Fetch reads with (options.serve).
  int64_t cache_bytes_ = 0;
  std::unique_ptr<SourceFiles> files_;
  std::unique_ptr<Transform> transform_;
  std::shared_ptr<ReadPool> pool_;  // Fetch's transforms run on its free threads, or null
  PlannedPayloads planned_;  // set before the first Fetch, or empty
  mutable std::mutex mu_;
  std::map<UnitKey, Unit> cache_;     // GUARDED_BY(mu_)
  std::map<RowKey, KeptRow> kept_;    // GUARDED_BY(mu_) rows whose later pieces follow
  std::list<EntryKey> lru_;           // GUARDED_BY(mu_) both maps' entries, newest first
  int64_t cached_ = 0;                                     // GUARDED_BY(mu_)
  int64_t requests_ = 0;                                   // GUARDED_BY(mu_)
  ServeProfile served_;                                    // GUARDED_BY(mu_)
};

/// Sources of one job opened together: their services and the pool their streams read
/// on. Thread-compatible (Start/Stop from one thread); each service is as thread-safe as
/// its header says.
class SourceSet {
 public:
  /// Opens `which` sources of `config` (empty: every source) in parallel on one pool of
  /// runtime.threads threads, each stream at `start`'s cursor of its source and reading
  /// ahead within its share of runtime.memory_bytes. Fails with the first failing
  /// source's error, in config order.
  static Result<std::unique_ptr<SourceSet>> Open(const Config& config,
                                                 const PlannerState& start,
                                                 SourceService::Stream stream, bool serve,
                                                 const std::vector<int32_t>& which = {});
  /// Asks every stream to stop, then waits for each.
  ~SourceSet();

  /// The streams, one per source in config order. REQUIRES: opened with a stream and
  /// every source.
  std::vector<SampleStream*> streams() const;
  /// Starts every stream's read-ahead, in config order (the order the planner asks); a
  /// stream whose share (SetShares) is inactive starts at its first Next() instead.
  void Start();
  /// Each stream's share of threads and memory, per source in config order
  /// (exec/allocation.h AllocateSources); sources this set does not hold are ignored.
  void SetShares(const std::vector<SourceShare>& shares);
  /// The pool's threads (runtime.threads, else the machine's cores).
  int64_t threads() const;
  /// Stops every stream (RequestStop on all, then Stop on each).
  void Stop();

  /// The service of config.sources[source], or null when this set does not hold it.
  SourceService* find(int32_t source) const;
  const std::vector<std::unique_ptr<SourceService>>& services() const { return services_; }
  /// Per source of the set, in order: SourceService::blanked_payloads() and the others.
  std::vector<int64_t> blanked_payloads() const;
  std::vector<SourceProfile> profiles() const;
  std::vector<int64_t> workers() const;
  std::vector<ServeProfile> serve_profiles() const;
  /// SourceService::ServeFromPlans on every service of the set.
  void ServeFromPlans(const SourceService::PlannedPayloads& planned);
  std::vector<int64_t> skipped_files() const;
  std::vector<int64_t> unreadable_files() const;

 private:
  SourceSet() = default;
  std::shared_ptr<ReadPool> pool_;  // outlives the streams (they hold it too)
  std::vector<std::unique_ptr<SourceService>> services_;
};

}  // namespace braid
