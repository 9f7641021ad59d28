// A built micro-batch: named dense tensors in host memory.
//
// Tensors own their storage through a shared pointer so the Python binding can hand them
// to NumPy/PyTorch without copying (the array keeps the storage alive). Thread-safe:
// immutable once built.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace braid {

enum class DType { kInt32, kInt64, kFloat32 };

size_t DTypeSize(DType dtype);
const char* ToString(DType dtype);

struct Tensor {
  std::string name;
  DType dtype = DType::kInt64;
  std::vector<int64_t> shape;
  std::shared_ptr<std::vector<uint8_t>> storage;

  /// Allocates zeroed storage for `shape`.
  static Tensor Zeros(std::string name, DType dtype, std::vector<int64_t> shape);
  int64_t num_elements() const;
  template <typename T>
  T* data() {
    return reinterpret_cast<T*>(storage->data());
  }
  template <typename T>
  const T* data() const {
    return reinterpret_cast<const T*>(storage->data());
  }
};

struct Batch {
  int64_t step = 0;
  int64_t dp = 0;           ///< the DP rank it was built for
  int64_t micro_batch = 0;  ///< index within the rank's step
  std::vector<Tensor> tensors;

  /// The tensor called `name`, or nullptr.
  const Tensor* Find(const std::string& name) const;
};

}  // namespace braid
