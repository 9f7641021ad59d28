// An in-memory SampleStream for planner and constructor tests.
//
// MemoryStream serves a fixed list of documents in a seeded order that has the shape of a
// SourceLoader's: each epoch permutes all rows, consecutive runs of `window_rows` rows of
// that permutation form the windows, and every sample carries its StreamPos
// (epoch, window, offset). A stream made at a StreamPos starts there, with the same
// normalization as SourceLoader::Make (an offset one past a window's end means the start
// of the next window), so a planner can be resumed on it exactly as on real files.
//
// Thread-compatible. The documents are shared, immutable; each row's payload is built
// once so two streams over the same documents hand out equal tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "braid/source/sample.h"
#include "braid/status.h"

namespace braid::testing {

class MemoryStream : public SampleStream {
 public:
  struct Options {
    int32_t source = 0;  ///< SampleMeta::source of every sample
    uint64_t seed = 0;   ///< seeds the per-epoch row order
    int64_t window_rows =
        64;  ///< rows per window (the last one of an epoch may be short)
    int64_t rows_per_file =
        1000;              ///< global row r is (file r / rows_per_file, row r % ..)
    bool payloads = true;  ///< false: metadata only, payload null
    std::vector<int64_t> null_rows;  ///< global rows flagged SkipReason::kNull
    /// Per global row, SampleMeta::image_tokens (rows beyond its size: 0, text).
    std::vector<int64_t> image_tokens;
  };

  using Docs = std::vector<std::vector<int32_t>>;

  /// REQUIRES: `docs` non-empty, options.window_rows >= 1, start within the order.
  MemoryStream(std::shared_ptr<const Docs> docs, Options options, StreamPos start = {});

  Result<Sample> Next() override;
  int64_t rows_per_epoch() const override { return static_cast<int64_t>(docs_->size()); }

  /// How many times Next() was called.
  int64_t next_calls() const { return next_calls_; }
  /// The global rows of `epoch` in stream order.
  std::vector<int64_t> EpochOrder(int64_t epoch) const;
  /// The document at (file, row) as SampleMeta names it.
  const std::vector<int32_t>& Doc(int32_t file, int64_t row) const;
  int64_t GlobalRow(int32_t file, int64_t row) const {
    return int64_t{file} * options_.rows_per_file + row;
  }

 private:
  int64_t NumWindows() const;
  int64_t WindowRows(int64_t window) const;

  std::shared_ptr<const Docs> docs_;
  std::vector<TokenPayload> payloads_;
  const Options options_;
  StreamPos pos_;
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;  // EpochOrder(order_epoch_)
  int64_t next_calls_ = 0;
};

/// The next `n` samples of `stream`, or fewer: reading stops at the first error, which is
/// stored in `*status` (OK when all `n` were read).
std::vector<Sample> ReadSamples(SampleStream* stream, int64_t n, Status* status);

}  // namespace braid::testing
