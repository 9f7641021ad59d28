// The text transform (transform.h: text_column): a string column tokenized as documents
// (BOS / EOS, or the tokenizer's post-processor), a batch of rows per tokenizer call.
//
// Thread-safe: Apply and ApplyBatch are const; the tokenizer is thread-safe.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "braid/transform/transform_internal.h"

namespace braid::internal {
namespace {

class TextTransform : public TokenizedTransform {
 public:
  TextTransform(std::string column, std::string key, std::shared_ptr<const Tokenizer> tok)
      : TokenizedTransform(std::move(tok)),
        column_(std::move(column)),
        key_(std::move(key)) {}
  std::vector<ColumnSpec> columns() const override {
    return {{column_, key_, CheckString}};
  }
  int64_t EstimateBytes(const Columns& cols, int64_t i) const override {
    return StringBytes(*cols[0], i);  // ~4 bytes of text per 4-byte token
  }
  void ApplyBatch(const std::vector<BatchRow>& rows, bool want_payload, RowOutput* out,
                  Status* status) const override {
    std::vector<std::vector<std::string_view>> texts;  // one per row to encode
    std::vector<const RowLocation*> where;
    std::vector<size_t> which;
    for (size_t k = 0; k < rows.size(); ++k) {
      std::string_view text;
      if (!StringAt(*(*rows[k].cols)[0], rows[k].index, &text)) {
        out[k].skip = SkipReason::kNull;
        out[k].null_what = "null column '" + column_ + "'";
      } else if (text.empty()) {
        out[k].skip = SkipReason::kEmpty;
      } else {
        texts.push_back({text});
        where.push_back(&rows[k].where);
        which.push_back(k);
      }
    }
    std::vector<std::vector<std::vector<int32_t>>> ids;
    std::vector<Status> errors;
    EncodeRows(*tok_, texts, /*document=*/true, where, &ids, &errors);
    for (size_t r = 0; r < which.size(); ++r) {
      RowOutput& o = out[which[r]];
      status[which[r]] = errors[r];
      if (!errors[r].ok()) continue;
      std::vector<int32_t>& row = ids[r][0];
      if (row.empty()) {
        o.skip = SkipReason::kEmpty;
        continue;
      }
      o.tokens = static_cast<int64_t>(row.size());
      if (want_payload) {
        o.payload = std::make_shared<Payload>();
        o.payload->tokens = std::move(row);
      }
    }
  }

 private:
  const std::string column_;
  const std::string key_;
};

}  // namespace

std::unique_ptr<Transform> MakeTextTransform(std::string column, std::string key,
                                             std::shared_ptr<const Tokenizer> tok) {
  return std::make_unique<TextTransform>(std::move(column), std::move(key),
                                         std::move(tok));
}

}  // namespace braid::internal
