// Rank views: what one trainer rank receives of its DP group's micro-batch.
//
// A constructor builds each micro-batch once per DP group (construct/constructor.h);
// every trainer rank of that group (its TP, PP and CP coordinates) then receives a *view*
// of it:
//   - TP: every TP rank receives the same tensors. The view shares their storage.
//   - PP: the first stage (pp == 0) receives input_ids and source_ids (and any other
//     input tensor, e.g. pixel_values), the last stage (pp == PP-1) labels and
//     loss_mask, every stage position_ids, cu_seqlens and max_seqlen (and
//     cu_seqlens_unpadded when the batch is padded). With PP == 1 the one stage is
//     first and last and receives everything. Middle stages receive position_ids,
//     cu_seqlens and max_seqlen (and cu_seqlens_unpadded) only.
//   - CP: with CP > 1 every sequence of length L is cut into 2*CP chunks of L/(2*CP)
//     tokens; CP rank r receives chunks r and 2*CP-1-r, concatenated, of every per-token
//     tensor ([mbs, L] -> [mbs, L/CP]). position_ids keep their original values (RoPE
//     stays right). cu_seqlens becomes the rank's own: the piece boundaries that fall
//     inside its chunks plus every chunk edge, in the rank's local flattened token
//     coordinates (docs/parallelism.md has the exact rule), max_seqlen its longest
//     segment; cu_seqlens_unpadded is left out. These tensors are copies
//     (1/CP of the batch per rank, so the CP ranks together hold one batch).
// Without CP the view copies no tensor data.
//
// Thread-safe: pure functions over an immutable batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "braid/batch.h"
#include "braid/client/topology.h"
#include "braid/config/config.h"
#include "braid/construct/tensor_memory.h"
#include "braid/status.h"

namespace braid {

/// The names a rank at pipeline stage `pp` of `num_stages` receives among the
/// constructor's standard tensors, in the constructor's order (input_ids, labels,
/// loss_mask, position_ids, cu_seqlens, max_seqlen, source_ids). Other tensors (multimodal inputs) go
/// to the first stage.
std::vector<std::string> ViewTensorNames(int64_t pp, int64_t num_stages);

/// Checks that sequences of `seq_len` tokens split evenly for context parallelism `cp`:
/// seq_len % (2 * cp) == 0. Fails with a config error naming batch.seq_len.
Status CheckContextSplit(int64_t seq_len, int64_t cp);

/// The view of `batch` (built for DP rank coords.dp) that the rank at `coords` receives.
/// Fails (config error naming "rank") if coords are outside `topology` or coords.dp is
/// not the batch's DP rank, and (naming batch.seq_len) if the sequences do not split into
/// 2*cp equal chunks. The result shares storage with `batch` except the CP-split
/// tensors, which it places in `file` (null: on the heap); it keeps the batch's step, dp
/// and micro_batch.
Result<Batch> ViewFor(const Batch& batch, const Topology& topology,
                      const RankCoords& coords, TensorFile* file = nullptr);

}  // namespace braid
