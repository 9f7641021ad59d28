#include "braid/source/source_loader.h"

#include <algorithm>
#include <limits>
#include <string_view>

#include <arrow/api.h>

#include "braid/source/transform.h"
#include "braid/source/worker_pool.h"
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

// One row of a window before the shuffle.
struct RowRef {
  int32_t file = 0;
  int64_t row = 0;
  int32_t row_group = 0;
  int64_t row_in_group = 0;
  int64_t array_index = 0;  // into the window's arrays
  int64_t arrays_slot = 0;
};

}  // namespace

std::vector<ShuffleWindow> EpochWindows(const SourceFiles& files, uint64_t seed,
                                        int32_t source_index, int64_t epoch,
                                        int64_t window_rows) {
  return EpochWindows(files.files(), seed, source_index, epoch, window_rows);
}

std::vector<ShuffleWindow> EpochWindows(const std::vector<SourceFiles::File>& fs,
                                        uint64_t seed, int32_t source_index,
                                        int64_t epoch, int64_t window_rows) {
  const auto file_order = Permutation(static_cast<int64_t>(fs.size()),
                                      DeriveSeed({seed, kFileSalt, uint64_t(source_index),
                                                  uint64_t(epoch)}));
  std::vector<ShuffleWindow> windows;
  ShuffleWindow current;
  for (int64_t f : file_order) {
    const auto& file = fs[static_cast<size_t>(f)];
    const auto rg_order = Permutation(
        static_cast<int64_t>(file.row_group_rows.size()),
        DeriveSeed({seed, kRowGroupSalt, uint64_t(source_index), uint64_t(epoch),
                    uint64_t(f)}));
    for (int64_t rg : rg_order) {
      const int64_t rows = file.row_group_rows[static_cast<size_t>(rg)];
      if (rows == 0) continue;
      current.row_groups.emplace_back(static_cast<int32_t>(f), static_cast<int32_t>(rg));
      current.rows += rows;
      if (current.rows >= window_rows) {
        windows.push_back(std::move(current));
        current = ShuffleWindow{};
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
      skip_log_(options_.skip_log ? options_.skip_log : NewSkipLog()),
      total_rows_(files_->total_rows()) {}

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
  auto windows =
      EpochWindows(file_list, config.seed, source_index, start.epoch, window_rows);
  if (start.window < static_cast<int64_t>(windows.size()) &&
      start.offset == windows[size_t(start.window)].rows) {
    start.offset = 0;
    if (++start.window == static_cast<int64_t>(windows.size())) {
      start = StreamPos{start.epoch + 1, 0, 0};
      windows = EpochWindows(file_list, config.seed, source_index, start.epoch, window_rows);
    }
  }
  if (start.window >= static_cast<int64_t>(windows.size()) ||
      start.offset >= windows[size_t(start.window)].rows) {
    return ConfigError(key, "stream position (epoch " + std::to_string(start.epoch) +
                                ", window " + std::to_string(start.window) + ", offset " +
                                std::to_string(start.offset) +
                                ") lies outside the source; did its files change?");
  }
  return std::unique_ptr<SourceLoader>(
      new SourceLoader(config, source_index, start, options, std::move(files),
                       std::move(transform)));
}

SourceLoader::~SourceLoader() { Stop(); }

std::shared_ptr<internal::LogEveryN> SourceLoader::NewSkipLog() {
  return std::make_shared<internal::LogEveryN>(/*first=*/kSkipLogFirst,
                                               /*every=*/kSkipLogEvery);
}

void SourceLoader::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  // As in Next(): never once stopping (Stop() joins reader_ outside mu_).
  if (!started_ && !stopping_) {
    started_ = true;
    reader_ = std::thread([this] { ReaderLoop(); });
  }
}

void SourceLoader::Stop() {
  stop_requested_.store(true, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // A user transform's workers may wait for a lock this thread holds (the GIL): let them
  // go before joining.
  transform_->Cancel();
  if (reader_.joinable()) reader_.join();
}

Result<Sample> SourceLoader::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  // Never start the reader once stopping: Stop() reads reader_ outside mu_ after setting
  // stopping_, so a thread started here afterwards would race with it (and outlive it).
  if (!started_ && !stopping_) {
    started_ = true;
    reader_ = std::thread([this] { ReaderLoop(); });
  }
  ++waiting_;
  cv_.wait(lock, [this] { return !queue_.empty() || !error_.ok() || stopping_; });
  --waiting_;
  if (!queue_.empty() && !stopping_) {
    Queued& front = queue_.front();
    Sample s = std::move(front.sample);
    if (front.pending) {
      ReleaseLocked(front.pending.get());
    } else {
      queued_bytes_ -= front.bytes;
    }
    queue_.pop_front();
    // Wake the reader only if it waits (on a full queue): a notify per sample costs more
    // than the sample on a busy machine.
    const bool wake = waiting_ > 0;
    lock.unlock();
    if (wake) cv_.notify_all();
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
  const auto& files = file_list();  // File::unreadable is set once, in Make
  for (size_t f = 0; f < files.size(); ++f) {
    if (!files[f].unreadable.empty()) out.push_back(static_cast<int32_t>(f));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Status SourceLoader::SkipRowGroup(int file, int row_group, const Status& error,
                                  bool was_lost) {
  if (source_.on_error != OnError::kSkip) {
    return error.WithMessage(error.message(),
                             " (set on_error: skip to skip unreadable files)");
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
    const std::string where = DataLocation(f.path, row_group, -1) + ": ";
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

void SourceLoader::ReleaseLocked(PendingCharge* charge) {
  if (--charge->holds == 0) queued_bytes_ -= charge->bytes;
}

bool SourceLoader::PushBatch(std::vector<Sample>* batch, std::vector<Deferred>* deferred) {
  std::unique_lock<std::mutex> lock(mu_);
  auto next_deferred = deferred->begin();
  for (size_t j = 0; j < batch->size(); ++j) {
    Sample& sample = (*batch)[j];
    const bool pending = next_deferred != deferred->end() && next_deferred->sample == j;
    const int64_t bytes =
        kSampleOverheadBytes + (pending ? next_deferred->bytes : sample.payload.bytes());
    // Always admit one sample when nothing is charged (an empty queue, no payload still
    // finishing), however large.
    auto room = [&] {
      return stopping_ || queued_bytes_ == 0 ||
             queued_bytes_ + bytes <= options_.read_ahead_bytes;
    };
    if (!room()) {
      if (waiting_ > 0) cv_.notify_all();  // the consumer may sleep on what is queued
      ++waiting_;
      cv_.wait(lock, room);
      --waiting_;
    }
    if (stopping_) return false;
    queued_bytes_ += bytes;
    Queued q{std::move(sample), pending ? 0 : bytes, nullptr};
    if (pending) {
      q.pending = std::make_shared<PendingCharge>();
      q.pending->bytes = bytes;
      // Decoding starts as soon as the sample is queued (never later: the consumer may
      // already wait for it, and its charge is only released once it is finished).
      decoder_->Submit([this, d = std::move(*next_deferred), ref = q.sample.payload,
                        charge = q.pending] { FinishPayload(d, ref, charge); });
      ++next_deferred;
    }
    queue_.push_back(std::move(q));
  }
  const bool wake = waiting_ > 0;
  lock.unlock();
  if (wake) cv_.notify_all();
  return true;
}

void SourceLoader::FinishPayload(const Deferred& d, const PayloadRef& ref,
                                 const std::shared_ptr<PendingCharge>& charge) {
  if (stop_requested_.load(std::memory_order_relaxed)) {
    ref.Set(Status::Cancelled("source '", source_.name, "' stopped"));
  } else {
    const Status st = transform_->Finish(d.cols, d.index, d.where, d.payload.get());
    if (st.ok()) {
      ref.Set(TokenPayload(d.payload));
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
      ref.Set(TokenPayload(d.payload));
    } else {
      ref.Set(st.WithMessage(st.message(), " (set on_error: skip to skip such rows)"));
    }
  }
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseLocked(charge.get());
    wake = waiting_ > 0;
  }
  if (wake) cv_.notify_all();
}

void SourceLoader::ReaderLoop() {
  // Metadata first: the reader alone reads headers, `workers` threads decode.
  const bool defer = options_.read_payloads && transform_->defers();
  pool_ = std::make_unique<WorkerPool>(defer ? 1 : source_.workers);
  if (defer) decoder_ = std::make_unique<TaskRunner>(source_.workers);
  Status st;
  StreamPos pos = start_;
  const auto& file_list = this->file_list();
  if (options_.shard_index == 0) {  // once per source, not per loader
    for (const auto& f : file_list) {
      if (f.unreadable.empty()) continue;
      LogSkipLine("file " + f.path + ": " + f.unreadable +
                  "; its rows are unknown (the footer did not read), it yields none");
    }
  }
  while (st.ok()) {
    const auto windows = EpochWindows(file_list, seed_, source_index_, pos.epoch,
                                      source_.shuffle_window_rows);
    for (int64_t w = pos.window; w < static_cast<int64_t>(windows.size()) && st.ok(); ++w) {
      if (w % options_.shard_count != options_.shard_index) continue;  // another shard's
      if (options_.on_read_window) {
        options_.on_read_window(options_.shard_index, pos.epoch, w);
      }
      st = ReadWindow(pos.epoch, w, windows[size_t(w)], w == pos.window ? pos.offset : 0);
    }
    pos = StreamPos{pos.epoch + 1, 0, 0};
  }
  pool_.reset();  // joins the workers
  decoder_.reset();  // finishes (or, stopping, cancels) every payload handed to it
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!st.IsCancelled()) error_ = st;
  }
  cv_.notify_all();
}

Result<std::vector<std::shared_ptr<arrow::Array>>> SourceLoader::ReadColumns(int file,
                                                                             int row_group) {
  return files_->ReadColumns(file, row_group);
}

Status SourceLoader::ReadWindow(int64_t epoch, int64_t window, const ShuffleWindow& w,
                                int64_t first_offset) {
  std::vector<Columns> arrays;  // one entry per row group of the window
  std::vector<RowRef> rows;
  rows.reserve(static_cast<size_t>(w.rows));
  const auto& file_list = this->file_list();
  // Per entry of `arrays`: why its row group was not read ("": read). The rows of an
  // unread row group keep their places and are delivered as skips (the header's
  // "Unreadable files").
  std::vector<std::string> unread;
  for (const auto& [file, rg] : w.row_groups) {
    const auto& f = file_list[size_t(file)];
    const bool was_lost = files_->is_lost(file);
    auto cols = ReadColumns(file, rg);
    int64_t n = 0;
    if (cols.ok()) {
      n = cols->front()->length();
      arrays.push_back(std::move(*cols));
      unread.emplace_back();
    } else {
      ARROW_RETURN_NOT_OK(SkipRowGroup(file, rg, cols.status(), was_lost));
      n = f.row_group_rows[size_t(rg)];
      arrays.emplace_back();
      unread.push_back("row group not read: " + cols.status().message());
    }
    const int64_t slot = static_cast<int64_t>(arrays.size()) - 1;
    for (int64_t i = 0; i < n; ++i) {
      rows.push_back(RowRef{file, f.row_group_first_row[size_t(rg)] + i, rg, i, i, slot});
    }
  }
  std::vector<int64_t> order(rows.size());
  if (source_.shuffle_window_rows > 1) {
    order = Permutation(static_cast<int64_t>(rows.size()),
                        DeriveSeed({seed_, kRowSalt, uint64_t(source_index_),
                                    uint64_t(epoch), uint64_t(window)}));
  } else {
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t max_rows = kBatchRowsPerWorker * pool_->threads();
  const int64_t max_bytes = std::max<int64_t>(1, options_.read_ahead_bytes / 4);
  std::vector<RowOutput> out;
  std::vector<Status> status;
  std::vector<Sample> samples;
  std::vector<Deferred> deferred;
  for (int64_t k = first_offset; k < n;) {
    // The batch [k, end): at most max_rows rows and about max_bytes of payload.
    int64_t end = k, bytes = 0;
    while (end < n && end - k < max_rows && (end == k || bytes < max_bytes)) {
      const RowRef& r = rows[size_t(order[size_t(end)])];
      if (unread[size_t(r.arrays_slot)].empty()) {
        bytes += transform_->EstimateBytes(arrays[size_t(r.arrays_slot)], r.array_index);
      }
      ++end;
    }
    const int64_t m = end - k;
    out.assign(size_t(m), RowOutput{});
    status.assign(size_t(m), Status::OK());
    auto where = [&](const RowRef& r) {
      return RowLocation{&file_list[size_t(r.file)].path, r.row_group, r.row};
    };
    // Chunks of consecutive rows, one ApplyBatch call each (one row each unless the
    // transform encodes batches: Hugging Face tokenizers), spread over the workers.
    const int64_t chunk = std::clamp<int64_t>((m + pool_->threads() - 1) / pool_->threads(),
                                              1, std::max<int64_t>(1, transform_->batch_rows()));
    pool_->ParallelFor((m + chunk - 1) / chunk, [&](int64_t c) {
      if (stop_requested_.load(std::memory_order_relaxed)) return;
      std::vector<BatchRow> batch;
      std::vector<int64_t> js;
      for (int64_t j = c * chunk; j < std::min(m, (c + 1) * chunk); ++j) {
        const RowRef& r = rows[size_t(order[size_t(k + j)])];
        const std::string& not_read = unread[size_t(r.arrays_slot)];
        if (!not_read.empty()) {
          out[size_t(j)].skip = SkipReason::kError;
          out[size_t(j)].null_what = not_read;
          continue;
        }
        batch.push_back(BatchRow{&arrays[size_t(r.arrays_slot)], r.array_index, where(r)});
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
    if (stop_requested_.load(std::memory_order_relaxed)) {
      return Status::Cancelled("stopping");
    }
    // The batch is queued under one lock with one wake-up; an error is returned after the
    // samples before it.
    Status error;
    samples.clear();
    deferred.clear();
    for (int64_t j = 0; j < m && error.ok(); ++j) {
      const RowRef& r = rows[size_t(order[size_t(k + j)])];
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
        error = DataError(where(r).ToString(),
                          o.null_what + " (set on_error: skip to skip such rows)");
        break;
      }
      // (An unread row group was logged once, not per row.)
      if (o.skip != SkipReason::kNone && unread[size_t(r.arrays_slot)].empty()) {
        LogSkip(where(r), o);
      }
      if (o.skip == SkipReason::kNone) {
        s.meta.tokens = o.tokens;
        s.meta.image_tokens = o.image_tokens;
        if (o.payload && o.deferred) {
          s.payload = PayloadRef::Pending();
          deferred.push_back(Deferred{samples.size(), std::move(o.payload),
                                      arrays[size_t(r.arrays_slot)], r.array_index,
                                      where(r), o.payload_bytes});
        } else if (o.payload) {
          s.payload = PayloadRef(TokenPayload(std::move(o.payload)));
        }
      }
      samples.push_back(std::move(s));
    }
    if (!PushBatch(&samples, &deferred)) return Status::Cancelled("stopping");
    ARROW_RETURN_NOT_OK(error);
    k = end;
  }
  return Status::OK();
}

}  // namespace braid
