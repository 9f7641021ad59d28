// The messages between the roles when they run in different processes (the Ray runtime,
// docs/distributed.md): plain int64 / int32 / uint8 arrays, so a transport moves them as
// NumPy buffers without pickling objects.
//
//   planner -> constructors   EncodeStepPlan: one step's pieces, every bucket, sent to
//                             each node as the slice of its buckets (SliceStepPlan); a
//                             constructor decodes one bucket at a time (DecodeBucket)
//   constructor -> loaders    PieceRequests: per source, the pieces of one bucket
//   loaders -> constructor    PieceReply: each piece's tokens, plus the next one (its
//                             label), the loss mask over them, and the images whose
//                             placeholders the piece holds (grid and encoded bytes; the
//                             constructor decodes them)
//
// A piece travels as kPieceFields int64: source, file, row, epoch, start, len,
// doc_tokens, image_tokens (DocPiece's fields). A fetched piece is attached to the decoded
// plan as a document of its own: its payload holds the piece's tokens and the label after
// them, `start` becomes 0 and `doc_tokens` that length (or the piece's when the piece ends
// the document), so BuildMicroBatch builds exactly the tensors it builds from the whole
// document in the embedded runtime.
//
// Pure functions over values (AttachPieces decodes images); thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "braid/config/config.h"
#include "braid/plan/step_plan.h"
#include "braid/status.h"

namespace braid {

inline constexpr int64_t kPieceFields = 8;
/// Fields of one request of PieceRequests: file, row, start, len, doc_tokens.
inline constexpr int64_t kRequestFields = 5;

/// One step's plan for every bucket: [step, seq_len, buckets, held, the held buckets'
/// numbers (ascending), their sections' offsets into the array (held + 1)], then per held
/// bucket [micro_batches, per micro-batch [sequences, per sequence [pieces, kPieceFields
/// per piece]]]. A whole plan holds every bucket; a slice (SliceStepPlan) some.
std::vector<int64_t> EncodeStepPlan(const StepPlan& plan);

/// The step of an encoded plan, and its number of buckets (held or not). Fails (data
/// error) on a message too short to hold its header.
Result<std::pair<int64_t, int64_t>> EncodedStepAndBuckets(const int64_t* data, size_t size);

/// The part of an encoded plan that a node's constructor needs: the sections of
/// `buckets` only, in the same format (DecodeBucket refuses the others). A node of 8
/// ranks receives about 8/dp of the plan instead of all of it. Fails (data error) on a
/// malformed message or a bucket it does not hold.
Result<std::vector<int64_t>> SliceStepPlan(const int64_t* data, size_t size,
                                           const std::vector<int64_t>& buckets);

/// Bucket `bucket` of an encoded plan (or of a slice holding it) as a StepPlan whose `ranks[bucket]` holds its
/// micro-batches (the other ranks empty; no payloads, no states). Fails (data error) on a
/// malformed message or a bucket it does not hold.
Result<StepPlan> DecodeBucket(const int64_t* data, size_t size, int64_t bucket);

/// Per source (`num_sources` of them), the pieces of `plan.buckets[bucket]` from that source
/// in plan order (micro-batch, sequence, piece), kRequestFields int64 each.
std::vector<std::vector<int64_t>> PieceRequests(const StepPlan& plan, int64_t bucket,
                                                int32_t num_sources);

/// Fields of one image of a PieceReply: piece, start (of its placeholders within the
/// piece's tokens; -1 for an image of the piece's row outside the piece, sent only so
/// that the constructor learns whether the row's images decode: on_error: skip blanks a
/// whole row), grid_h, grid_w (from the header, as planned), encoded bytes, path (an
/// index into `paths`), the image's index in its row, the row's images.
inline constexpr int64_t kImageFields = 8;

/// What a source's payload service returns for one PieceRequests list: piece k's tokens
/// are tokens[offsets[k], offsets[k + 1]); loss_mask is empty (every token a target) or
/// one 0/1 per token. `images` (kImageFields int64 each, in piece order) are the
/// pieces' images, still encoded: their bytes follow each other in `image_bytes`, and the
/// constructor decodes them (docs/decisions.md, 40). `paths` holds the files of those
/// images' rows, each ending in '\0', for error messages.
struct PieceReply {
  std::vector<int32_t> tokens;
  std::vector<int64_t> offsets{0};
  std::vector<uint8_t> loss_mask;
  std::vector<int64_t> images;
  std::vector<uint8_t> image_bytes;
  std::vector<uint8_t> paths;
};

/// Attaches a source's reply to the pieces of `plan->buckets[bucket]` from `source`, in
/// PieceRequests order (see the header: each piece becomes a document of its own), and
/// decodes its images with `source_config`'s image options. The payloads view `reply`'s
/// tokens (kept alive by them, no copy). An image that does not decode follows
/// `source_config.on_error` as in the source loader: an error naming its file and row,
/// or (skip) the piece's images blank and its loss mask 0, as every piece of that row.
/// Fails (data error naming the source and step) when the reply does not match the
/// pieces. `blanked` (optional) gets one message per piece blanked under skip (file, row,
/// why), for the caller to log and count. With batch.pad_to_multiple_of m > 1 a piece may
/// hold up to m-1 tokens fewer than planned (its document's padding, which the
/// constructor fills). Thread-safe for distinct plans.
Status AttachPieces(StepPlan* plan, int64_t bucket, int32_t source,
                    const SourceConfig& source_config,
                    std::shared_ptr<const PieceReply> reply,
                    std::vector<std::string>* blanked = nullptr,
                    int64_t pad_to_multiple_of = 1);

}  // namespace braid
