// Stable 64-bit hashes of bytes, for names and keys that must be the same on every
// machine and in every run (cache entry names, config fingerprints): FNV-1a. Not for
// anything an adversary chooses. Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

namespace braid::internal {

inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;

/// FNV-1a of `bytes`, continuing from `h` (kFnvOffset to start).
inline uint64_t Fnv1a(std::string_view bytes, uint64_t h = kFnvOffset) {
  for (unsigned char ch : bytes) h = (h ^ ch) * 0x100000001b3ULL;
  return h;
}

}  // namespace braid::internal
