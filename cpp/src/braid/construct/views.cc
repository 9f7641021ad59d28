#include "braid/construct/views.h"

#include <algorithm>
#include <cstring>

namespace braid {
namespace {

bool Wanted(const std::string& name, int64_t pp, int64_t num_stages) {
  if (name == "position_ids" || name == "cu_seqlens" || name == "cu_seqlens_unpadded" ||
      name == "max_seqlen") {
    return true;
  }
  if (name == "labels" || name == "loss_mask") return pp == num_stages - 1;
  return pp == 0;  // input_ids, source_ids and any other input tensor
}

// Chunks r and 2*cp-1-r of every row of a per-token tensor [rows, seq_len].
Tensor SplitRows(const Tensor& t, int64_t cp, int64_t r, TensorFile* file) {
  const int64_t rows = t.shape[0], seq_len = t.shape[1];
  const int64_t chunk = seq_len / (2 * cp);
  Tensor out = ZerosIn(file, t.name, t.dtype, {rows, seq_len / cp});
  const size_t elem = DTypeSize(t.dtype);
  const auto* src = t.storage->data();
  auto* dst = out.storage->data();
  for (int64_t row = 0; row < rows; ++row) {
    const auto* row_src = src + size_t(row * seq_len) * elem;
    auto* row_dst = dst + size_t(row * (seq_len / cp)) * elem;
    std::memcpy(row_dst, row_src + size_t(r * chunk) * elem, size_t(chunk) * elem);
    std::memcpy(row_dst + size_t(chunk) * elem,
                row_src + size_t((2 * cp - 1 - r) * chunk) * elem, size_t(chunk) * elem);
  }
  return out;
}

// The rank's cu_seqlens: for each of its chunks in local order, the global piece
// boundaries strictly inside the chunk, then the chunk's end, all in local coordinates.
Tensor SplitCuSeqlens(const Tensor& cu, int64_t rows, int64_t seq_len, int64_t cp,
                      int64_t r, TensorFile* file) {
  const int64_t chunk = seq_len / (2 * cp);
  const auto* g = cu.data<int32_t>();
  const int64_t n = cu.num_elements();
  std::vector<int32_t> local{0};
  int64_t base = 0;
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t c : {r, 2 * cp - 1 - r}) {
      const int64_t g0 = row * seq_len + c * chunk, g1 = g0 + chunk;
      const int32_t* i = std::upper_bound(g, g + n, int32_t(g0));  // cu is ascending
      for (; i < g + n && *i < g1; ++i) local.push_back(int32_t(base + (*i - g0)));
      base += chunk;
      local.push_back(int32_t(base));
    }
  }
  Tensor out = ZerosIn(file, "cu_seqlens", DType::kInt32, {int64_t(local.size())});
  std::memcpy(out.storage->data(), local.data(), local.size() * sizeof(int32_t));
  return out;
}

// The longest segment of a view's cu_seqlens, as the constructor's max_seqlen.
Tensor MaxSeqlen(const Tensor& cu) {
  const auto* c = cu.data<int32_t>();
  int32_t longest = 0;
  for (int64_t k = 0; k + 1 < cu.num_elements(); ++k) {
    longest = std::max(longest, c[k + 1] - c[k]);
  }
  Tensor out = Tensor::Zeros("max_seqlen", DType::kInt32, {1});
  out.data<int32_t>()[0] = longest;
  return out;
}

}  // namespace

std::vector<std::string> ViewTensorNames(int64_t pp, int64_t num_stages) {
  std::vector<std::string> names;
  for (const char* n : {"input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens",
                        "max_seqlen", "source_ids"}) {
    if (Wanted(n, pp, num_stages)) names.push_back(n);
  }
  return names;
}

Status CheckContextSplit(int64_t seq_len, int64_t cp) {
  if (cp > 1 && seq_len % (2 * cp) != 0) {
    return ConfigError("batch.seq_len", "must be a multiple of 2 * topology.cp (" +
                                            std::to_string(2 * cp) +
                                            ") to split sequences for context "
                                            "parallelism, got " +
                                            std::to_string(seq_len));
  }
  return Status::OK();
}

Result<Batch> ViewFor(const Batch& batch, const Topology& topology,
                      const RankCoords& coords, TensorFile* file) {
  if (coords.dp < 0 || coords.dp >= topology.dp || coords.tp < 0 ||
      coords.tp >= topology.tp || coords.pp < 0 || coords.pp >= topology.pp ||
      coords.cp < 0 || coords.cp >= topology.cp) {
    return ConfigError("rank", "coordinates (dp " + std::to_string(coords.dp) + ", tp " +
                                   std::to_string(coords.tp) + ", pp " +
                                   std::to_string(coords.pp) + ", cp " +
                                   std::to_string(coords.cp) +
                                   ") are outside the topology");
  }
  const int64_t bucket = BucketOf(topology, coords);
  if (bucket != batch.dp) {
    const bool by_dp = topology.distribute == Topology::Axis::kDp && topology.group == 1;
    const std::string what = by_dp ? "DP rank " : "bucket ";
    return ConfigError("rank", std::string(by_dp ? "DP rank " : "the rank's bucket ") +
                                   std::to_string(bucket) + " asked for a micro-batch of " +
                                   what + std::to_string(batch.dp));
  }
  Batch view;
  view.step = batch.step;
  view.dp = batch.dp;
  view.micro_batch = batch.micro_batch;
  // PP stages that each get their own bucket (distribute: world) receive everything.
  const bool pp_views = !topology.distributed(Dim::kPp);
  const int64_t stage = pp_views ? coords.pp : 0;
  const int64_t num_stages = pp_views ? topology.pp : 1;
  const int64_t cp = topology.slices_context() ? topology.cp : 1;
  const Tensor* ids = batch.Find("input_ids");
  int64_t rows = 0, seq_len = 0;
  if (cp > 1) {
    if (ids == nullptr || ids->shape.size() != 2) {
      return DataError("step " + std::to_string(batch.step) + ": rank " +
                           std::to_string(batch.dp) + " micro-batch " +
                           std::to_string(batch.micro_batch),
                       "a context-parallel view needs input_ids [mbs, seq_len]");
    }
    rows = ids->shape[0];
    seq_len = ids->shape[1];
    ARROW_RETURN_NOT_OK(CheckContextSplit(seq_len, cp));
  }
  for (const Tensor& t : batch.tensors) {
    if (!Wanted(t.name, stage, num_stages)) continue;
    if (cp == 1) {
      view.tensors.push_back(t);  // shares storage
    } else if (t.name == "cu_seqlens") {
      view.tensors.push_back(SplitCuSeqlens(t, rows, seq_len, cp, coords.cp, file));
    } else if (t.name == "max_seqlen") {
      const Tensor* cu = batch.Find("cu_seqlens");
      if (cu != nullptr) view.tensors.push_back(MaxSeqlen(SplitCuSeqlens(
                             *cu, rows, seq_len, cp, coords.cp, nullptr)));
    } else if (t.name == "cu_seqlens_unpadded") {
      continue;  // the real lengths of whole pieces; a CP rank holds chunks of them
    } else if (t.shape.size() == 2 && t.shape[0] == rows && t.shape[1] == seq_len &&
               t.name != "pixel_values" && t.name != "image_grid") {
      // (Image tensors are per patch / per image, never split, even when their shape
      // happens to equal [mbs, seq_len]; every CP rank gets them whole.)
      view.tensors.push_back(SplitRows(t, cp, coords.cp, file));
    } else {
      view.tensors.push_back(t);  // not per-token (e.g. image_grid): whole, shared
    }
  }
  return view;
}

}  // namespace braid
