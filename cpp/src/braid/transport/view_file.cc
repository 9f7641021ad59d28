#include "braid/transport/view_file.h"

#include <sys/mman.h>  // memfd_create
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

namespace braid {

namespace {

constexpr int64_t kAlign = 64;

int64_t Aligned(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

const char* NumpyDtype(DType dtype) {
  switch (dtype) {
    case DType::kInt32: return "<i4";
    case DType::kInt64: return "<i8";
    case DType::kFloat32: return "<f4";
  }
  return "?";
}

Status Errno(const std::string& what) {
  return Status::IOError("node delivery: " + what + ": " + std::strerror(errno));
}

Status WriteAt(int fd, const uint8_t* data, size_t size, int64_t offset) {
  while (size > 0) {
    const ssize_t n = pwrite(fd, data, size, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("pwrite");
    }
    data += n;
    size -= size_t(n);
    offset += n;
  }
  return Status::OK();
}

}  // namespace

Result<std::shared_ptr<ViewFile>> ViewFile::Write(std::shared_ptr<const Batch> batch,
                                                  const std::string& state_before,
                                                  const std::string& state_after) {
  std::shared_ptr<ViewFile> out(new ViewFile());
  // Where each tensor lies: in a file of its own build (passed on), or copied here.
  nlohmann::ordered_json arrays = nlohmann::ordered_json::array();
  std::map<int, int64_t> file_index;
  std::vector<const Tensor*> copied;
  int64_t copied_bytes = 0;
  std::vector<int64_t> copied_at;
  for (const Tensor& t : batch->tensors) {
    const Bytes& bytes = *t.storage;
    int64_t file = 0, offset = 0;
    if (bytes.fd() >= 0 && bytes.size() > 0) {
      auto [it, added] = file_index.emplace(bytes.fd(), int64_t(out->files_.size()) + 1);
      if (added) out->files_.push_back(bytes.fd());
      file = it->second;
      offset = bytes.offset();
    } else {
      copied.push_back(&t);
      copied_at.push_back(copied_bytes);
      offset = copied_bytes;  // from the header's end
      copied_bytes += Aligned(int64_t(bytes.size()));
    }
    arrays.push_back({t.name, NumpyDtype(t.dtype), t.shape, file, offset,
                      int64_t(bytes.size())});
  }
  const std::string text = nlohmann::ordered_json{
      {"before", state_before}, {"after", state_after}, {"arrays", arrays}}.dump();
  const int64_t base = Aligned(8 + int64_t(text.size()));
  out->header_size_ = std::max<int64_t>(base + copied_bytes, 1);
  out->header_fd_ = memfd_create("braid-view", MFD_CLOEXEC);
  if (out->header_fd_ < 0) return Errno("memfd_create");
  if (ftruncate(out->header_fd_, out->header_size_) != 0) return Errno("ftruncate");
  uint8_t length[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) length[i] = uint8_t(n >> (8 * i));
  ARROW_RETURN_NOT_OK(WriteAt(out->header_fd_, length, 8, 0));
  ARROW_RETURN_NOT_OK(WriteAt(out->header_fd_, reinterpret_cast<const uint8_t*>(text.data()),
                              text.size(), 8));
  for (size_t i = 0; i < copied.size(); ++i) {
    const Bytes& bytes = *copied[i]->storage;
    ARROW_RETURN_NOT_OK(
        WriteAt(out->header_fd_, bytes.data(), bytes.size(), base + copied_at[i]));
  }
  out->batch_ = std::move(batch);
  return out;
}

ViewFile::~ViewFile() {
  if (header_fd_ >= 0) close(header_fd_);
}

}  // namespace braid
