// The data constructor: turns one rank's planned micro-batch into tensors.
//
// For a micro-batch of `mbs` packed sequences of length L it builds, all [mbs, L] unless
// noted:
//   input_ids    int64  the tokens
//   labels       int64  the next token of the same document; -100 at a document's end
//   loss_mask    float32 1 where labels is a real target, else 0
//   position_ids int64  0, 1, ... restarting at every document piece
//   source_ids   int32  index of the source each token came from
//   cu_seqlens   int32  [pieces + 1] piece boundaries over the flattened mbs*L tokens
//   max_seqlen   int32  [1] the longest piece (cu_seqlens' largest difference)
// A piece that ends inside its document (the document continues in another sequence)
// still has a target for its last token: the document's next token.
// With padding (batch.pad_to_multiple_of m > 1; the plan's pieces are then multiples of
// m, plan/planner.h) a document's last piece ends with up to m-1 pad tokens: input_ids 0,
// labels -100, loss_mask 0, position_ids counting on, in the piece's own segment of
// cu_seqlens (so cu_seqlens are the padded boundaries). The batch then also carries
//   cu_seqlens_unpadded int32 [pieces + 1] the cumulative real lengths of the same
//                       segments (Transformer Engine's cu_seqlens beside its padded ones)
//
// Thread-safe: a pure function of the plan; payloads are shared, immutable.
#pragma once

#include "braid/batch.h"
#include "braid/construct/tensor_memory.h"
#include "braid/plan/step_plan.h"
#include "braid/status.h"

namespace braid {

inline constexpr int64_t kIgnoreLabel = -100;

/// Builds micro-batch `micro_batch` of DP rank `dp` of `plan`, planned with
/// batch.pad_to_multiple_of `pad_to_multiple_of`, its tensors in `file` (null: on the
/// heap). Fails if the plan was made without payloads, or if a piece's payload is shorter
/// than the plan says (by m or more tokens with padding, by any without). REQUIRES: dp
/// and micro_batch index into the plan.
Result<Batch> BuildMicroBatch(const StepPlan& plan, int64_t dp, int64_t micro_batch,
                              int64_t pad_to_multiple_of = 1, TensorFile* file = nullptr);

}  // namespace braid
