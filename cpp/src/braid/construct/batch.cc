#include "braid/batch.h"

namespace braid {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kFloat32: return 4;
  }
  return 0;
}

const char* ToString(DType dtype) {
  switch (dtype) {
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat32: return "float32";
  }
  return "?";
}

Tensor Tensor::Zeros(std::string name, DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.storage = std::make_shared<std::vector<uint8_t>>(
      static_cast<size_t>(t.num_elements()) * DTypeSize(dtype), 0);
  return t;
}

int64_t Tensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const Tensor* Batch::Find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace braid
