// Small Megatron indexed datasets (.idx + .bin) for tests, laid out as Megatron-Core's
// IndexedDatasetBuilder writes them (io/megatron_index.h); the Python tests also use
// datasets written by that builder itself.
//
// Thread-safe: pure functions of their arguments (they write the files they are given).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "braid/status.h"

namespace braid::testing {

struct MegatronOptions {
  int dtype_code = 8;  ///< 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16
  /// Each document is stored as this many sequences (as sentence-split corpora are);
  /// the last ones may be empty when a document is shorter.
  int sequences_per_document = 1;
};

/// Writes `docs` as PREFIX.bin and PREFIX.idx.
Status WriteMegatronDataset(const std::string& prefix,
                            const std::vector<std::vector<int32_t>>& docs,
                            const MegatronOptions& options = {});

}  // namespace braid::testing
