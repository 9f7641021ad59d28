// Where the constructor places a build's tensors: on the heap, or in a shared-memory file
// that a transport hands to trainer processes as it is (node delivery on Ray: the trainer
// maps the file, so a view is written once, by its build, and never copied again).
//
// A TensorFile is one anonymous shared-memory file (memfd) for the tensors of one
// micro-batch (or of one context-split view); each tensor gets a page-aligned region of
// it, mapped here. The file lives as long as any of its tensors (and any process that
// mapped it). Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "braid/batch.h"
#include "braid/status.h"

namespace braid {

class TensorFile : public std::enable_shared_from_this<TensorFile> {
 public:
  /// A new, empty file; fails with an IO error (e.g. no descriptor left).
  static Result<std::shared_ptr<TensorFile>> Make();
  ~TensorFile();
  TensorFile(const TensorFile&) = delete;
  TensorFile& operator=(const TensorFile&) = delete;

  /// `size` zeroed bytes in a new region of the file; fails with an IO error.
  Result<std::shared_ptr<Bytes>> Allocate(size_t size);
  /// The file's descriptor (valid while the file lives).
  int fd() const { return fd_; }

 private:
  explicit TensorFile(int fd) : fd_(fd) {}
  const int fd_;
  std::mutex mu_;
  int64_t end_ = 0;  // GUARDED_BY(mu_): the file's size, regions page-aligned
};

/// A zeroed tensor placed in `file`, or on the heap when `file` is null or cannot hold it
/// (it is then copied by a transport that needs a file).
Tensor ZerosIn(TensorFile* file, std::string name, DType dtype, std::vector<int64_t> shape);

/// A TensorFile when `shared`, else null (and null when none can be made: the tensors
/// then go to the heap).
std::shared_ptr<TensorFile> MaybeTensorFile(bool shared);

}  // namespace braid
