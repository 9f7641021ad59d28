#include "braid/testing/memory_stream.h"

#include <algorithm>

#include "braid/util/rng_internal.h"

namespace braid::testing {

MemoryStream::MemoryStream(std::shared_ptr<const Docs> docs, Options options,
                           StreamPos start)
    : docs_(std::move(docs)), options_(std::move(options)), pos_(start) {
  payloads_.reserve(docs_->size());
  for (const auto& d : *docs_)
    payloads_.push_back(MakeTokenPayload(d));
  if (pos_.window < NumWindows() && pos_.offset == WindowRows(pos_.window)) {
    pos_.offset = 0;
    if (++pos_.window == NumWindows()) pos_ = StreamPos{pos_.epoch + 1, 0, 0};
  }
}

int64_t MemoryStream::NumWindows() const {
  const int64_t n = rows_per_epoch();
  return (n + options_.window_rows - 1) / options_.window_rows;
}

int64_t MemoryStream::WindowRows(int64_t window) const {
  return std::min(options_.window_rows, rows_per_epoch() - window * options_.window_rows);
}

std::vector<int64_t> MemoryStream::EpochOrder(int64_t epoch) const {
  return internal::Permutation(
      rows_per_epoch(),
      internal::DeriveSeed({options_.seed, uint64_t(options_.source), uint64_t(epoch)}));
}

const std::vector<int32_t>& MemoryStream::Doc(int32_t file, int64_t row) const {
  return (*docs_)[size_t(GlobalRow(file, row))];
}

Result<Sample> MemoryStream::Next() {
  ++next_calls_;
  if (order_epoch_ != pos_.epoch) {
    order_ = EpochOrder(pos_.epoch);
    order_epoch_ = pos_.epoch;
  }
  const int64_t index = pos_.window * options_.window_rows + pos_.offset;
  if (pos_.window >= NumWindows() || pos_.offset >= WindowRows(pos_.window)) {
    return Status::Invalid("memory stream: position outside the order");
  }
  const int64_t global = order_[size_t(index)];
  Sample s;
  s.meta.source = options_.source;
  s.meta.file = static_cast<int32_t>(global / options_.rows_per_file);
  s.meta.row = global % options_.rows_per_file;
  s.meta.epoch = pos_.epoch;
  s.meta.pos = pos_;
  const bool is_null = std::find(options_.null_rows.begin(), options_.null_rows.end(),
                                 global) != options_.null_rows.end();
  if (is_null) {
    s.meta.skip = SkipReason::kNull;
  } else if ((*docs_)[size_t(global)].empty()) {
    s.meta.skip = SkipReason::kEmpty;
  } else {
    s.meta.tokens = static_cast<int64_t>((*docs_)[size_t(global)].size());
    if (size_t(global) < options_.image_tokens.size()) {
      s.meta.image_tokens = options_.image_tokens[size_t(global)];
    }
    if (options_.payloads) s.payload = payloads_[size_t(global)];
  }
  if (++pos_.offset == WindowRows(pos_.window)) {
    pos_.offset = 0;
    if (++pos_.window == NumWindows()) pos_ = StreamPos{pos_.epoch + 1, 0, 0};
  }
  return s;
}

std::vector<Sample> ReadSamples(SampleStream* stream, int64_t n, Status* status) {
  std::vector<Sample> out;
  *status = Status::OK();
  for (int64_t i = 0; i < n; ++i) {
    auto s = stream->Next();
    if (!s.ok()) {
      *status = s.status();
      break;
    }
    out.push_back(std::move(*s));
  }
  return out;
}

}  // namespace braid::testing
