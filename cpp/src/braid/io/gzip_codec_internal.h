// The codecs that compressed JSON Lines files are read through
// (arrow::io::CompressedInputStream). gzip is inflated by Intel's ISA-L (igzip, Debian
// libisal-dev), about 2.4x zlib's rate on this project's machine, so a `.jsonl.gz` file
// counted at open and read again costs less than one zlib read (docs/decisions.md 47);
// every other compression is Arrow's own codec.
//
// The gzip codec decompresses only (Braid writes no gzip): single and multi-member files
// (Arrow's stream starts a new member after one ends), the CRC-32 and length of each
// member checked; a corrupt, cut or non-gzip stream is an Invalid status naming what
// ISA-L found.
//
// Thread-compatible: a codec and each decompressor it makes serve one thread at a time.
#pragma once

#include <arrow/util/compression.h>

#include <memory>

#include "braid/status.h"

namespace braid::internal {

/// A codec that reads `compression`: ISA-L's inflate for GZIP, Arrow's codec otherwise.
Result<std::unique_ptr<arrow::util::Codec>> MakeReadCodec(
    arrow::Compression::type compression);

}  // namespace braid::internal
