#include "braid/source/read_memory.h"

#include <cstdlib>

namespace braid {

arrow::MemoryPool* ReadMemoryPool() {
  static arrow::MemoryPool* const pool = [] {
    const char* named = std::getenv("ARROW_DEFAULT_MEMORY_POOL");
    return named != nullptr && *named != '\0' ? arrow::default_memory_pool()
                                              : arrow::system_memory_pool();
  }();
  return pool;
}

}  // namespace braid
