// Samples as source loaders publish them: metadata for the planner, payload for the
// constructors.
//
// The planner reads only SampleMeta. The payload travels beside it as an opaque shared
// handle, so the embedded runtime never copies tokens between roles; a distributed runtime
// replaces the handle with a fetch by id. Thread-safe: values; payloads are immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "braid/source/payload.h"
#include "braid/status.h"

namespace braid {

/// A position in one source's seeded order: epoch, shuffle window within the epoch, and
/// index within the window. Restoring a loader at a StreamPos replays nothing before it.
struct StreamPos {
  int64_t epoch = 0;
  int64_t window = 0;
  int64_t offset = 0;

  bool operator==(const StreamPos&) const = default;
};

/// Why a sample carries no tokens.
/// kError: a row the transform could not use (a user transform raised, an undecodable
/// value); like kNull it follows on_error.
enum class SkipReason : int8_t { kNone = 0, kEmpty, kNull, kOversize, kError };

/// What the planner knows of a sample. The id is (source, file, row, epoch).
struct SampleMeta {
  int32_t source = 0;
  int32_t file = 0;   ///< index into the source's files in sorted path order
  int64_t row = 0;    ///< row within the file
  int64_t epoch = 0;
  int64_t tokens = 0;
  StreamPos pos;      ///< where the sample sits in the source's order
  SkipReason skip = SkipReason::kNone;
  int64_t image_tokens = 0;  ///< vision tokens among `tokens` (0 for text)
};

struct Sample {
  SampleMeta meta;
  /// Empty when the loader reads metadata only, or when skipped; may still be in
  /// production (metadata is published before the payload is ready).
  PayloadRef payload;
};

/// A source's sample stream as the planner sees it (a SourceLoader, or a test stream).
class SampleStream {
 public:
  virtual ~SampleStream() = default;
  /// The next sample in the source's order; never ends (epochs repeat).
  virtual Result<Sample> Next() = 0;
  /// Rows in one epoch (to detect a source whose every sample is skipped).
  virtual int64_t rows_per_epoch() const = 0;
};

}  // namespace braid
