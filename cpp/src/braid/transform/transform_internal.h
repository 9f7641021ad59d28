// What the transforms of transform.h share, and the constructors MakeTransform chooses
// from: one file per kind (token_column_transform.cc, text_transform.cc,
// chat_transform.cc, image_caption_transform.cc; user transforms: user_transform.h).
// transform.cc holds MakeTransform and the helpers below: string columns, and encoding
// the texts of several rows in one tokenizer call; TokenizedTransform is the base of the
// text and chat transforms.
//
// Thread-safe: the helpers are pure functions of their arguments (EncodeRows calls the
// thread-safe Tokenizer::EncodeBatch); the transforms are as transform.h says.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <arrow/array.h>

#include "braid/config/config.h"
#include "braid/status.h"
#include "braid/transform/tokenizer.h"
#include "braid/transform/transform.h"

namespace braid::internal {

/// True for string, large_string and string_view.
bool IsString(const arrow::DataType& t);

/// A ColumnSpec check: "" for a string column, else "a string column".
std::string CheckString(const arrow::DataType& t);

/// Row `i` of a string array; false if null. REQUIRES: IsString(*a.type()).
bool StringAt(const arrow::Array& a, int64_t i, std::string_view* out);

/// The bytes of row `i` of a string array (0 when null).
int64_t StringBytes(const arrow::Array& a, int64_t i);

/// The ids of the texts of several rows, from one EncodeBatch call: (*ids)[r][t] are the
/// ids of texts[r][t]. When the call fails, each row is encoded on its own so that the
/// error names its row: (*errors)[r] is a data error naming where[r] for a row that fails
/// (every row gets a Cancelled status when the loader stops).
void EncodeRows(const Tokenizer& tok,
                const std::vector<std::vector<std::string_view>>& texts, bool document,
                const std::vector<const RowLocation*>& where,
                std::vector<std::vector<std::vector<int32_t>>>* ids,
                std::vector<Status>* errors);

/// A transform whose rows are tokenized a batch at a time (text and chat): Apply is
/// ApplyBatch of one row; batch_rows and Cancel are the tokenizer's.
class TokenizedTransform : public Transform {
 public:
  explicit TokenizedTransform(std::shared_ptr<const Tokenizer> tok)
      : tok_(std::move(tok)) {}
  Status Apply(const Columns& cols, int64_t i, bool want_payload,
               const RowLocation& where, RowOutput* out) const override {
    Status st;
    ApplyBatch({BatchRow{&cols, i, where}}, want_payload, out, &st);
    return st;
  }
  int64_t batch_rows() const override { return tok_->batch_rows(); }
  void Cancel() const override { tok_->Cancel(); }

 protected:
  const std::shared_ptr<const Tokenizer> tok_;
};

/// tokens_column: list<int32|int64> passed through; `length_column` (may be "", its
/// config key `length_key`) is checked against each list (token_column_transform.cc).
std::unique_ptr<Transform> MakeTokenColumnTransform(std::string column,
                                                    std::string length_column,
                                                    std::string length_key);

/// text_column (config key `key`), tokenized as documents (text_transform.cc).
std::unique_ptr<Transform> MakeTextTransform(std::string column, std::string key,
                                             std::shared_ptr<const Tokenizer> tok);

/// chat (config key `key`): prompt/response columns or a messages list
/// (chat_transform.cc).
std::unique_ptr<Transform> MakeChatTransform(ChatColumns chat, std::string key,
                                             std::shared_ptr<const Tokenizer> tok);

/// image_column + text_column of source `s` (config key `key`), the caption tokenized
/// (image_caption_transform.cc).
std::unique_ptr<Transform> MakeImageCaptionTransform(
    const SourceConfig& s, std::string key, std::shared_ptr<const Tokenizer> tok);

}  // namespace braid::internal
