// The source loader's payload side as a service: the tokens of planned pieces, fetched by
// key (file, row, token range), for constructors in other processes.
//
// A PayloadService reads one source's files through the same SourceFiles and Transform
// as its SourceLoader, so a row's payload is the one the embedded runtime delivers, byte
// for byte; the key names the row, so any copy of the service (a restarted one included)
// answers the same request with the same bytes, and a request is idempotent. Row groups
// (or the blocks of row groups larger than the source's shuffle_window_bytes, as the
// loader cuts them) are read whole and kept in a cache bounded by `cache_bytes` (least
// recently used first out): the pieces of one step come from few shuffle windows.
//
// Errors name the file, row group and row: a row whose tokens no longer cover the
// planned piece (the file changed since it was planned), a row that is now skipped
// (null, empty), an unreadable row group (after SourceFiles' retries). Images are sent
// encoded, as the file holds them, with the grid their header gave; the constructor
// decodes them (AttachPieces, docs/decisions.md 40), so this service decodes none.
//
// Thread-safe: Fetch calls are serialized by a mutex (SourceFiles is thread-compatible).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "braid/config/config.h"
#include "braid/service/wire.h"
#include "braid/io/source_files.h"
#include "braid/transform/transform.h"
#include "braid/status.h"

namespace braid {

class PayloadService {
 public:
  /// Opens config.sources[source_index]'s files (listing, footers). Fails as
  /// SourceFiles::Open does.
  static Result<std::unique_ptr<PayloadService>> Make(const Config& config,
                                                      int32_t source_index,
                                                      int64_t cache_bytes);

  /// Answers `n` requests of kRequestFields int64 each (wire.h PieceRequests): each
  /// piece's tokens and the label after them, and the loss mask if the source has one.
  Result<PieceReply> Fetch(const int64_t* requests, int64_t n);

  /// Bytes of row groups cached now.
  int64_t cached_bytes() const;

 private:
  PayloadService() = default;
  struct Unit {  // a row group, or one block of one
    std::vector<Columns> chunks;
    std::vector<int64_t> chunk_first;  // row (within the unit) of each chunk's first row
    int64_t first_row = 0;             // file row of the unit's first row
    int64_t bytes = 0;
    std::list<std::tuple<int32_t, int32_t, int64_t>>::iterator lru;
  };
  // The unit holding (file, row), read if not cached. REQUIRES: mu_ held.
  Result<Unit*> UnitFor(int32_t file, int64_t row, int32_t* row_group);
  // The payload of one row, its images not decoded; `encoded`: their bytes (views into
  // the unit's columns). REQUIRES: mu_ held.
  Result<std::shared_ptr<Payload>> Row(int32_t file, int64_t row,
                                       std::vector<std::string_view>* encoded);
  // Adds the images of piece `piece` ([start, start + len) of the row's tokens) to
  // `reply`. REQUIRES: mu_ held.
  Status AddImages(const Payload& payload, const std::vector<std::string_view>& encoded,
                   int64_t piece, int64_t start, int64_t len, int32_t file, int64_t row,
                   PieceReply* reply, std::map<int32_t, int64_t>* path_index) const;

  Config config_;
  int32_t source_index_ = 0;
  int64_t cache_bytes_ = 0;
  std::unique_ptr<SourceFiles> files_;
  std::unique_ptr<Transform> transform_;
  mutable std::mutex mu_;
  std::map<std::tuple<int32_t, int32_t, int64_t>, Unit> cache_;  // GUARDED_BY(mu_)
  std::list<std::tuple<int32_t, int32_t, int64_t>> lru_;  // GUARDED_BY(mu_), newest first
  int64_t cached_ = 0;                                     // GUARDED_BY(mu_)
};

}  // namespace braid
