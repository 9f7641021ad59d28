#include "braid/source/source_loader.h"

#include <limits>

#include <arrow/api.h>

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

// One row of a window before the shuffle.
struct RowRef {
  int32_t file = 0;
  int64_t row = 0;
  int32_t row_group = 0;
  int64_t row_in_group = 0;
  int64_t array_index = 0;  // into the window's arrays
  int64_t arrays_slot = 0;
};

template <typename ListT, typename ValueT>
Status CopyTokens(const ListT& list, int64_t i, std::vector<int32_t>* out,
                  const std::string& where) {
  const auto& values = static_cast<const ValueT&>(*list.values());
  const int64_t begin = list.value_offset(i);
  const int64_t len = list.value_length(i);
  out->resize(static_cast<size_t>(len));
  const auto* raw = values.raw_values();
  for (int64_t k = 0; k < len; ++k) {
    const auto v = raw[begin + k];
    if constexpr (sizeof(v) > sizeof(int32_t)) {
      if (v < 0 || v > std::numeric_limits<int32_t>::max()) {
        return DataError(where, "token id " + std::to_string(v) + " does not fit int32");
      }
    }
    (*out)[static_cast<size_t>(k)] = static_cast<int32_t>(v);
  }
  return Status::OK();
}

// Length, null flag, and child-null check of row `i` of a list<int> array.
struct RowInfo {
  int64_t length = 0;
  bool null = false;
  bool has_null_values = false;
};

RowInfo InfoOf(const arrow::Array& array, int64_t i) {
  RowInfo info;
  info.null = array.IsNull(i);
  if (info.null) return info;
  std::shared_ptr<arrow::Array> values;
  int64_t begin = 0;
  if (array.type_id() == arrow::Type::LIST) {
    const auto& list = static_cast<const arrow::ListArray&>(array);
    info.length = list.value_length(i);
    begin = list.value_offset(i);
    values = list.values();
  } else {
    const auto& list = static_cast<const arrow::LargeListArray&>(array);
    info.length = list.value_length(i);
    begin = list.value_offset(i);
    values = list.values();
  }
  if (values->null_count() > 0) {
    for (int64_t k = 0; k < info.length; ++k) {
      if (values->IsNull(begin + k)) {
        info.has_null_values = true;
        break;
      }
    }
  }
  return info;
}

Status Tokens(const arrow::Array& array, int64_t i, std::vector<int32_t>* out,
              const std::string& where) {
  const bool large = array.type_id() == arrow::Type::LARGE_LIST;
  const bool wide = array.type()->field(0)->type()->id() == arrow::Type::INT64;
  if (!large) {
    const auto& list = static_cast<const arrow::ListArray&>(array);
    return wide ? CopyTokens<arrow::ListArray, arrow::Int64Array>(list, i, out, where)
                : CopyTokens<arrow::ListArray, arrow::Int32Array>(list, i, out, where);
  }
  const auto& list = static_cast<const arrow::LargeListArray&>(array);
  return wide ? CopyTokens<arrow::LargeListArray, arrow::Int64Array>(list, i, out, where)
              : CopyTokens<arrow::LargeListArray, arrow::Int32Array>(list, i, out, where);
}

}  // namespace

std::vector<ShuffleWindow> EpochWindows(const SourceFiles& files, uint64_t seed,
                                        int32_t source_index, int64_t epoch,
                                        int64_t window_rows) {
  const auto& fs = files.files();
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
                           Options options, std::unique_ptr<SourceFiles> files)
    : source_(config.sources[static_cast<size_t>(source_index)]),
      seed_(config.seed),
      source_index_(source_index),
      start_(start),
      options_(options),
      files_(std::move(files)) {}

Result<std::unique_ptr<SourceLoader>> SourceLoader::Make(const Config& config,
                                                         int32_t source_index,
                                                         StreamPos start, Options options) {
  const std::string key = "sources[" + std::to_string(source_index) + "]";
  ARROW_ASSIGN_OR_RAISE(auto files,
                        SourceFiles::Open(config.sources[size_t(source_index)], key));
  if (start.epoch < 0 || start.window < 0 || start.offset < 0) {
    return Status::Invalid(key, ": stream position must not be negative");
  }
  // A position one past the end of a window means the start of the next one.
  const int64_t window_rows = config.sources[size_t(source_index)].shuffle_window_rows;
  auto windows = EpochWindows(*files, config.seed, source_index, start.epoch, window_rows);
  if (start.window < static_cast<int64_t>(windows.size()) &&
      start.offset == windows[size_t(start.window)].rows) {
    start.offset = 0;
    if (++start.window == static_cast<int64_t>(windows.size())) {
      start = StreamPos{start.epoch + 1, 0, 0};
      windows = EpochWindows(*files, config.seed, source_index, start.epoch, window_rows);
    }
  }
  if (start.window >= static_cast<int64_t>(windows.size()) ||
      start.offset >= windows[size_t(start.window)].rows) {
    return Status::Invalid(key, ": stream position (epoch ", start.epoch, ", window ",
                           start.window, ", offset ", start.offset,
                           ") lies outside the source; did its files change?");
  }
  return std::unique_ptr<SourceLoader>(
      new SourceLoader(config, source_index, start, options, std::move(files)));
}

SourceLoader::~SourceLoader() { Stop(); }

void SourceLoader::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
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
  cv_.wait(lock, [this] { return !queue_.empty() || !error_.ok() || stopping_; });
  if (!queue_.empty()) {
    Sample s = std::move(queue_.front());
    queue_.pop_front();
    queued_bytes_ -= kSampleOverheadBytes +
                     s.payload.bytes();
    lock.unlock();
    cv_.notify_all();
    return s;
  }
  if (!error_.ok()) return error_;
  return Status::Cancelled("source '", source_.name, "' stopped");
}

bool SourceLoader::Push(Sample sample) {
  const int64_t bytes = kSampleOverheadBytes +
                        sample.payload.bytes();
  std::unique_lock<std::mutex> lock(mu_);
  // Always admit one sample into an empty queue, however large.
  cv_.wait(lock, [&] {
    return stopping_ || queue_.empty() || queued_bytes_ + bytes <= options_.read_ahead_bytes;
  });
  if (stopping_) return false;
  queued_bytes_ += bytes;
  queue_.push_back(std::move(sample));
  lock.unlock();
  cv_.notify_all();
  return true;
}

void SourceLoader::ReaderLoop() {
  Status st;
  StreamPos pos = start_;
  while (st.ok()) {
    const auto windows = EpochWindows(*files_, seed_, source_index_, pos.epoch,
                                      source_.shuffle_window_rows);
    for (int64_t w = pos.window; w < static_cast<int64_t>(windows.size()) && st.ok(); ++w) {
      st = ReadWindow(pos.epoch, w, windows[size_t(w)], w == pos.window ? pos.offset : 0);
    }
    pos = StreamPos{pos.epoch + 1, 0, 0};
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!st.IsCancelled()) error_ = st;
  }
  cv_.notify_all();
}

Status SourceLoader::ReadWindow(int64_t epoch, int64_t window, const ShuffleWindow& w,
                                int64_t first_offset) {
  std::vector<std::shared_ptr<arrow::Array>> arrays;
  std::vector<RowRef> rows;
  rows.reserve(static_cast<size_t>(w.rows));
  for (const auto& [file, rg] : w.row_groups) {
    ARROW_ASSIGN_OR_RAISE(auto array, files_->ReadTokens(file, rg));
    const auto& f = files_->files()[size_t(file)];
    for (int64_t i = 0; i < array->length(); ++i) {
      rows.push_back(RowRef{file, f.row_group_first_row[size_t(rg)] + i, rg, i, i,
                            static_cast<int64_t>(arrays.size())});
    }
    arrays.push_back(std::move(array));
  }
  std::vector<int64_t> order(rows.size());
  if (source_.shuffle_window_rows > 1) {
    order = Permutation(static_cast<int64_t>(rows.size()),
                        DeriveSeed({seed_, kRowSalt, uint64_t(source_index_),
                                    uint64_t(epoch), uint64_t(window)}));
  } else {
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  }
  for (int64_t k = first_offset; k < static_cast<int64_t>(rows.size()); ++k) {
    const RowRef& r = rows[size_t(order[size_t(k)])];
    const arrow::Array& array = *arrays[size_t(r.arrays_slot)];
    Sample s;
    s.meta.source = source_index_;
    s.meta.file = r.file;
    s.meta.row = r.row;
    s.meta.epoch = epoch;
    s.meta.pos = StreamPos{epoch, window, k};
    const RowInfo info = InfoOf(array, r.array_index);
    const std::string& path = files_->files()[size_t(r.file)].path;
    if (info.null || info.has_null_values) {
      if (source_.on_error == OnError::kFail) {
        return DataError(DataLocation(path, r.row_group, r.row),
                         std::string(info.null ? "null" : "null token in") + " column '" +
                             source_.tokens_column +
                             "' (set on_error: skip to skip such rows)");
      }
      s.meta.skip = SkipReason::kNull;
    } else if (info.length == 0) {
      s.meta.skip = SkipReason::kEmpty;
    } else {
      s.meta.tokens = info.length;
      if (options_.read_payloads) {
        auto payload = std::make_shared<Payload>();
        ARROW_RETURN_NOT_OK(Tokens(array, r.array_index, &payload->tokens,
                                   DataLocation(path, r.row_group, r.row)));
        s.payload = PayloadRef(std::move(payload));
      }
    }
    if (!Push(std::move(s))) return Status::Cancelled("stopping");
  }
  return Status::OK();
}

}  // namespace braid
