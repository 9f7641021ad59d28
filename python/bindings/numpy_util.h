// NumPy views of C++ buffers for the bindings: no copy, a capsule keeps the owner alive.
#pragma once

#include <memory>
#include <stdexcept>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "braid/batch.h"

namespace braid::python {

namespace nb = nanobind;

using Storage = std::shared_ptr<Bytes>;

// A NumPy array over the tensor's storage; the capsule keeps the storage alive.
inline nb::object ToNumpy(const Tensor& t) {
  auto* keep = new Storage(t.storage);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Storage*>(p); });
  std::vector<size_t> shape(t.shape.begin(), t.shape.end());
  switch (t.dtype) {
    case DType::kInt32:
      return nb::ndarray<nb::numpy, int32_t>(t.storage->data(), shape.size(), shape.data(),
                                             owner)
          .cast();
    case DType::kInt64:
      return nb::ndarray<nb::numpy, int64_t>(t.storage->data(), shape.size(), shape.data(),
                                             owner)
          .cast();
    case DType::kFloat32:
      return nb::ndarray<nb::numpy, float>(t.storage->data(), shape.size(), shape.data(),
                                           owner)
          .cast();
  }
  throw std::runtime_error("unknown dtype");
}

/// A batch's tensors as a dict name -> NumPy array (no copy).
inline nb::dict BatchToDict(const Batch& batch) {
  nb::dict d;
  for (const Tensor& t : batch.tensors) d[t.name.c_str()] = ToNumpy(t);
  return d;
}

}  // namespace braid::python
