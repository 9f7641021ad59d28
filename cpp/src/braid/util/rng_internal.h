// Deterministic, platform-independent random numbers for Braid's seeded orders.
//
// std::uniform_int_distribution differs between standard libraries, so a plan computed on
// one machine would not match another's. These helpers fix the algorithm: SplitMix64 for
// streams and key mixing, Lemire's multiply-shift for bounded integers, Fisher-Yates for
// permutations. Thread-compatible: an Rng is a value; share none between threads.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <vector>

namespace braid::internal {

/// One SplitMix64 step applied to `x`: a good 64-bit mixing function.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// A seed derived from several keys (seed, source index, epoch, ...), order-sensitive.
inline uint64_t DeriveSeed(std::initializer_list<uint64_t> keys) {
  uint64_t h = 0x6a09e667f3bcc908ULL;
  for (uint64_t k : keys) h = Mix64(h ^ Mix64(k));
  return h;
}

/// SplitMix64 generator. Its whole state is one integer.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  /// Uniform integer in [0, bound). REQUIRES: bound > 0.
  uint64_t Below(uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(Next()) * bound;
    auto low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(Next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

  /// Uniform double in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  template <typename T>
  void Shuffle(std::vector<T>* v) {
    for (size_t i = v->size(); i > 1; --i) {
      std::swap((*v)[i - 1], (*v)[Below(i)]);
    }
  }

 private:
  uint64_t state_;
};

/// A seeded permutation of 0..n-1.
inline std::vector<int64_t> Permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  Rng rng(seed);
  rng.Shuffle(&p);
  return p;
}

}  // namespace braid::internal
