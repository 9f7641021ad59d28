// Small Parquet token files for tests, benchmarks and `braid demo`.
//
// Thread-safe: pure functions of their arguments (they write the files they are given).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "braid/config/config.h"
#include "braid/status.h"

namespace braid::testing {

struct TokenFileOptions {
  std::string column = "input_ids";
  int64_t row_group_rows = 1024;
  bool int64_values = false;  ///< write list<int64> instead of list<int32>
  std::vector<int64_t> null_rows;  ///< rows written as null
  /// Also write each row's token count (int64; null for a null row) in this column.
  std::string length_column;
  /// (row, value) written in the length column instead of the row's count (nullopt:
  /// null).
  std::vector<std::pair<int64_t, std::optional<int64_t>>> length_overrides;
  bool data_page_v2 = false;  ///< data pages of format V2 (levels outside compression)
  bool required = false;      ///< a non-nullable list of non-nullable ids (no nulls)
  std::string compression = "none";  ///< "none" (Parquet C++'s default), "snappy", "zstd"
  int64_t data_page_bytes = 0;       ///< data page size limit; 0: Parquet's (1 MiB)
};

/// Writes `docs` as a Parquet file with one list<int32> (or list<int64>) column.
Status WriteTokenFile(const std::string& path, const std::vector<std::vector<int32_t>>& docs,
                      const TokenFileOptions& options = {});

/// Overwrites the bytes of every column chunk of row group `row_group` of the Parquet
/// file at `path` with junk (or only of leaf column `column`, when >= 0), leaving its
/// footer intact: the file opens, that row group does not read (a corrupt page), the
/// others do.
Status CorruptRowGroup(const std::string& path, int row_group, int column = -1);

/// Cuts the file at `path` to half its size (a failed upload: no footer).
Status TruncateFile(const std::string& path);

/// Documents with seeded lognormal lengths (median `median_tokens`, shape `sigma`),
/// clipped to [1, max_tokens], and token ids in [0, vocab). A `near_fraction` of them get
/// a length near `near_tokens` instead (0.9x to 1.1x) when near_tokens > 0.
struct LengthSpec {
  double median_tokens = 500;
  double sigma = 1.0;
  int64_t max_tokens = 16384;
  double near_fraction = 0;
  int64_t near_tokens = 0;
};
std::vector<std::vector<int32_t>> RandomDocs(int64_t count, const LengthSpec& lengths,
                                             uint64_t seed, int32_t vocab = 32000);

/// An image-caption source over `path`: image column "image", caption column "caption",
/// placeholder id 7, the given error policy, worker threads and shuffle window.
SourceConfig CaptionSource(const std::string& path, OnError on_error, int64_t workers,
                           int64_t window_rows);

/// Writes `path`: 24 image-caption rows in row groups of 4, PNG images of 14-42 x 19-28
/// pixels (column "image") and captions "a small picture number i" (column "caption").
/// Row `cut_row` (-1: none) has a valid header but a body that does not decode. With
/// `two_images`, "image" is a list of images and every third row holds two.
Status WriteCaptionFile(const std::string& path, int cut_row, bool two_images = false);

struct DemoDataset {
  std::string config_path;
  std::vector<std::string> source_names;
  int64_t docs = 0;
  int64_t tokens = 0;
};

/// Writes the demo: three sources (web, code, math) with long-tail document lengths, a few
/// near `seq_len` and some longer, in several files and row groups each, under `dir`, and
/// `dir/demo.yaml` running them with `dp` DP ranks and `micro_batches` per rank.
Result<DemoDataset> MakeDemoDataset(const std::string& dir, uint64_t seed,
                                    int64_t seq_len = 4096, int64_t dp = 8,
                                    int64_t micro_batches = 4, double scale = 1.0);

}  // namespace braid::testing
