#include "braid/source/source_loader.h"

#include <arrow/api.h>
#include <arrow/util/byte_size.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <string_view>

#include "braid/exec/read_pool.h"
#include "braid/transform/transform.h"
#include "braid/util/cpu_time_internal.h"
#include "braid/util/rng_internal.h"

namespace braid {
namespace {

using internal::DeriveSeed;
using internal::Permutation;

// Salts that keep the seeds of the different shuffles apart.
constexpr uint64_t kFileSalt = 0xf11e;
constexpr uint64_t kRowGroupSalt = 0x7209;
constexpr uint64_t kRowSalt = 0x7200;

constexpr int64_t kSampleOverheadBytes = 64;
// Rows per worker in one transform batch (see the header's Threading).
constexpr int64_t kBatchRowsPerWorker = 256;
// Skip log lines: the first kSkipLogFirst skips of a source, then every kSkipLogEvery-th.
constexpr int64_t kSkipLogFirst = 10;
constexpr int64_t kSkipLogEvery = 1000;

const char* SkipName(SkipReason r) {
  switch (r) {
    case SkipReason::kEmpty: return "empty row";
    case SkipReason::kNull: return "null";
    case SkipReason::kOversize: return "longer than the sequence";
    case SkipReason::kError: return "bad row";
    default: return "not skipped";
  }
}

}  // namespace

int64_t BlockRows(int64_t rows, int64_t bytes, int64_t window_bytes) {
  if (window_bytes <= 0 || bytes <= window_bytes) return 0;
  return std::max<int64_t>(1, static_cast<int64_t>(__int128{rows} * window_bytes / bytes));
}

bool ReadInSeveralBlocks(int64_t rows, int64_t bytes, int64_t window_bytes) {
  const int64_t block = BlockRows(rows, bytes, window_bytes);
  return block > 0 && rows > block;
}

std::vector<std::vector<int64_t>> UnitOwners(const std::vector<SourceFiles::File>& files,
                                             int64_t window_bytes, int64_t shards) {
  shards = std::max<int64_t>(1, shards);
  std::vector<std::vector<int64_t>> owner(files.size());
  int64_t cut = 0, index = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    const auto& file = files[f];
    owner[f].resize(file.row_group_rows.size());
    for (size_t rg = 0; rg < file.row_group_rows.size(); ++rg, ++index) {
      const int64_t bytes =
          rg < file.row_group_bytes.size() ? file.row_group_bytes[rg] : 0;
      const bool blocks =
          ReadInSeveralBlocks(file.row_group_rows[rg], bytes, window_bytes);
      owner[f][rg] = (blocks ? cut++ : index) % shards;
    }
  }
  if (cut == 0) owner.clear();
  return owner;
}

std::vector<int64_t> WindowOwners(const std::vector<ShuffleWindow>& windows,
                                  const std::vector<std::vector<int64_t>>& unit_owners,
                                  int64_t shards) {
  shards = std::max<int64_t>(1, shards);
  std::vector<int64_t> owner(windows.size(), 0);
  for (size_t w = 0; w < windows.size(); ++w) {
    if (unit_owners.empty() || windows[w].row_groups.empty()) {
      owner[w] = static_cast<int64_t>(w) % shards;
    } else {
      const auto [file, rg] = windows[w].row_groups.front();
      owner[w] = unit_owners[size_t(file)][size_t(rg)];
    }
  }
  return owner;
}

std::vector<ShuffleWindow> EpochWindows(const SourceFiles& files, uint64_t seed,
                                        int32_t source_index, int64_t epoch,
                                        int64_t window_rows, int64_t window_bytes) {
  return EpochWindows(files.files(), seed, source_index, epoch, window_rows, window_bytes);
}

std::vector<ShuffleWindow> EpochWindows(const std::vector<SourceFiles::File>& fs,
                                        uint64_t seed, int32_t source_index,
                                        int64_t epoch, int64_t window_rows,
                                        int64_t window_bytes) {
  const auto file_order = Permutation(static_cast<int64_t>(fs.size()),
                                      DeriveSeed({seed, kFileSalt, uint64_t(source_index),
                                                  uint64_t(epoch)}));
  std::vector<ShuffleWindow> windows;
  ShuffleWindow current;
  auto close = [&] {
    windows.push_back(std::move(current));
    current = ShuffleWindow{};
  };
  for (int64_t f : file_order) {
    const auto& file = fs[static_cast<size_t>(f)];
    const auto rg_order = Permutation(
        static_cast<int64_t>(file.row_group_rows.size()),
        DeriveSeed({seed, kRowGroupSalt, uint64_t(source_index), uint64_t(epoch),
                    uint64_t(f)}));
    for (int64_t rg : rg_order) {
      const int64_t rows = file.row_group_rows[static_cast<size_t>(rg)];
      if (rows == 0) continue;
      const int64_t bytes = size_t(rg) < file.row_group_bytes.size()
                                ? file.row_group_bytes[static_cast<size_t>(rg)]
                                : 0;
      const int64_t block_rows = BlockRows(rows, bytes, window_bytes);
      const int64_t blocks = block_rows == 0 ? 1 : (rows + block_rows - 1) / block_rows;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t unit_rows =
            block_rows == 0 ? rows : std::min(block_rows, rows - b * block_rows);
        const int64_t unit_bytes =
            block_rows == 0 ? bytes
                            : static_cast<int64_t>(__int128{bytes} * unit_rows / rows);
        if (window_bytes > 0 && current.rows > 0 &&
            current.bytes + unit_bytes > window_bytes) {
          close();
        }
        current.row_groups.emplace_back(static_cast<int32_t>(f), static_cast<int32_t>(rg));
        current.block_rows.push_back(block_rows);
        current.blocks.push_back(b);
        current.rows += unit_rows;
        current.bytes += unit_bytes;
        if (current.rows >= window_rows) close();
      }
    }
  }
  if (current.rows > 0) windows.push_back(std::move(current));
  return windows;
}

SourceLoader::SourceLoader(const Config& config, int32_t source_index, StreamPos start,
                           Options options, std::unique_ptr<SourceFiles> files,
                           std::unique_ptr<Transform> transform)
    : source_(config.sources[static_cast<size_t>(source_index)]),
      seed_(config.seed),
      source_index_(source_index),
      start_(start),
      options_(options),
      files_(std::move(files)),
      transform_(std::move(transform)),
      pool_(options_.pool),
      gate_(std::make_shared<DecodeGate>()),
      skip_log_(options_.skip_log ? options_.skip_log : NewSkipLog()),
      total_rows_(files_->total_rows()),
      next_window_(start),
      lengths_only_(!options_.read_payloads && transform_->metadata_from_lengths()) {
  gate_->loader = this;
  gate_->source_name = source_.name;
  if (options_.shard_count > 1) {
    unit_owners_ =
        UnitOwners(files_->files(), source_.shuffle_window_bytes, options_.shard_count);
  }
  workers_.store(std::max<int64_t>(1, source_.workers), std::memory_order_relaxed);
  read_ahead_bytes_.store(options_.read_ahead_bytes, std::memory_order_relaxed);
}

Result<std::unique_ptr<SourceLoader>> SourceLoader::Make(const Config& config,
                                                         int32_t source_index,
                                                         StreamPos start, Options options) {
  const std::string key = "sources[" + std::to_string(source_index) + "]";
  const SourceConfig& source = config.sources[size_t(source_index)];
  ARROW_ASSIGN_OR_RAISE(auto transform, MakeTransform(config, source_index));
  std::vector<ColumnSpec> columns = transform->columns();
  if (columns.empty()) {
    columns.push_back(TokenColumnSpec(source.tokens_column, key + ".tokens_column"));
  }
  if (!source.length_column.empty()) {  // the parser allows it on token sources only
    columns.push_back(LengthColumnSpec(source.length_column, key + ".length_column"));
  }
  ARROW_ASSIGN_OR_RAISE(auto files, SourceFiles::Open(source, key, std::move(columns)));
  const auto& file_list = files->files();
  if (start.epoch < 0 || start.window < 0 || start.offset < 0) {
    return ConfigError(key, "stream position must not be negative (epoch " +
                                std::to_string(start.epoch) + ", window " +
                                std::to_string(start.window) + ", offset " +
                                std::to_string(start.offset) + ")");
  }
  if (options.shard_count < 1 || options.shard_index < 0 ||
      options.shard_index >= options.shard_count) {
    return ConfigError(key + ".loaders",
                       "shard " + std::to_string(options.shard_index) + " of " +
                           std::to_string(options.shard_count) + " does not exist");
  }
  // A position one past the end of a window means the start of the next one.
  const int64_t window_rows = config.sources[size_t(source_index)].shuffle_window_rows;
  const int64_t window_bytes = config.sources[size_t(source_index)].shuffle_window_bytes;
  auto windows = EpochWindows(file_list, config.seed, source_index, start.epoch,
                              window_rows, window_bytes);
  if (start.window < static_cast<int64_t>(windows.size()) &&
      start.offset == windows[size_t(start.window)].rows) {
    start.offset = 0;
    if (++start.window == static_cast<int64_t>(windows.size())) {
      start = StreamPos{start.epoch + 1, 0, 0};
      windows = EpochWindows(file_list, config.seed, source_index, start.epoch,
                             window_rows, window_bytes);
    }
  }
  if (start.window >= static_cast<int64_t>(windows.size()) ||
      start.offset >= windows[size_t(start.window)].rows) {
    return ConfigError(key, "stream position (epoch " + std::to_string(start.epoch) +
                                ", window " + std::to_string(start.window) + ", offset " +
                                std::to_string(start.offset) +
                                ") lies outside the source; did its files change?");
  }
  std::unique_ptr<LengthCache> length_cache;
  if (!options.read_payloads || options.own_payloads) {
    ARROW_ASSIGN_OR_RAISE(length_cache, LengthCache::Make(config, source_index));
  }
  std::unique_ptr<SourceLoader> loader(new SourceLoader(
      config, source_index, start, options, std::move(files), std::move(transform)));
  loader->length_cache_ = std::move(length_cache);
  return loader;
}

SourceLoader::~SourceLoader() { Stop(); }

std::shared_ptr<internal::LogEveryN> SourceLoader::NewSkipLog() {
  return std::make_shared<internal::LogEveryN>(/*first=*/kSkipLogFirst,
                                               /*every=*/kSkipLogEvery);
}

void SourceLoader::SubmitCounted(std::function<void()> task, bool urgent, bool next) {
  // REQUIRES: mu_ held (in_flight_); the pool never calls back into the loader under its
  // own lock, so submitting under mu_ cannot deadlock.
  ++in_flight_;
  auto counted = [this, task = std::move(task)] {
    task();
    std::lock_guard<std::mutex> lock(mu_);
    if (--in_flight_ == 0 && stopping_) cv_.notify_all();
  };
  if (next) {
    pool_->SubmitNext(std::move(counted), urgent);
  } else {
    pool_->Submit(std::move(counted), urgent);
  }
}

void SourceLoader::ScheduleLocked(bool urgent, bool next) {
  if (!pool_) pool_ = std::make_shared<ReadPool>(source_.workers + 1);
  reading_ = true;
  urgent_ = urgent;
  const uint64_t ticket = ++ticket_;
  SubmitCounted([this, ticket] { ReadTask(ticket); }, urgent, next);
}

void SourceLoader::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  start_asked_ = true;
  if (!started_ && !stopping_ && ahead_) {
    started_ = true;
    ScheduleLocked(/*urgent=*/false);
  }
}

void SourceLoader::SetShare(int64_t workers, int64_t read_ahead_bytes, bool ahead) {
  std::lock_guard<std::mutex> lock(mu_);
  workers_.store(std::max<int64_t>(1, workers), std::memory_order_relaxed);
  read_ahead_bytes_.store(std::max<int64_t>(1, read_ahead_bytes),
                          std::memory_order_relaxed);
  ahead_ = ahead;
  if (!ahead || stopping_) return;
  if (!started_) {
    if (!start_asked_) return;
    started_ = true;
    ScheduleLocked(/*urgent=*/false);
  } else if (!reading_ && !finished_ && error_.ok() &&
             queued_bytes_ < read_ahead_bytes_) {
    ScheduleLocked(/*urgent=*/false);
  }
}

void SourceLoader::RequestStop() {
  stop_requested_.store(true, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(gate_->mu);  // no payload reaches the loader now
    gate_->loader = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // A user transform's workers may wait for a lock this thread holds (the GIL): let them
  // go before waiting.
  transform_->Cancel();
}

void SourceLoader::Stop() {
  RequestStop();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return in_flight_ == 0; });
}

void SourceLoader::ReadTask(uint64_t ticket) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ticket != ticket_) return;  // replaced by an urgent step
    if (stopping_) {
      reading_ = false;
      return;
    }
    running_ = true;
  }
  step_start_ns_ = internal::ThreadCpuNs();
  helper_cpu_ns_ = 0;
  step_rows_ = step_samples_ = step_tokens_ = 0;
  step_counted_ = false;
  const Status st = ReadStep();
  CountStep();
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    if (!st.ok()) {
      if (!st.IsCancelled()) error_ = st;
      finished_ = true;
      reading_ = false;
      wake = true;
    } else if (!stopping_ &&
               (queue_.empty() || (ahead_ && queued_bytes_ < read_ahead_bytes_))) {
      // Keep reading; urgently while the consumer waits. This thread is about to be free
      // for it: no other is woken.
      ScheduleLocked(/*urgent=*/consumer_waiting_ && queue_.empty(), /*next=*/true);
    } else {
      reading_ = false;
    }
  }
  if (wake) cv_.notify_all();
}

void SourceLoader::CountStep() {
  if (step_counted_) return;
  step_counted_ = true;
  profile_.AddReadStep(internal::ThreadCpuNs() - step_start_ns_ + helper_cpu_ns_,
                       step_rows_, step_samples_, step_tokens_);
}

Result<Sample> SourceLoader::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  // Never start reading once stopping.
  if (!started_ && !stopping_) {
    started_ = true;
    ScheduleLocked(/*urgent=*/true);
  }
  if (queue_.empty() && !stopping_ && error_.ok() && !finished_) {
    // The consumer waits: a submitted step that has not started goes first.
    if (!reading_ || (!running_ && !urgent_)) ScheduleLocked(/*urgent=*/true);
    consumer_waiting_ = true;
    const auto waited_from = std::chrono::steady_clock::now();
    cv_.wait(lock, [this] {
      return !queue_.empty() || !error_.ok() || finished_ || stopping_;
    });
    profile_.AddConsumerWait(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now() - waited_from)
                                 .count());
    consumer_waiting_ = false;
  }
  if (!queue_.empty() && !stopping_) {
    Queued& front = queue_.front();
    Sample s = std::move(front.sample);
    queued_bytes_ -= front.bytes;
    profile_.SetHeld(queued_bytes_);
    queue_.pop_front();
    // Resume reading once the queue is half empty (not per sample: a task per sample
    // costs more than the sample).
    if (!reading_ && !finished_ &&
        (ahead_ ? queued_bytes_ <= read_ahead_bytes_ / 2 : queue_.empty())) {
      ScheduleLocked(/*urgent=*/queue_.empty());
    }
    return s;
  }
  if (!error_.ok()) return error_;
  return Status::Cancelled("source '", source_.name, "' stopped");
}

void SourceLoader::LogSkip(const RowLocation& where, const RowOutput& out) {
  std::string_view why = SkipName(out.skip);
  if (!out.null_what.empty()) why = out.null_what;
  const std::string named = "source '" + source_.name + "': ";  // said once is enough
  if (why.substr(0, named.size()) == named) why.remove_prefix(named.size());
  LogSkipLine(where.ToString() + ": " + std::string(why));
}

void SourceLoader::LogSkipLine(const std::string& what) {
  const int64_t n = skip_log_->Tick();
  if (n == 0) return;
  std::string line = "source '" + source_.name + "' skipped " + what + " (skip " +
                     std::to_string(n);
  if (n == kSkipLogFirst) {
    line += "; further skips of this source are logged every " +
            std::to_string(kSkipLogEvery) + "th";
  }
  internal::LogLine(line + ")");
}

std::vector<int32_t> SourceLoader::skipped_files() const {
  std::vector<int32_t> out;
  {
    std::lock_guard<std::mutex> lock(skipped_mu_);
    out = skipped_files_;
  }
  const auto& files = file_list();  // unreadable and damaged are set once, in Make
  for (size_t f = 0; f < files.size(); ++f) {
    if (!files[f].unreadable.empty() || !files[f].damaged.empty()) {
      out.push_back(static_cast<int32_t>(f));
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Status SourceLoader::SkipRowGroup(int file, int row_group, const Status& error,
                                  bool was_lost) {
  if (source_.on_error != OnError::kSkip) {
    return WithSkipHint(error, "unreadable files");
  }
  {
    std::lock_guard<std::mutex> lock(skipped_mu_);
    auto at = std::lower_bound(skipped_files_.begin(), skipped_files_.end(), file);
    if (at == skipped_files_.end() || *at != file) skipped_files_.insert(at, file);
  }
  const auto& f = file_list()[size_t(file)];
  const int64_t rows = f.row_group_rows[size_t(row_group)];
  if (!was_lost) {  // a lost file is logged once, when it was lost
    std::string why = error.message();
    const std::string where =
        DataLocation(f.path, files_->NamedRowGroup(row_group), -1) + ": ";
    if (why.compare(0, where.size(), where) == 0) why.erase(0, where.size());
    LogSkipLine(where + why + "; its " + std::to_string(rows) + " rows are skipped" +
                (files_->is_lost(file) ? "; the file is lost for the rest of the run "
                                         "(its other row groups are skipped too)"
                                       : ""));
  }
  if (files_->lost_files() == static_cast<int64_t>(file_list().size())) {
    return DataError(source_.path, "sources[" + std::to_string(source_index_) +
                                       "] (source '" + source_.name +
                                       "'): no readable file left (every file was "
                                       "skipped under on_error: skip); the last: " +
                                       error.message());
  }
  return Status::OK();
}

bool SourceLoader::PushBatch(std::vector<Sample>* batch,
                             const std::vector<int64_t>& charges) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_) return false;
  for (size_t j = 0; j < batch->size(); ++j) {
    const int64_t bytes = kSampleOverheadBytes + charges[j];
    queued_bytes_ += bytes;
    queue_.push_back(Queued{std::move((*batch)[j]), bytes});
  }
  profile_.SetHeld(queued_bytes_);
  const bool wake = consumer_waiting_;
  lock.unlock();
  if (wake) cv_.notify_all();
  return true;
}

void SourceLoader::SubmitFinish(Deferred d, const PayloadRef& ref, bool urgent) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) {
    ref.Set(Status::Cancelled("source '", source_.name, "' stopped"));
    return;
  }
  SubmitCounted([this, d = std::move(d), ref] { FinishPayload(d, ref); }, urgent);
}

void SourceLoader::FinishPayload(const Deferred& d, const PayloadRef& ref) {
  if (stop_requested_.load(std::memory_order_relaxed)) {
    ref.Set(Status::Cancelled("source '", source_.name, "' stopped"));
    return;
  }
  const int64_t start_ns = internal::ThreadCpuNs();
  std::shared_ptr<Payload> payload = d.payload;
  if (payload == nullptr) {  // counted by another process: the whole payload now
    RowOutput o;
    Status made = transform_->Apply(d.cols, d.index, /*want_payload=*/true, d.where, &o);
    const bool same = o.skip == SkipReason::kNone && o.tokens == d.tokens && o.payload;
    if (made.ok() && !same) {
      made = DataError(d.where.ToString(),
                       "made " + std::to_string(o.tokens) + " tokens where "
                       "runtime.length_cache counted " + std::to_string(d.tokens) +
                       " for it; the folder holds counts that are not this data's "
                       "(delete it)");
    }
    if (!made.ok() || !o.deferred) {
      profile_.AddFinish(internal::ThreadCpuNs() - start_ns);
      ref.Set(made.ok() ? Result<TokenPayload>(TokenPayload(std::move(o.payload)))
                        : Result<TokenPayload>(made));
      return;
    }
    payload = std::move(o.payload);
  }
  const Status st = transform_->Finish(d.cols, d.index, d.where, payload.get());
  profile_.AddFinish(internal::ThreadCpuNs() - start_ns);
  if (st.ok()) {
    ref.Set(TokenPayload(payload));
  } else if (source_.on_error == OnError::kSkip) {
    // Its metadata is out: keep the token count, deliver the blank Finish left.
    blanked_.fetch_add(1, std::memory_order_relaxed);
    std::string what = st.message();
    const std::string prefix = d.where.ToString() + ": ";
    if (what.compare(0, prefix.size(), prefix) == 0) what.erase(0, prefix.size());
    RowOutput o;
    o.skip = SkipReason::kError;
    o.null_what = what + "; its metadata was already published, so its payload is "
                  "blank and its loss mask 0";
    LogSkip(d.where, o);
    ref.Set(TokenPayload(payload));
  } else {
    ref.Set(WithSkipHint(st, "such rows"));
  }
}

void SourceLoader::TransformRows(int64_t first, int64_t end, bool want_payload) {
  const auto& file_list = this->file_list();
  // Chunks of consecutive rows, one ApplyBatch call each, as in ReadStep (a Hugging
  // Face tokenizer or a Python transform then enters Python once per chunk).
  const int64_t n = end - first;
  if (n <= 0) return;
  const int64_t workers = workers_.load(std::memory_order_relaxed);
  const int64_t chunk = std::clamp<int64_t>(
      (n + workers - 1) / workers, 1, std::max<int64_t>(1, transform_->batch_rows()));
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  helper_cpu_ns_ += pool_->ParallelFor(n_chunks, workers, [&](int64_t c) {
    if (stop_requested_.load(std::memory_order_relaxed)) return;
    std::vector<BatchRow> batch;
    std::vector<int64_t> is;
    for (int64_t i = first + c * chunk; i < std::min(end, first + (c + 1) * chunk); ++i) {
      const RowRef& r = rows_[size_t(i)];
      if (!unread_[size_t(r.arrays_slot)].empty()) {
        outputs_[size_t(i)].skip = SkipReason::kError;
        outputs_[size_t(i)].null_what = unread_[size_t(r.arrays_slot)];
        continue;
      }
      if (const auto kept = cached_.find(r.arrays_slot); kept != cached_.end()) {
        const CachedRow& k = kept->second[size_t(r.array_index)];
        RowOutput& o = outputs_[size_t(i)];
        o.skip = k.skip;
        o.tokens = k.tokens;
        o.image_tokens = k.image_tokens;
        estimates_[size_t(i)] = k.estimate_bytes;
        continue;
      }
      const Columns& cols = arrays_[size_t(r.arrays_slot)];
      estimates_[size_t(i)] = transform_->EstimateBytes(cols, r.array_index);
      batch.push_back(BatchRow{
          &cols, r.array_index,
          RowLocation{&file_list[size_t(r.file)].path,
                      files_->NamedRowGroup(r.row_group), r.row}});
      is.push_back(i);
    }
    if (batch.empty()) return;
    std::vector<RowOutput> o(batch.size());
    std::vector<Status> st(batch.size());
    transform_->ApplyBatch(batch, want_payload, o.data(), st.data());
    for (size_t b = 0; b < is.size(); ++b) {
      outputs_[size_t(is[b])] = std::move(o[b]);
      output_status_[size_t(is[b])] = std::move(st[b]);
    }
  });
}

void SourceLoader::FinishSharedEntry(SharedEntry* e) {
  const int64_t first = e->first;
  const int64_t end = static_cast<int64_t>(rows_.size());
  outputs_.resize(size_t(end));
  output_status_.resize(size_t(end), Status::OK());
  estimates_.resize(size_t(end), 0);
  apply_later_.resize(size_t(end), 0);
  if (e->kept) {
    // Counted by a process before: the counts now, each payload when it is wanted.
    const int64_t p = source_.image_patch_size;
    for (int64_t i = first; i < end; ++i) {
      const RowRef& r = rows_[size_t(i)];
      RowOutput& o = outputs_[size_t(i)];
      if (!unread_[size_t(r.arrays_slot)].empty()) {
        o.skip = SkipReason::kError;
        o.null_what = unread_[size_t(r.arrays_slot)];
        continue;
      }
      const CachedRow& k = (*e->kept)[size_t(i - first)];
      o.skip = k.skip;
      o.tokens = k.tokens;
      o.image_tokens = k.image_tokens;
      estimates_[size_t(i)] = k.estimate_bytes;
      if (k.skip != SkipReason::kNone) continue;
      apply_later_[size_t(i)] = 1;
      o.deferred = true;  // charged what the payload will hold: ids, mask, patches
      o.payload_bytes =
          k.tokens * 5 + k.image_tokens * 3 * p * p * int64_t{sizeof(float)};
    }
  } else {
    TransformRows(first, end, /*want_payload=*/true);
    if (e->entry && !stop_requested_.load(std::memory_order_relaxed)) {
      KeepEntry(*e->entry, first, end);
    }
  }
  e->lock.reset();
}

Status SourceLoader::LoadWindow() {
  const auto& file_list = this->file_list();
  if (!unreadable_logged_) {  // once per source (its first shard), not per loader
    unreadable_logged_ = true;
    for (const auto& f : file_list) {
      if (options_.shard_index != 0) continue;
      if (!f.unreadable.empty()) {
        LogSkipLine("file " + f.path + ": " + f.unreadable +
                    "; its rows are unknown (it did not open), it yields none");
      } else if (!f.damaged.empty()) {
        LogSkipLine("file " + f.path + ": " + f.damaged + "; it yields the " +
                    std::to_string(f.num_rows) +
                    " rows before the damage, the rest are unknown");
      }
    }
  }
  // The next window of this shard, across epochs.
  while (true) {
    if (windows_epoch_ != next_window_.epoch) {
      windows_ = EpochWindows(file_list, seed_, source_index_, next_window_.epoch,
                              source_.shuffle_window_rows, source_.shuffle_window_bytes);
      owners_ = WindowOwners(windows_, unit_owners_, options_.shard_count);
      windows_epoch_ = next_window_.epoch;
    }
    if (next_window_.window >= static_cast<int64_t>(windows_.size())) {
      next_window_ = StreamPos{next_window_.epoch + 1, 0, 0};
      continue;
    }
    if (owners_[size_t(next_window_.window)] != options_.shard_index) {
      next_window_ = StreamPos{next_window_.epoch, next_window_.window + 1, 0};
      continue;
    }
    break;
  }
  const StreamPos pos = next_window_;
  if (options_.on_read_window) {
    options_.on_read_window(options_.shard_index, pos.epoch, pos.window);
  }
  const ShuffleWindow& w = windows_[size_t(pos.window)];
  arrays_.clear();
  lengths_.clear();
  unread_.clear();
  rows_.clear();
  cached_.clear();
  to_cache_.clear();
  outputs_.clear();
  output_status_.clear();
  estimates_.clear();
  apply_later_.clear();
  rows_.reserve(static_cast<size_t>(w.rows));
  // Options::own_payloads with a cache: every entry's rows are made as it is read, the
  // entry's lock released before the next is taken.
  const bool sharing = options_.read_payloads && length_cache_ != nullptr;
  std::optional<SharedEntry> shared;
  for (size_t e = 0; e < w.row_groups.size(); ++e) {
    if (shared) FinishSharedEntry(&*shared);
    shared.reset();
    if (sharing) shared.emplace().first = static_cast<int64_t>(rows_.size());
    const auto [file, rg] = w.row_groups[e];
    const int64_t block_rows = w.block_rows.empty() ? 0 : w.block_rows[e];
    const auto& f = file_list[size_t(file)];
    int64_t row = f.row_group_first_row[size_t(rg)];  // of the chunk's first row
    std::vector<Columns> chunks;
    const bool was_lost = files_->is_lost(file);
    Status read;
    int64_t unread_rows = f.row_group_rows[size_t(rg)];  // of the row group or block
    if (length_cache_ && !was_lost) {
      // Planning a tokenized source: the entry's counts from an earlier pass, if kept.
      const int64_t block = block_rows == 0 ? 0 : w.blocks[e];
      const int64_t first = block * block_rows;
      const int64_t n = block_rows == 0
                            ? unread_rows
                            : std::min(block_rows, f.row_group_rows[size_t(rg)] - first);
      LengthCacheEntry entry{f.path, f.row_group_digest[size_t(rg)], rg, block_rows,
                             block};
      auto kept = length_cache_->Read(entry);
      const auto found = [&] { return kept && static_cast<int64_t>(kept->size()) == n; };
      if (sharing) {
        if (!found()) {  // counted here unless another process counts it first
          shared->lock = length_cache_->Lock(entry, stop_requested_);
          kept = length_cache_->Read(entry);
        }
        if (found()) {
          shared->kept = std::move(kept);
          length_cache_hits_.fetch_add(1, std::memory_order_relaxed);
        }
        shared->entry = std::move(entry);
      }
      const int64_t slot = static_cast<int64_t>(arrays_.size());
      if (sharing) {
        // Read on as without a cache; FinishSharedEntry makes the rows.
      } else if (found()) {
        for (int64_t i = 0; i < n; ++i) {
          rows_.push_back(RowRef{file, row + first + i, rg, i, slot});
        }
        arrays_.emplace_back();
        unread_.emplace_back();
        cached_.emplace(slot, std::move(*kept));
        length_cache_hits_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (!sharing) to_cache_.push_back(CacheWrite{std::move(entry), slot, -1});
    }
    if (lengths_only_) {
      // Token counts alone: this entry's rows of its row group (a Parquet row group's
      // counts are read once for all its blocks; a whole-file unit's block from its own
      // rows: SourceFiles::ReadBlockLengths).
      const int64_t first = block_rows == 0 ? 0 : w.blocks[e] * block_rows;
      if (block_rows != 0) {
        unread_rows = std::min(block_rows, f.row_group_rows[size_t(rg)] - first);
      }
      auto lengths = block_rows == 0 ? files_->ReadLengths(file, rg)
                                     : files_->ReadBlockLengths(file, rg, first, unread_rows);
      read = lengths.status();
      if (read.ok()) {
        for (int64_t i = 0; i < unread_rows; ++i) {
          rows_.push_back(RowRef{file, row + first + i, rg, i,
                                 static_cast<int64_t>(lengths_.size())});
        }
        lengths_.push_back(std::move(*lengths));
        unread_.emplace_back();
        continue;
      }
      row += first;
    } else if (block_rows == 0) {
      auto whole = files_->ReadChunks(file, rg);
      if (whole.ok()) chunks = std::move(*whole);
      read = whole.status();
    } else {
      row += w.blocks[e] * block_rows;
      unread_rows = std::min(block_rows, f.row_group_rows[size_t(rg)] -
                                             w.blocks[e] * block_rows);
      auto blocks = files_->ReadBlock(file, rg, block_rows, w.blocks[e]);
      if (blocks.ok()) chunks = std::move(*blocks);
      read = blocks.status();
    }
    if (!read.ok()) {
      // The rows keep their places and are delivered as skips (the header's
      // "Unreadable files"); logged once here, not per row.
      ARROW_RETURN_NOT_OK(SkipRowGroup(file, rg, read, was_lost));
      const int64_t slot =
          static_cast<int64_t>(lengths_only_ ? lengths_.size() : arrays_.size());
      for (int64_t i = 0; i < unread_rows; ++i) {
        rows_.push_back(RowRef{file, row + i, rg, i, slot});
      }
      if (lengths_only_) {
        lengths_.emplace_back();
      } else {
        arrays_.emplace_back();
      }
      unread_.push_back("row group not read: " + read.message());
      if (!to_cache_.empty() && to_cache_.back().end_slot < 0) to_cache_.pop_back();
      continue;
    }
    for (auto& cols : chunks) {
      const int64_t n = cols.front()->length();
      int64_t bytes = 0;
      for (const auto& array : cols) bytes += arrow::util::TotalBufferSize(*array);
      profile_.AddBytesRead(bytes);
      for (int64_t i = 0; i < n; ++i) {
        rows_.push_back(RowRef{file, row + i, rg, i, static_cast<int64_t>(arrays_.size())});
      }
      row += n;
      arrays_.push_back(std::move(cols));
      unread_.emplace_back();
    }
    if (!to_cache_.empty() && to_cache_.back().end_slot < 0) {
      to_cache_.back().end_slot = static_cast<int64_t>(arrays_.size());
    }
  }
  if (shared) {
    FinishSharedEntry(&*shared);
    shared.reset();
    if (stop_requested_.load(std::memory_order_relaxed)) {
      return Status::Cancelled("stopping");
    }
  }
  order_.resize(rows_.size());
  if (source_.shuffle_window_rows > 1) {
    order_ = Permutation(static_cast<int64_t>(rows_.size()),
                         DeriveSeed({seed_, kRowSalt, uint64_t(source_index_),
                                     uint64_t(pos.epoch), uint64_t(pos.window)}));
  } else {
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int64_t>(i);
  }
  loaded_ = true;
  loaded_pos_ = pos;
  next_window_ = StreamPos{pos.epoch, pos.window + 1, 0};
  precomputed_ = sharing;
  if (!options_.read_payloads) {
    // Metadata only: every row's output now, then the columns go (a window waiting for
    // room holds its rows' token counts, not their tokens).
    const int64_t n = static_cast<int64_t>(rows_.size());
    outputs_.assign(size_t(n), RowOutput{});
    output_status_.assign(size_t(n), Status::OK());
    estimates_.assign(size_t(n), 0);
    if (lengths_only_) {  // no columns: a few operations per row, on this thread
      for (int64_t i = 0; i < n; ++i) {
        const RowRef& r = rows_[size_t(i)];
        if (!unread_[size_t(r.arrays_slot)].empty()) {
          outputs_[size_t(i)].skip = SkipReason::kError;
          outputs_[size_t(i)].null_what = unread_[size_t(r.arrays_slot)];
          continue;
        }
        const auto& counts = *lengths_[size_t(r.arrays_slot)];
        estimates_[size_t(i)] =
            transform_->ApplyLength(counts[size_t(r.array_index)], &outputs_[size_t(i)]);
      }
      lengths_.clear();
      precomputed_ = true;
      return Status::OK();
    }
    TransformRows(0, n, /*want_payload=*/false);
    if (stop_requested_.load(std::memory_order_relaxed)) {
      return Status::Cancelled("stopping");
    }
    KeepLengths();
    arrays_.clear();
    cached_.clear();
    precomputed_ = true;
  }
  return Status::OK();
}

void SourceLoader::KeepLengths() {
  if (to_cache_.empty()) return;
  // rows_ holds each slot's rows together, slots in increasing order.
  size_t i = 0;
  for (const CacheWrite& w : to_cache_) {
    while (i < rows_.size() && rows_[i].arrays_slot < w.first_slot) ++i;
    const size_t first = i;
    while (i < rows_.size() && rows_[i].arrays_slot < w.end_slot) ++i;
    KeepEntry(w.entry, int64_t(first), int64_t(i));
  }
  to_cache_.clear();
}

void SourceLoader::KeepEntry(const LengthCacheEntry& entry, int64_t first, int64_t end) {
  std::vector<CachedRow> rows;
  for (int64_t i = first; i < end; ++i) {
    const RowOutput& o = outputs_[size_t(i)];
    if (!output_status_[size_t(i)].ok() || !o.null_what.empty() ||
        o.skip == SkipReason::kNull || o.skip == SkipReason::kError) {
      return;  // a row with a message to repeat: not kept
    }
    rows.push_back(CachedRow{o.tokens, o.image_tokens, estimates_[size_t(i)], o.skip});
  }
  if (!rows.empty()) length_cache_->Write(entry, rows);
}

Status SourceLoader::ReadStep() {
  if (!loaded_) ARROW_RETURN_NOT_OK(LoadWindow());
  const auto& file_list = this->file_list();
  const int64_t epoch = loaded_pos_.epoch;
  const int64_t window = loaded_pos_.window;
  const int64_t n = static_cast<int64_t>(rows_.size());
  const int64_t k = loaded_pos_.offset;
  const int64_t workers = workers_.load(std::memory_order_relaxed);
  // A transform that takes rows in larger calls (a cheap one: the token column) gets
  // batches of as many.
  const int64_t max_rows =
      std::max<int64_t>(kBatchRowsPerWorker, transform_->batch_rows()) * workers;
  const int64_t max_bytes =
      std::max<int64_t>(1, read_ahead_bytes_.load(std::memory_order_relaxed) / 4);
  // The batch [k, end): at most max_rows rows and about max_bytes of payload.
  int64_t end = k, bytes = 0;
  std::vector<int64_t> estimate;
  while (end < n && end - k < max_rows && (end == k || bytes < max_bytes)) {
    const int64_t i = order_[size_t(end)];
    const RowRef& r = rows_[size_t(i)];
    const bool read = unread_[size_t(r.arrays_slot)].empty();
    estimate.push_back(precomputed_ ? estimates_[size_t(i)]
                       : read       ? transform_->EstimateBytes(
                                    arrays_[size_t(r.arrays_slot)], r.array_index)
                                    : 0);
    bytes += estimate.back();
    ++end;
  }
  const int64_t m = end - k;
  std::vector<RowOutput> out(size_t(m), RowOutput{});
  std::vector<Status> status(size_t(m), Status::OK());
  auto where = [&](const RowRef& r) {
    return RowLocation{&file_list[size_t(r.file)].path,
                       files_->NamedRowGroup(r.row_group), r.row};
  };
  if (precomputed_) {
    for (int64_t j = 0; j < m; ++j) {
      const int64_t i = order_[size_t(k + j)];
      out[size_t(j)] = std::move(outputs_[size_t(i)]);
      status[size_t(j)] = output_status_[size_t(i)];
    }
  } else {
    // Chunks of consecutive rows, one ApplyBatch call each (one row each unless the
    // transform encodes batches: Hugging Face tokenizers), spread over the workers.
    const int64_t chunk = std::clamp<int64_t>((m + workers - 1) / workers, 1,
                                              std::max<int64_t>(1, transform_->batch_rows()));
    const int64_t n_chunks = (m + chunk - 1) / chunk;
    helper_cpu_ns_ += pool_->ParallelFor(n_chunks, workers, [&](int64_t c) {
      if (stop_requested_.load(std::memory_order_relaxed)) return;
      std::vector<BatchRow> batch;
      std::vector<int64_t> js;
      for (int64_t j = c * chunk; j < std::min(m, (c + 1) * chunk); ++j) {
        const RowRef& r = rows_[size_t(order_[size_t(k + j)])];
        const std::string& not_read = unread_[size_t(r.arrays_slot)];
        if (!not_read.empty()) {
          out[size_t(j)].skip = SkipReason::kError;
          out[size_t(j)].null_what = not_read;
          continue;
        }
        batch.push_back(BatchRow{&arrays_[size_t(r.arrays_slot)], r.array_index, where(r)});
        js.push_back(j);
      }
      if (batch.empty()) return;
      if (js.back() - js.front() + 1 == int64_t(js.size())) {  // contiguous: in place
        transform_->ApplyBatch(batch, options_.read_payloads, &out[size_t(js.front())],
                               &status[size_t(js.front())]);
        return;
      }
      std::vector<RowOutput> o(batch.size());
      std::vector<Status> st(batch.size());
      transform_->ApplyBatch(batch, options_.read_payloads, o.data(), st.data());
      for (size_t b = 0; b < js.size(); ++b) {
        out[size_t(js[b])] = std::move(o[b]);
        status[size_t(js[b])] = std::move(st[b]);
      }
    });
  }
  if (stop_requested_.load(std::memory_order_relaxed)) {
    return Status::Cancelled("stopping");
  }
  // The batch is queued under one lock with one wake-up; an error is returned after the
  // samples before it.
  Status error;
  std::vector<Sample> samples;
  std::vector<int64_t> charges;
  samples.reserve(size_t(m));
  for (int64_t j = 0; j < m && error.ok(); ++j) {
    const RowRef& r = rows_[size_t(order_[size_t(k + j)])];
    if (!status[size_t(j)].ok()) {
      error = status[size_t(j)];
      break;
    }
    RowOutput& o = out[size_t(j)];
    Sample s;
    s.meta.source = source_index_;
    s.meta.file = r.file;
    s.meta.row = r.row;
    s.meta.epoch = epoch;
    s.meta.pos = StreamPos{epoch, window, k + j};
    s.meta.skip = o.skip;
    const bool bad = o.skip == SkipReason::kNull || o.skip == SkipReason::kError;
    if (bad && source_.on_error == OnError::kFail) {
      error = WithSkipHint(DataError(where(r).ToString(), o.null_what), "such rows");
      break;
    }
    // (An unread row group was logged once, not per row.)
    if (o.skip != SkipReason::kNone && unread_[size_t(r.arrays_slot)].empty()) {
      if (o.skip == SkipReason::kNull) {  // null as read: the reader may know why
        std::string why = files_->WhyNull(r.file, r.row);
        if (!why.empty()) o.null_what = std::move(why);
      }
      LogSkip(where(r), o);
    }
    if (o.skip == SkipReason::kNone) {
      s.meta.tokens = o.tokens;
      s.meta.image_tokens = o.image_tokens;
      ++step_samples_;
      step_tokens_ += o.tokens;
      const bool later =
          !apply_later_.empty() && apply_later_[size_t(order_[size_t(k + j)])] != 0;
      if ((o.payload && o.deferred) || later) {
        s.payload = PayloadRef::OnDemand(
            [gate = gate_,
             d = Deferred{std::move(o.payload), arrays_[size_t(r.arrays_slot)],
                          r.array_index, where(r), o.tokens}](const PayloadRef& ref,
                                                              bool urgent) mutable {
              std::lock_guard<std::mutex> lock(gate->mu);
              if (gate->loader == nullptr) {
                ref.Set(Status::Cancelled("source '", gate->source_name, "' stopped"));
              } else {
                gate->loader->SubmitFinish(std::move(d), ref, urgent);
              }
            });
      } else if (o.payload) {
        s.payload = PayloadRef(TokenPayload(std::move(o.payload)));
      }
    }
    // Charged what it holds (a payload still to decode: its finished size), or without a
    // payload what its row decoded to.
    charges.push_back(!s.payload   ? estimate[size_t(j)]
                      : o.deferred ? o.payload_bytes
                                   : s.payload.bytes());
    samples.push_back(std::move(s));
  }
  step_rows_ += static_cast<int64_t>(samples.size());
  CountStep();
  if (!PushBatch(&samples, charges)) return Status::Cancelled("stopping");
  ARROW_RETURN_NOT_OK(error);
  loaded_pos_.offset = end;
  if (end >= n) {  // the window is done: its arrays go with its last samples
    loaded_ = false;
    arrays_.clear();
    unread_.clear();
    rows_.clear();
    order_.clear();
    outputs_.clear();
    output_status_.clear();
    estimates_.clear();
  }
  return Status::OK();
}

}  // namespace braid
