#include "braid/construct/tensor_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace braid {

namespace {

Status Errno(const std::string& what) {
  return Status::IOError("tensor memory: " + what + ": " + std::strerror(errno));
}

int64_t PageSize() {
  static const int64_t page = sysconf(_SC_PAGESIZE);
  return page;
}

}  // namespace

Result<std::shared_ptr<TensorFile>> TensorFile::Make() {
  const int fd = memfd_create("braid-tensors", MFD_CLOEXEC);
  if (fd < 0) return Errno("memfd_create");
  return std::shared_ptr<TensorFile>(new TensorFile(fd));
}

TensorFile::~TensorFile() { close(fd_); }

Result<std::shared_ptr<Bytes>> TensorFile::Allocate(size_t size) {
  if (size == 0) return std::make_shared<Bytes>(0);
  const int64_t page = PageSize();
  const int64_t length = (int64_t(size) + page - 1) / page * page;
  int64_t at = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    at = end_;
    // A new file's pages read as zeros; growing it adds zeroed pages.
    if (ftruncate(fd_, at + length) != 0) return Errno("ftruncate");
    end_ = at + length;
  }
  void* mapped = mmap(nullptr, size_t(length), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, at);
  if (mapped == MAP_FAILED) return Errno("mmap");
  // The mapping, and the file with it, go with the last tensor that holds the bytes.
  std::shared_ptr<void> owner(mapped, [file = shared_from_this(), length](void* p) {
    munmap(p, size_t(length));
  });
  return std::make_shared<Bytes>(static_cast<uint8_t*>(mapped), size, std::move(owner), fd_,
                                 at);
}

Tensor ZerosIn(TensorFile* file, std::string name, DType dtype, std::vector<int64_t> shape) {
  if (file == nullptr) return Tensor::Zeros(std::move(name), dtype, std::move(shape));
  Tensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  const size_t size = size_t(t.num_elements()) * DTypeSize(dtype);
  auto bytes = file->Allocate(size);
  t.storage = bytes.ok() ? *std::move(bytes) : std::make_shared<Bytes>(size);
  return t;
}

std::shared_ptr<TensorFile> MaybeTensorFile(bool shared) {
  if (!shared) return nullptr;
  auto file = TensorFile::Make();
  return file.ok() ? *std::move(file) : nullptr;
}

}  // namespace braid
