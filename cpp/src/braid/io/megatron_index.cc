// MegatronIndex (megatron_index.h): the header, and ranges of documents read with ReadAt.
//
// Thread-safe: see the header.
#include "braid/io/megatron_index.h"

#include <algorithm>
#include <cstring>

namespace braid {
namespace {

constexpr char kMagic[] = "MMIDIDX\0\0";  // 9 bytes with the two NULs
constexpr int64_t kMagicBytes = 9;

// Bytes per token of a dtype code; 0 for codes that are not integer token types.
int ItemBytes(int code) {
  switch (code) {
    case 1: case 2: return 1;  // uint8, int8
    case 3: case 8: return 2;  // int16, uint16
    case 4: return 4;          // int32
    case 5: return 8;          // int64
    default: return 0;         // 6 float64, 7 float32, or unknown
  }
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // little-endian on the hosts Braid runs on
  return v;
}

}  // namespace

const char* MegatronIndex::dtype_name() const {
  switch (dtype_code_) {
    case 1: return "uint8";
    case 2: return "int8";
    case 3: return "int16";
    case 4: return "int32";
    case 5: return "int64";
    case 8: return "uint16";
    default: return "?";
  }
}

Result<std::unique_ptr<MegatronIndex>> MegatronIndex::Open(
    std::shared_ptr<arrow::io::RandomAccessFile> idx, const std::string& path) {
  auto size = idx->GetSize();
  if (!size.ok()) return StorageError(path, size.status().message());
  auto header = idx->ReadAt(0, kMegatronHeaderBytes);
  if (!header.ok()) return StorageError(path, header.status().message());
  const uint8_t* h = (*header)->data();
  if ((*header)->size() < kMegatronHeaderBytes ||
      std::memcmp(h, kMagic, kMagicBytes) != 0) {
    return DataError(path, "not a Megatron index (no MMIDIDX header)");
  }
  std::unique_ptr<MegatronIndex> out(new MegatronIndex());
  const uint64_t version = Load<uint64_t>(h + 9);
  if (version != 1) {
    return DataError(path, "Megatron index version " + std::to_string(version) +
                               ", expected 1");
  }
  out->dtype_code_ = h[17];
  out->item_bytes_ = ItemBytes(out->dtype_code_);
  if (out->item_bytes_ == 0) {
    return DataError(path, "dtype code " + std::to_string(out->dtype_code_) +
                               " is not an integer token type (1-5 or 8)");
  }
  const uint64_t sequences = Load<uint64_t>(h + 18);
  const uint64_t document_count = Load<uint64_t>(h + 26);
  // The arrays' sizes, checked against the file before any is read (a count past the
  // file is a damaged header, not a reason to allocate).
  const uint64_t limit = uint64_t{1} << 40;
  if (sequences > limit || document_count > limit || document_count == 0) {
    return DataError(path, "implausible counts in the header (" +
                               std::to_string(sequences) + " sequences, " +
                               std::to_string(document_count) + " document indices)");
  }
  const int64_t need =
      kMegatronHeaderBytes + int64_t(sequences) * 12 + int64_t(document_count) * 8;
  if (*size < need) {
    return DataError(path, "the index has " + std::to_string(*size) +
                               " bytes, its counts need " + std::to_string(need) +
                               " (truncated?)");
  }
  out->idx_ = std::move(idx);
  out->path_ = path;
  out->sequences_ = int64_t(sequences);
  out->documents_ = int64_t(document_count) - 1;
  return out;
}

Result<MegatronDocuments> MegatronIndex::ReadDocuments(int64_t first, int64_t n,
                                                       bool with_pointers) const {
  MegatronDocuments out;
  out.first = first;
  if (first < 0 || n < 0 || first + n > documents_) {
    return Status::Invalid("documents ", first, "..", first + n, " outside 0..",
                           documents_);
  }
  auto read = [&](int64_t offset, int64_t bytes) -> Result<std::shared_ptr<arrow::Buffer>> {
    auto buf = idx_->ReadAt(offset, bytes);
    if (!buf.ok()) return StorageError(path_, buf.status().message());
    if ((*buf)->size() != bytes) {
      return DataError(path_, "ends early: read " + std::to_string((*buf)->size()) +
                                  " of " + std::to_string(bytes) + " bytes at " +
                                  std::to_string(offset));
    }
    return std::move(*buf);
  };
  const int64_t lengths_at = kMegatronHeaderBytes;
  const int64_t pointers_at = lengths_at + sequences_ * 4;
  const int64_t documents_at = pointers_at + sequences_ * 8;
  ARROW_ASSIGN_OR_RAISE(auto di, read(documents_at + first * 8, (n + 1) * 8));
  std::vector<int64_t> bounds(size_t(n + 1));
  std::memcpy(bounds.data(), di->data(), size_t(n + 1) * 8);
  for (int64_t d = 0; d <= n; ++d) {
    const int64_t b = bounds[size_t(d)];
    if (b < 0 || b > sequences_ || (d > 0 && b < bounds[size_t(d - 1)])) {
      return DataError(path_, "document " + std::to_string(first + std::max<int64_t>(d - 1, 0)) +
                                  ": document_indices[" + std::to_string(first + d) +
                                  "] = " + std::to_string(b) +
                                  " does not rise within the " +
                                  std::to_string(sequences_) + " sequences");
    }
  }
  out.first_sequence = bounds.front();
  const int64_t s = bounds.back() - bounds.front();
  ARROW_ASSIGN_OR_RAISE(auto lb, read(lengths_at + out.first_sequence * 4, s * 4));
  out.lengths.resize(size_t(s));
  std::memcpy(out.lengths.data(), lb->data(), size_t(s) * 4);
  out.document_sequences.resize(size_t(n + 1));
  out.tokens.resize(size_t(n));
  for (int64_t d = 0; d <= n; ++d) {
    out.document_sequences[size_t(d)] = bounds[size_t(d)] - out.first_sequence;
  }
  for (int64_t d = 0; d < n; ++d) {
    int64_t tokens = 0;
    for (int64_t q = out.document_sequences[size_t(d)];
         q < out.document_sequences[size_t(d + 1)]; ++q) {
      const int32_t len = out.lengths[size_t(q)];
      if (len < 0) {
        return DataError(path_, "document " + std::to_string(first + d) + ": sequence " +
                                    std::to_string(out.first_sequence + q) +
                                    " has length " + std::to_string(len));
      }
      tokens += len;
    }
    out.tokens[size_t(d)] = tokens;
  }
  if (with_pointers) {
    ARROW_ASSIGN_OR_RAISE(auto pb, read(pointers_at + out.first_sequence * 8, s * 8));
    out.pointers.resize(size_t(s));
    std::memcpy(out.pointers.data(), pb->data(), size_t(s) * 8);
  }
  return out;
}

}  // namespace braid
