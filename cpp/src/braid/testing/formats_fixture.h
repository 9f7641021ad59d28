// Small files in the formats Braid reads besides Parquet, for tests: WebDataset tar
// shards written with libarchive as Python's tarfile (and so the webdataset package)
// writes them (the Python tests also use shards written by the webdataset package
// itself), and the token ids of a row of a list<int32> array, as the formats' tests
// compare them.
//
// Thread-safe: pure functions of their arguments (they write the files they are given).
#pragma once

#include <arrow/array.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "braid/status.h"

namespace braid::testing {

/// A shard's members in order: (name, bytes).
using TarMembers = std::vector<std::pair<std::string, std::string>>;

/// Writes `members` as a pax tar at `path` (its folder made; gzip-compressed when
/// `gzip`). Returns where each sample starts (the header of the first member of each new
/// key: the name before its first dot) and then where the archive's data ends, in bytes
/// of the uncompressed tar: what an Energon `.tar.idx` holds.
Result<std::vector<int64_t>> WriteTarShard(const std::string& path,
                                           const TarMembers& members, bool gzip = false);

/// Sample i's key: i in six digits.
std::string SampleKey(int64_t i);

/// Sample i's token ids: i * 100 + k for k in 0 .. i % 9.
std::vector<int32_t> SampleIds(int64_t i);

/// SampleIds(i) as a JSON array.
std::string SampleIdsJson(int64_t i);

/// The ids of row `i` of a list<int32> array.
std::vector<int32_t> ListRowIds(const arrow::Array& list, int64_t i);

}  // namespace braid::testing
