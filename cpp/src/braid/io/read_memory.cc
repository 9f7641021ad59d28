#include "braid/io/read_memory.h"

#include <cstdlib>

namespace braid {

arrow::MemoryPool* ReadMemoryPool() {
  static arrow::MemoryPool* const pool = [] {
    const char* named = std::getenv("ARROW_DEFAULT_MEMORY_POOL");
    if (named != nullptr && *named != '\0') return arrow::default_memory_pool();
    // jemalloc where Arrow was built with it (the pyarrow wheels are), else the system
    // allocator.
    arrow::MemoryPool* jemalloc = nullptr;
    if (arrow::jemalloc_memory_pool(&jemalloc).ok() && jemalloc != nullptr) return jemalloc;
    return arrow::system_memory_pool();
  }();
  return pool;
}

}  // namespace braid
