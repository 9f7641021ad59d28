// braid/batch.h: a built micro-batch, the value Loader::Next() returns.
//
// A Batch is a few named dense tensors in host memory: input_ids, labels, loss_mask,
// position_ids, source_ids, cu_seqlens, and pixel_values, image_grid for image sources
// (docs/plan-format.md, "Batch tensors"). Each Tensor owns its bytes through a shared
// pointer, so the views of one build share storage and the Python binding hands them to
// NumPy and PyTorch without a copy (the array keeps the storage alive). The bytes lie on
// the heap or, where the runtime hands tensors to other processes as they are (node
// delivery on Ray), in a shared-memory file (Bytes::fd).
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

/// A tensor's bytes: zeroed heap memory, or a region of a shared-memory file (made by the
/// constructor, construct/tensor_memory.h) that another process can map as it is. Not
/// copyable; tensors share it through a shared_ptr. Thread-compatible.
class Bytes {
 public:
  /// `size` zeroed bytes on the heap. Throws std::bad_alloc when memory is exhausted.
  explicit Bytes(size_t size);
  /// Bytes that lie elsewhere (`data`, `size`), kept alive by `owner`; `fd` and `offset`
  /// say where they lie in a shared-memory file (fd -1: in none).
  Bytes(uint8_t* data, size_t size, std::shared_ptr<void> owner, int fd, int64_t offset);
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;
  ~Bytes();

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  /// The shared-memory file the bytes lie in (valid while they live), or -1.
  int fd() const { return fd_; }
  /// Where they start in that file (a multiple of the page size).
  int64_t offset() const { return offset_; }
  /// The same contents (wherever they lie).
  bool operator==(const Bytes& other) const;

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<void> owner_;  // null: data_ is this object's own (heap) allocation
  int fd_ = -1;
  int64_t offset_ = 0;
};

/// A dense, row-major tensor. A copy shares `storage` (a shallow copy).
struct Tensor {
  std::string name;
  DType dtype = DType::kInt64;
  std::vector<int64_t> shape;
  /// num_elements() * DTypeSize(dtype) bytes. INVARIANT: non-null in a built batch.
  std::shared_ptr<Bytes> storage;

  /// A tensor of `shape` with zeroed heap storage of its own.
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
