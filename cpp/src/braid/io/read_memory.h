// The Arrow memory pool that Braid reads Parquet into (token columns, pages, footers).
//
// Arrow's default pool in the pyarrow wheels is mimalloc, which keeps pages that were
// allocated on the read pool's threads and freed on the planner's or the constructor's:
// about 50 MB per process beyond the bytes in use at 4 sources (docs/benchmarks.md). The
// system allocator returns them; so Braid reads into arrow::system_memory_pool() unless
// the environment names a pool (ARROW_DEFAULT_MEMORY_POOL), in which case it uses
// Arrow's default pool, as every other Arrow user in the process does
// (docs/decisions.md, 31).
//
// Which allocator: jemalloc (arrow::jemalloc_memory_pool) when Arrow has it, as the
// pyarrow wheels do, else the system allocator. Both return freed pages (~10 MB per
// process above the bytes in use); glibc's malloc serves the large blocks of a row group
// with fresh mmaps whose page faults cut the token-column read rate to ~0.63 of a raw
// Arrow scan, against ~1.0 with jemalloc (benchmarks/source_read.py). jemalloc's cost is
// two background threads per process.
//
// Thread-safe: the choice is made once, on the first call.
#pragma once

#include <arrow/memory_pool.h>

namespace braid {

arrow::MemoryPool* ReadMemoryPool();

}  // namespace braid
