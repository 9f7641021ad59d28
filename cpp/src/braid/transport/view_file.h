// A view as node delivery hands it to a trainer process on the same node
// (python/braid/ray_runtime/node_delivery.py reads it): a header file, then the
// shared-memory files its tensors lie in (construct/tensor_memory.h), passed as they are,
// so a view's bytes are written once, by its build.
//
// The header file (a memfd) holds an 8-byte little-endian length, a JSON object of that
// length, then, at 64-byte-aligned offsets, the bytes of tensors that lie in no
// shared-memory file (a build that could not get one: they are copied here). The JSON:
//   {"before": STATE, "after": STATE,
//    "arrays": [[name, dtype, shape, file, offset, nbytes], ...]}
// dtype as NumPy writes it ("<i4", "<i8", "<f4"); file 0 is the header file itself (offset
// counted from the header's end, 8 + length rounded up to 64), k > 0 the k-th of `files`
// (offset from the file's start).
//
// Thread-compatible; the descriptors are valid while the ViewFile lives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "braid/batch.h"
#include "braid/status.h"

namespace braid {

class ViewFile {
 public:
  /// The view file of `batch` with the states around it; fails with an IO error.
  static Result<std::shared_ptr<ViewFile>> Write(std::shared_ptr<const Batch> batch,
                                                 const std::string& state_before,
                                                 const std::string& state_after);
  ~ViewFile();
  ViewFile(const ViewFile&) = delete;
  ViewFile& operator=(const ViewFile&) = delete;

  int header_fd() const { return header_fd_; }
  int64_t header_size() const { return header_size_; }
  /// The shared-memory files the tensors lie in, in the header's order (file 1, 2, ...).
  const std::vector<int>& files() const { return files_; }

 private:
  ViewFile() = default;
  int header_fd_ = -1;
  int64_t header_size_ = 0;
  std::vector<int> files_;
  std::shared_ptr<const Batch> batch_;  // keeps the tensors' files open
};

}  // namespace braid
