#include "braid/io/gzip_codec_internal.h"

#include <isa-l/igzip_lib.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

namespace braid::internal {
namespace {

// What ISA-L's negative return codes say.
std::string InflateError(int code) {
  switch (code) {
    case ISAL_INVALID_BLOCK:
      return "invalid deflate block";
    case ISAL_INVALID_SYMBOL:
      return "invalid deflate symbol";
    case ISAL_INVALID_LOOKBACK:
      return "invalid back-reference distance";
    case ISAL_INVALID_WRAPPER:
      return "not a gzip header";
    case ISAL_UNSUPPORTED_METHOD:
      return "unsupported compression method";
    case ISAL_INCORRECT_CHECKSUM:
      return "CRC-32 or length mismatch";
    case ISAL_NEED_DICT:
      return "needs a preset dictionary";
    default:
      return "inflate error " + std::to_string(code);
  }
}

uint32_t Clamp(int64_t n) {
  return static_cast<uint32_t>(
      std::min<int64_t>(n, std::numeric_limits<uint32_t>::max() / 2));
}

// One gzip member at a time. When a member ends, ISA-L leaves the bytes after its
// trailer unread (the next member, or trailing bytes), so Arrow's stream feeds them again
// after Reset().
class IsalGzipDecompressor : public arrow::util::Decompressor {
 public:
  IsalGzipDecompressor() : state_(std::make_unique<inflate_state>()) { Init(); }

  arrow::Result<DecompressResult> Decompress(int64_t input_len, const uint8_t* input,
                                             int64_t output_len,
                                             uint8_t* output) override {
    const uint32_t in = Clamp(input_len);
    const uint32_t out = Clamp(output_len);
    state_->next_in = const_cast<uint8_t*>(input);
    state_->avail_in = in;
    state_->next_out = output;
    state_->avail_out = out;
    const int code = isal_inflate(state_.get());
    if (code < 0 || code == ISAL_NEED_DICT) {
      return arrow::Status::Invalid("gzip: ", InflateError(code));
    }
    DecompressResult r;
    r.bytes_read = int64_t(in - state_->avail_in);
    r.bytes_written = int64_t(out - state_->avail_out);
    finished_ = state_->block_state == ISAL_BLOCK_FINISH;
    r.need_more_output = !finished_ && r.bytes_written == 0 && state_->avail_out == 0;
    return r;
  }

  bool IsFinished() override { return finished_; }

  arrow::Status Reset() override {
    Init();
    return arrow::Status::OK();
  }

 private:
  void Init() {
    isal_inflate_init(state_.get());
    state_->crc_flag = ISAL_GZIP;
    finished_ = false;
  }

  std::unique_ptr<inflate_state> state_;  // ~40 KiB of tables and history
  bool finished_ = false;
};

class IsalGzipCodec : public arrow::util::Codec {
 public:
  int minimum_compression_level() const override { return kUseDefault; }
  int maximum_compression_level() const override { return kUseDefault; }
  int default_compression_level() const override { return kUseDefault; }

  arrow::Result<int64_t> Decompress(int64_t input_len, const uint8_t* input,
                                    int64_t output_buffer_len,
                                    uint8_t* output_buffer) override {
    IsalGzipDecompressor d;
    ARROW_ASSIGN_OR_RAISE(
        auto r, d.Decompress(input_len, input, output_buffer_len, output_buffer));
    if (!d.IsFinished()) return arrow::Status::Invalid("gzip: truncated or too large");
    return r.bytes_written;
  }
  arrow::Result<int64_t> Compress(int64_t, const uint8_t*, int64_t, uint8_t*) override {
    return NotWritten();
  }
  int64_t MaxCompressedLen(int64_t input_len, const uint8_t*) override {
    return input_len;  // never used: nothing is compressed
  }
  arrow::Result<std::shared_ptr<arrow::util::Compressor>> MakeCompressor() override {
    return NotWritten();
  }
  arrow::Result<std::shared_ptr<arrow::util::Decompressor>> MakeDecompressor() override {
    return std::make_shared<IsalGzipDecompressor>();
  }
  arrow::Compression::type compression_type() const override {
    return arrow::Compression::GZIP;
  }

 private:
  static constexpr int kUseDefault = 0;
  static arrow::Status NotWritten() {
    return arrow::Status::NotImplemented("Braid's gzip codec only decompresses");
  }
};

}  // namespace

Result<std::unique_ptr<arrow::util::Codec>> MakeReadCodec(
    arrow::Compression::type compression) {
  if (compression == arrow::Compression::GZIP) return std::make_unique<IsalGzipCodec>();
  return arrow::util::Codec::Create(compression);
}

}  // namespace braid::internal
