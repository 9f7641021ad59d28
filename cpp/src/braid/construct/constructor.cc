#include "braid/construct/constructor.h"

#include <algorithm>

namespace braid {
namespace {

// "step S: rank R micro-batch M", the location of a constructor error.
std::string MicroBatchWhere(int64_t step, int64_t dp, int64_t micro_batch) {
  return "step " + std::to_string(step) + ": rank " + std::to_string(dp) +
         " micro-batch " + std::to_string(micro_batch);
}

// --- Images (docs/sources.md): a piece carries an image's patches only if it holds all
// of the image's placeholder tokens; a piece with part of them is an error. ---
Status CollectImages(int64_t step, const DocPiece& d, const TokenPayload& payload,
                     std::vector<const ImagePatches*>* images) {
  for (size_t k = 0; k < payload->images.size(); ++k) {
    const int64_t begin = payload->image_start[k];
    const int64_t end = begin + payload->images[k].num_patches();
    const int64_t overlap =
        std::max<int64_t>(0, std::min(end, d.start + d.len) - std::max(begin, d.start));
    if (overlap == end - begin) {
      images->push_back(&payload->images[k]);
    } else if (overlap > 0) {
      return DataError("step " + std::to_string(step) + ": sources[" +
                           std::to_string(d.source) + "] file " + std::to_string(d.file) +
                           " row " + std::to_string(d.row),
                       "an image was split (the piece holds " + std::to_string(overlap) +
                           " of its " + std::to_string(end - begin) +
                           " placeholder tokens); set oversize: skip or raise seq_len");
    }
  }
  return Status::OK();
}

// pixel_values float32 [total_patches, 3*p*p] and image_grid int32 [num_images, 2].
Result<std::vector<Tensor>> ImageTensors(const std::vector<const ImagePatches*>& images,
                                         const std::string& where, TensorFile* file) {
  int64_t total = 0;
  int64_t width = -1;
  for (const ImagePatches* im : images) {
    const int64_t n = im->num_patches();
    const int64_t w = n > 0 ? static_cast<int64_t>(im->pixels.size()) / n : 0;
    if (width >= 0 && w != width) {
      return DataError(where,
                       "images of one micro-batch have different patch sizes (" +
                           std::to_string(w) + " and " + std::to_string(width) +
                           " values per patch)");
    }
    width = w;
    total += n;
  }
  Tensor pixels = ZerosIn(file, "pixel_values", DType::kFloat32, {total, width});
  Tensor grid =
      ZerosIn(file, "image_grid", DType::kInt32, {static_cast<int64_t>(images.size()), 2});
  float* out = pixels.data<float>();
  int32_t* g = grid.data<int32_t>();
  for (const ImagePatches* im : images) {
    out = std::copy(im->pixels.begin(), im->pixels.end(), out);
    *g++ = im->grid_h;
    *g++ = im->grid_w;
  }
  std::vector<Tensor> result;
  result.push_back(std::move(pixels));
  result.push_back(std::move(grid));
  return result;
}
// --- end images ---

}  // namespace

Result<Batch> BuildMicroBatch(const StepPlan& plan, int64_t dp, int64_t micro_batch,
                              int64_t pad_to_multiple_of, TensorFile* file) {
  const bool padded = pad_to_multiple_of > 1;
  const MicroBatch& mb = plan.buckets[size_t(dp)].micro_batches[size_t(micro_batch)];
  const int64_t rows = static_cast<int64_t>(mb.sequences.size());
  const int64_t seq_len = plan.seq_len;
  // Segments of cu_seqlens: every piece, and the padding of a row that is not full (its
  // own segment, so no document of the next row attends to it).
  int64_t num_pieces = 0;
  for (size_t r = 0; r < mb.sequences.size(); ++r) {
    const Sequence& seq = mb.sequences[r];
    int64_t used = 0;
    for (const DocPiece& d : seq.docs) used += d.len;
    if (used > seq_len) {
      return DataError(MicroBatchWhere(plan.step, dp, micro_batch) + " sequence " +
                           std::to_string(r),
                       "its pieces hold " + std::to_string(used) +
                           " tokens, more than seq_len " + std::to_string(seq_len));
    }
    num_pieces += static_cast<int64_t>(seq.docs.size()) + (used < seq_len ? 1 : 0);
  }

  Batch batch;
  batch.step = plan.step;
  batch.dp = dp;
  batch.micro_batch = micro_batch;
  Tensor input_ids = ZerosIn(file, "input_ids", DType::kInt64, {rows, seq_len});
  Tensor labels = ZerosIn(file, "labels", DType::kInt64, {rows, seq_len});
  Tensor loss_mask = ZerosIn(file, "loss_mask", DType::kFloat32, {rows, seq_len});
  Tensor position_ids = ZerosIn(file, "position_ids", DType::kInt64, {rows, seq_len});
  Tensor source_ids = ZerosIn(file, "source_ids", DType::kInt32, {rows, seq_len});
  Tensor cu_seqlens = ZerosIn(file, "cu_seqlens", DType::kInt32, {num_pieces + 1});
  Tensor cu_unpadded = ZerosIn(file, "cu_seqlens_unpadded", DType::kInt32,
                               {padded ? num_pieces + 1 : 0});
  Tensor max_seqlen = ZerosIn(file, "max_seqlen", DType::kInt32, {1});

  auto* ids = input_ids.data<int64_t>();
  auto* lab = labels.data<int64_t>();
  auto* mask = loss_mask.data<float>();
  auto* pos = position_ids.data<int64_t>();
  auto* src = source_ids.data<int32_t>();
  auto* cu = cu_seqlens.data<int32_t>();
  auto* cu_real = cu_unpadded.data<int32_t>();
  int64_t real_tokens = 0;  // so far, padding left out
  int64_t piece_index = 0;
  // Images of the pieces, in token order (payloads kept alive until copied).
  std::vector<TokenPayload> image_owners;
  std::vector<const ImagePatches*> images;
  for (int64_t r = 0; r < rows; ++r) {
    const Sequence& seq = mb.sequences[size_t(r)];
    int64_t t = r * seq_len;
    for (const DocPiece& d : seq.docs) {
      if (!d.payload) {
        return DataError(MicroBatchWhere(plan.step, dp, micro_batch),
                         "the plan carries no payloads (planned from metadata only)");
      }
      ARROW_ASSIGN_OR_RAISE(TokenPayload payload, d.payload.Get());
      const TokenSpan& doc = payload->tokens;
      const std::vector<uint8_t>& targets = payload->loss_mask;
      ARROW_RETURN_NOT_OK(CollectImages(plan.step, d, payload, &images));
      if (!payload->images.empty()) image_owners.push_back(payload);
      // The document's real end: its payload's length, or the truncation. With padding
      // the plan counts up to m-1 more (the pad tokens), and every piece holds a real
      // token (pieces start on a multiple of m).
      const int64_t end = std::min(d.doc_tokens, static_cast<int64_t>(doc.size()));
      const int64_t missing = d.doc_tokens - end;
      if (missing >= pad_to_multiple_of || end <= d.start) {
        return DataError(MicroBatchWhere(plan.step, dp, micro_batch) + ": sources[" +
                             std::to_string(d.source) + "] file " +
                             std::to_string(d.file) + " row " + std::to_string(d.row),
                         "the payload holds " + std::to_string(doc.size()) +
                             " tokens, the plan a " + std::to_string(d.doc_tokens) +
                             "-token document; did the file change?");
      }
      for (int64_t k = 0; k < d.len; ++k, ++t) {
        const int64_t at = d.start + k;
        pos[t] = k;
        src[t] = d.source;
        if (at >= end) {  // padding: input_ids 0, no target
          lab[t] = kIgnoreLabel;
          continue;
        }
        ids[t] = doc[size_t(at)];
        if (at + 1 < end) {
          lab[t] = doc[size_t(at + 1)];
          mask[t] = targets.empty() || targets[size_t(at + 1)] ? 1.0f : 0.0f;
        } else {
          lab[t] = kIgnoreLabel;
        }
      }
      cu[++piece_index] = static_cast<int32_t>(t);
      real_tokens += std::min(d.len, end - d.start);
      if (padded) cu_real[piece_index] = static_cast<int32_t>(real_tokens);
    }
    // A sequence shorter than L (token slack, postponed multimodal documents, the end of
    // a step) is padded; the padding is a segment of its own.
    if (t < (r + 1) * seq_len) {
      for (int64_t k = 0; t < (r + 1) * seq_len; ++t, ++k) {
        lab[t] = kIgnoreLabel;
        pos[t] = k;
      }
      real_tokens += t - cu[piece_index];
      cu[++piece_index] = static_cast<int32_t>(t);
      if (padded) cu_real[piece_index] = static_cast<int32_t>(real_tokens);
    }
  }
  int32_t longest = 0;
  for (int64_t k = 0; k < num_pieces; ++k) longest = std::max(longest, cu[k + 1] - cu[k]);
  max_seqlen.data<int32_t>()[0] = longest;
  batch.tensors.push_back(std::move(input_ids));
  batch.tensors.push_back(std::move(labels));
  batch.tensors.push_back(std::move(loss_mask));
  batch.tensors.push_back(std::move(position_ids));
  batch.tensors.push_back(std::move(cu_seqlens));
  if (padded) batch.tensors.push_back(std::move(cu_unpadded));
  batch.tensors.push_back(std::move(max_seqlen));
  batch.tensors.push_back(std::move(source_ids));
  if (!images.empty()) {
    ARROW_ASSIGN_OR_RAISE(
        std::vector<Tensor> image_tensors,
        ImageTensors(images, MicroBatchWhere(plan.step, dp, micro_batch), file));
    for (auto& tensor : image_tensors) batch.tensors.push_back(std::move(tensor));
  }
  return batch;
}

}  // namespace braid
