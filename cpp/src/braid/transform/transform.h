// Per-row transforms of a source loader: row of Arrow columns -> sample payload.
//
// A Transform reads one row of the columns it names and produces the sample's tokens (and
// loss mask for chat data), or says why the row has none (null, empty). Kinds, chosen by
// the source config (docs/sources.md):
//   tokens_column  list<int32|int64> token ids, passed through; with a length column
//                  (sources[].length_column, the second column Apply receives) each
//                  list's length is checked against it
//   text_column    a string, tokenized with the source's tokenizer (transform/tokenizer.h:
//                  SentencePiece, or Hugging Face a batch of rows at a time)
//   chat           prompt/response strings or a messages list, tokenized with the chat
//                  template; loss_mask = 1 on response (assistant) tokens only
//   transform      a user function over the named columns (transform/user_transform.h)
//   image_column + text_column
//                  an encoded image (JPEG / PNG / WebP, transform/image.h), or a list of
//                  them, and a caption: [BOS] every image's placeholders, caption ids
//                  [EOS]; loss_mask = 0 on the placeholders; the payload carries the
//                  images' patches. Apply reads
//                  only the image header (its token count); Finish decodes it
//
// Thread-safe: Apply is const and runs on the loader's worker threads concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <arrow/array.h>

#include "braid/config/config.h"
#include "braid/io/source_files.h"
#include "braid/source/payload.h"
#include "braid/source/sample.h"
#include "braid/transform/tokenizer.h"
#include "braid/status.h"

namespace braid {

using Columns = std::vector<std::shared_ptr<arrow::Array>>;

/// Where a row is, for error messages; formatted only when an error needs it.
struct RowLocation {
  const std::string* file = nullptr;
  int64_t row_group = -1;
  int64_t row = -1;
  std::string ToString() const { return DataLocation(*file, row_group, row); }
};

/// What a transform made of one row.
struct RowOutput {
  SkipReason skip = SkipReason::kNone;
  std::string null_what;  ///< for kNull / kError: what was wrong ("null column 'text'")
  int64_t tokens = 0;
  int64_t image_tokens = 0;  ///< image placeholder tokens among `tokens`
  std::shared_ptr<Payload> payload;  ///< set when asked for and not skipped
  /// Metadata first: `payload` has its tokens and loss mask but still lacks its slow part
  /// (decoded images), which Transform::Finish adds later; `payload_bytes` is what the
  /// finished payload will hold.
  bool deferred = false;
  int64_t payload_bytes = 0;
};

/// One row handed to Transform::ApplyBatch.
struct BatchRow {
  const Columns* cols = nullptr;
  int64_t index = 0;
  RowLocation where;
};

class Transform {
 public:
  virtual ~Transform() = default;
  /// The columns Apply receives, in order (empty for the token column, which SourceFiles
  /// reads).
  virtual std::vector<ColumnSpec> columns() const = 0;
  /// A cheap estimate of the payload bytes of row `i`, to bound work in flight.
  virtual int64_t EstimateBytes(const Columns& cols, int64_t i) const = 0;
  /// Transforms row `i`. A data error (e.g. a token id out of range) is returned; a null
  /// is reported in `out` (the loader applies on_error). `where` names file/row group/row.
  virtual Status Apply(const Columns& cols, int64_t i, bool want_payload,
                       const RowLocation& where, RowOutput* out) const = 0;
  /// Rows the loader should hand to one ApplyBatch call (1: row by row, the default).
  virtual int64_t batch_rows() const { return 1; }
  /// Transforms rows[k] into out[k] / status[k] (as Apply would: `status` holds Apply's
  /// return value), in one call: a tokenizer that encodes a batch at a time (Hugging
  /// Face) sees the batch's texts together. The default calls Apply row by row.
  virtual void ApplyBatch(const std::vector<BatchRow>& rows, bool want_payload,
                          RowOutput* out, Status* status) const {
    for (size_t k = 0; k < rows.size(); ++k) {
      status[k] = Apply(*rows[k].cols, rows[k].index, want_payload, rows[k].where, &out[k]);
    }
  }
  /// The loader is stopping: Apply calls from now on may return Cancelled early. Called
  /// before the loader joins its threads (user transforms: transform/user_transform.h).
  virtual void Cancel() const {}
  /// True if Apply (with a payload) may leave the slow part of a payload to Finish, so
  /// the loader can publish the sample's metadata first (image-caption samples).
  virtual bool defers() const { return false; }
  /// True if Apply's metadata without a payload (skip, tokens) and EstimateBytes follow
  /// from the row's token count alone (SourceFiles::ReadLengths): a plan-only loader then
  /// reads the counts instead of the columns, and calls ApplyLength.
  virtual bool metadata_from_lengths() const { return false; }
  /// Apply(want_payload = false) for a row known by its token count: fills `out` and
  /// returns the row's EstimateBytes. REQUIRES: metadata_from_lengths().
  virtual int64_t ApplyLength(const RowLength& /*row*/, RowOutput* /*out*/) const {
    return 0;
  }
  /// Completes a payload that Apply left deferred, later and on any thread (`cols` kept
  /// alive by the caller). On failure (e.g. an image whose header was fine but whose body
  /// does not decode) returns the error naming `where`, and leaves `payload` well-formed
  /// but blank: the images' pixels 0 and the loss mask all 0.
  virtual Status Finish(const Columns& /*cols*/, int64_t /*i*/,
                        const RowLocation& /*where*/, Payload* /*payload*/) const {
    return Status::OK();
  }
  /// The encoded images that Finish decodes for row `i`, in the payload's image order
  /// (views into `cols`); none for a transform without images. The Ray runtime's payload
  /// service sends these instead of decoded pixels (docs/decisions.md, 40).
  virtual void EncodedImages(const Columns& /*cols*/, int64_t /*i*/,
                             std::vector<std::string_view>* out) const {
    out->clear();
  }
};

/// The transform of config.sources[source_index]; loads its tokenizer where needed (fails
/// naming the tokenizer's key path).
Result<std::unique_ptr<Transform>> MakeTransform(const Config& config, int32_t source_index);

}  // namespace braid
