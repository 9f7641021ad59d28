#include "braid/construct/constructor.h"

namespace braid {

Result<Batch> BuildMicroBatch(const StepPlan& plan, int64_t dp, int64_t micro_batch) {
  const MicroBatch& mb = plan.ranks[size_t(dp)].micro_batches[size_t(micro_batch)];
  const int64_t rows = static_cast<int64_t>(mb.sequences.size());
  const int64_t seq_len = plan.seq_len;
  int64_t num_pieces = 0;
  for (const auto& seq : mb.sequences) num_pieces += static_cast<int64_t>(seq.docs.size());

  Batch batch;
  batch.step = plan.step;
  batch.dp = dp;
  batch.micro_batch = micro_batch;
  Tensor input_ids = Tensor::Zeros("input_ids", DType::kInt64, {rows, seq_len});
  Tensor labels = Tensor::Zeros("labels", DType::kInt64, {rows, seq_len});
  Tensor loss_mask = Tensor::Zeros("loss_mask", DType::kFloat32, {rows, seq_len});
  Tensor position_ids = Tensor::Zeros("position_ids", DType::kInt64, {rows, seq_len});
  Tensor source_ids = Tensor::Zeros("source_ids", DType::kInt32, {rows, seq_len});
  Tensor cu_seqlens = Tensor::Zeros("cu_seqlens", DType::kInt32, {num_pieces + 1});

  auto* ids = input_ids.data<int64_t>();
  auto* lab = labels.data<int64_t>();
  auto* mask = loss_mask.data<float>();
  auto* pos = position_ids.data<int64_t>();
  auto* src = source_ids.data<int32_t>();
  auto* cu = cu_seqlens.data<int32_t>();
  int64_t piece_index = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const Sequence& seq = mb.sequences[size_t(r)];
    int64_t t = r * seq_len;
    for (const DocPiece& d : seq.docs) {
      if (!d.payload) {
        return Status::Invalid("step ", plan.step, ": the plan carries no payloads");
      }
      ARROW_ASSIGN_OR_RAISE(TokenPayload payload, d.payload.Get());
      const std::vector<int32_t>& doc = payload->tokens;
      const std::vector<uint8_t>& targets = payload->loss_mask;
      for (int64_t k = 0; k < d.len; ++k, ++t) {
        const int64_t at = d.start + k;
        ids[t] = doc[size_t(at)];
        pos[t] = k;
        src[t] = d.source;
        if (at + 1 < d.doc_tokens) {
          lab[t] = doc[size_t(at + 1)];
          mask[t] = targets.empty() || targets[size_t(at + 1)] ? 1.0f : 0.0f;
        } else {
          lab[t] = kIgnoreLabel;
        }
      }
      cu[++piece_index] = static_cast<int32_t>(t);
    }
    // A sequence shorter than L (not produced with packing) is padded.
    for (; t < (r + 1) * seq_len; ++t) lab[t] = kIgnoreLabel;
  }
  batch.tensors.push_back(std::move(input_ids));
  batch.tensors.push_back(std::move(labels));
  batch.tensors.push_back(std::move(loss_mask));
  batch.tensors.push_back(std::move(position_ids));
  batch.tensors.push_back(std::move(cu_seqlens));
  batch.tensors.push_back(std::move(source_ids));
  return batch;
}

}  // namespace braid
