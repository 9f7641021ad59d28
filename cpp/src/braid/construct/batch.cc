#include "braid/batch.h"

#include <cstdlib>
#include <cstring>
#include <new>

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

Bytes::Bytes(size_t size) : size_(size) {
  // calloc: large blocks come zeroed from the kernel, with no pass over them here.
  if (size > 0) {
    data_ = static_cast<uint8_t*>(std::calloc(size, 1));
    if (data_ == nullptr) throw std::bad_alloc();
  }
}

Bytes::Bytes(uint8_t* data, size_t size, std::shared_ptr<void> owner, int fd,
             int64_t offset)
    : data_(data), size_(size), owner_(std::move(owner)), fd_(fd), offset_(offset) {}

Bytes::~Bytes() {
  if (owner_ == nullptr) std::free(data_);
}

bool Bytes::operator==(const Bytes& other) const {
  return size_ == other.size_ && (size_ == 0 || std::memcmp(data_, other.data_, size_) == 0);
}

Tensor Tensor::Zeros(std::string name, DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.storage =
      std::make_shared<Bytes>(static_cast<size_t>(t.num_elements()) * DTypeSize(dtype));
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
