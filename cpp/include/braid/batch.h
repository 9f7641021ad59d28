// braid/batch.h: a built micro-batch, the value Loader::Next() returns.
//
// A Batch is a few named dense tensors in host memory: input_ids, labels, loss_mask,
// position_ids, source_ids, cu_seqlens, and pixel_values, image_grid for image sources
// (docs/plan-format.md, "Batch tensors"). Each Tensor owns its bytes through a shared
// pointer, so the views of one build share storage and the Python binding hands them to
// NumPy and PyTorch without a copy (the array keeps the storage alive).
//
// Thread-safe once built: the loader hands out `shared_ptr<const Batch>` and nothing
// writes to it again. The constructor (construct/constructor.h) is its only writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace braid {

/// Element type of a Tensor.
enum class DType { kInt32, kInt64, kFloat32 };

/// Bytes per element of `dtype`.
size_t DTypeSize(DType dtype);
/// "int32", "int64" or "float32".
const char* ToString(DType dtype);

/// A dense, row-major tensor. A copy shares `storage` (a shallow copy).
struct Tensor {
  std::string name;
  DType dtype = DType::kInt64;
  std::vector<int64_t> shape;
  /// num_elements() * DTypeSize(dtype) bytes. INVARIANT: non-null in a built batch.
  std::shared_ptr<std::vector<uint8_t>> storage;

  /// A tensor of `shape` with zeroed storage of its own.
  static Tensor Zeros(std::string name, DType dtype, std::vector<int64_t> shape);
  /// The product of `shape` (1 for a scalar).
  int64_t num_elements() const;
  /// The elements as T. REQUIRES: T matches dtype (int32_t, int64_t or float).
  template <typename T>
  T* data() {
    return reinterpret_cast<T*>(storage->data());
  }
  template <typename T>
  const T* data() const {
    return reinterpret_cast<const T*>(storage->data());
  }
};

/// One micro-batch of one rank's stream: where it sits in the job, and its tensors.
struct Batch {
  int64_t step = 0;         ///< the global optimizer step
  int64_t dp = 0;           ///< the bucket (the DP rank, by default) it was built for
  int64_t micro_batch = 0;  ///< index within the rank's step
  std::vector<Tensor> tensors;

  /// The tensor called `name`, or nullptr. The pointer lives as long as the batch.
  const Tensor* Find(const std::string& name) const;
};

}  // namespace braid
