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
//                             placeholders the piece holds (grid and pixels)
//
// A piece travels as kPieceFields int64: source, file, row, epoch, start, len,
// doc_tokens, image_tokens (DocPiece's fields). A fetched piece is attached to the decoded
// plan as a document of its own: its payload holds the piece's tokens and the label after
// them, `start` becomes 0 and `doc_tokens` that length (or the piece's when the piece ends
// the document), so BuildMicroBatch builds exactly the tensors it builds from the whole
// document in the embedded runtime.
//
// Pure functions over values; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

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

/// Per source (`num_sources` of them), the pieces of `plan.ranks[bucket]` from that source
/// in plan order (micro-batch, sequence, piece), kRequestFields int64 each.
std::vector<std::vector<int64_t>> PieceRequests(const StepPlan& plan, int64_t bucket,
                                                int32_t num_sources);

/// Fields of one image of a PieceReply: piece, start (of its placeholders within the
/// piece's tokens), grid_h, grid_w, pixel count.
inline constexpr int64_t kImageFields = 5;

/// What a source's payload service returns for one PieceRequests list: piece k's tokens
/// are tokens[offsets[k], offsets[k + 1]); loss_mask is empty (every token a target) or
/// one 0/1 per token. `images` (kImageFields int64 each, in piece order) are the images
/// whose placeholders lie in a piece's own tokens; their pixels follow each other in
/// `pixels`.
struct PieceReply {
  std::vector<int32_t> tokens;
  std::vector<int64_t> offsets{0};
  std::vector<uint8_t> loss_mask;
  std::vector<int64_t> images;
  std::vector<float> pixels;
};

/// Attaches a source's reply to the pieces of `plan->ranks[bucket]` from `source`, in
/// PieceRequests order (see the header: each piece becomes a document of its own). The
/// payloads view `reply` (kept alive by them, no copy). Fails (data error naming the
/// source and step) when the reply does not match the pieces.
Status AttachPieces(StepPlan* plan, int64_t bucket, int32_t source,
                    std::shared_ptr<const PieceReply> reply);

}  // namespace braid
