// A Megatron-LM indexed dataset's index (.idx), read in pieces.
//
// The format (megatron/core/datasets/indexed_dataset.py, _IndexWriter): the magic
// "MMIDIDX\0\0", a uint64 version (1), a uint8 dtype code (1 uint8, 2 int8, 3 int16,
// 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), a uint64 sequence count S and a
// uint64 document count D+1, then int32 sequence_lengths[S], int64 sequence_pointers[S]
// (byte offsets into the .bin), int64 document_indices[D+1] (document d is sequences
// document_indices[d] .. document_indices[d+1]) and, for multimodal datasets, int8
// sequence_modes[S], which Braid does not read. All little-endian. A Braid row is one
// document: its tokens are its sequences, concatenated.
//
// MegatronIndex reads the 34-byte header when opened and each range of documents on
// request through an arrow::io::RandomAccessFile (ReadAt: a local file or a ranged GET
// of S3, GCS, ...), so opening costs one small read whatever the dataset's size, and
// memory follows the documents read, never the token count or the whole index.
//
// Thread-safe: the reads are ReadAt calls on a RandomAccessFile, which Arrow makes safe
// to call concurrently; the object is immutable after Open.
#pragma once

#include <arrow/buffer.h>
#include <arrow/io/interfaces.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "braid/status.h"

namespace braid {

/// The header's fixed size: magic, version, dtype code, two counts.
inline constexpr int64_t kMegatronHeaderBytes = 34;

/// The documents [first, first + n) of a dataset, as the index describes them.
struct MegatronDocuments {
  int64_t first = 0;
  /// Per document, its token count (the sum of its sequences' lengths).
  std::vector<int64_t> tokens;
  /// The sequences of the documents: [first_sequence, first_sequence + lengths.size()).
  int64_t first_sequence = 0;
  /// Per document, its first sequence's index into `lengths` (n + 1 entries).
  std::vector<int64_t> document_sequences;
  std::vector<int32_t> lengths;   ///< per sequence, tokens
  std::vector<int64_t> pointers;  ///< per sequence, byte offset in .bin (with_pointers)
};

class MegatronIndex {
 public:
  /// Reads and checks the header of `idx` (named `path` in errors). A bad magic, version,
  /// dtype code, or an index shorter than its counts say is a data error naming `path`; a
  /// failed read a storage error.
  static Result<std::unique_ptr<MegatronIndex>> Open(
      std::shared_ptr<arrow::io::RandomAccessFile> idx, const std::string& path);

  int dtype_code() const { return dtype_code_; }
  /// Bytes per token in the .bin: 1, 2, 4 or 8.
  int item_bytes() const { return item_bytes_; }
  /// "uint16", "int32", ...
  const char* dtype_name() const;
  int64_t sequences() const { return sequences_; }
  int64_t documents() const { return documents_; }

  /// Documents [first, first + n): token counts and sequence lengths, and with
  /// `with_pointers` the sequences' byte offsets. Checks that the document indices rise
  /// and stay within the sequences and that no length is negative (data errors naming
  /// the index file and the document).
  Result<MegatronDocuments> ReadDocuments(int64_t first, int64_t n,
                                          bool with_pointers) const;

 private:
  MegatronIndex() = default;

  std::shared_ptr<arrow::io::RandomAccessFile> idx_;
  std::string path_;
  int dtype_code_ = 0;
  int item_bytes_ = 0;
  int64_t sequences_ = 0;
  int64_t documents_ = 0;
};

}  // namespace braid
