// MakeTransform (transform.h), which picks the transform kind of a source, and the
// helpers the kinds share (transform_internal.h).
#include "braid/transform/transform.h"

#include <arrow/api.h>

#include "braid/transform/transform_internal.h"
#include "braid/transform/user_transform.h"

namespace braid {
namespace internal {

bool IsString(const arrow::DataType& t) {
  return t.id() == arrow::Type::STRING || t.id() == arrow::Type::LARGE_STRING ||
         t.id() == arrow::Type::STRING_VIEW;
}

std::string CheckString(const arrow::DataType& t) {
  return IsString(t) ? "" : "a string column";
}

bool StringAt(const arrow::Array& a, int64_t i, std::string_view* out) {
  if (a.IsNull(i)) return false;
  switch (a.type_id()) {
    case arrow::Type::STRING:
      *out = static_cast<const arrow::StringArray&>(a).GetView(i);
      break;
    case arrow::Type::LARGE_STRING:
      *out = static_cast<const arrow::LargeStringArray&>(a).GetView(i);
      break;
    default:
      *out = static_cast<const arrow::StringViewArray&>(a).GetView(i);
      break;
  }
  return true;
}

int64_t StringBytes(const arrow::Array& a, int64_t i) {
  std::string_view v;
  return StringAt(a, i, &v) ? static_cast<int64_t>(v.size()) : 0;
}

void EncodeRows(const Tokenizer& tok,
                const std::vector<std::vector<std::string_view>>& texts, bool document,
                const std::vector<const RowLocation*>& where,
                std::vector<std::vector<std::vector<int32_t>>>* ids,
                std::vector<Status>* errors) {
  const size_t n = texts.size();
  ids->assign(n, {});
  errors->assign(n, Status::OK());
  std::vector<std::string_view> flat;
  for (const auto& row : texts) flat.insert(flat.end(), row.begin(), row.end());
  std::vector<std::vector<int32_t>> out;
  Status st = flat.empty() ? Status::OK() : tok.EncodeBatch(flat, document, &out);
  if (st.ok()) {
    size_t at = 0;
    for (size_t r = 0; r < n; ++r) {
      auto& row = (*ids)[r];
      row.resize(texts[r].size());
      for (auto& v : row) v = std::move(out[at++]);
    }
    return;
  }
  for (size_t r = 0; r < n; ++r) {
    if (!st.IsCancelled() && n > 1) {
      st = texts[r].empty() ? Status::OK()
                            : tok.EncodeBatch(texts[r], document, &(*ids)[r]);
    }
    if (st.IsCancelled()) {
      (*errors)[r] = st;
    } else if (!st.ok()) {
      (*errors)[r] = DataError(where[r]->ToString(), st.message());
    } else {
      (*ids)[r].resize(texts[r].size());
    }
  }
}

}  // namespace internal

Result<std::unique_ptr<Transform>> MakeTransform(const Config& config,
                                                 int32_t source_index) {
  const SourceConfig& s = config.sources[static_cast<size_t>(source_index)];
  const std::string key = "sources[" + std::to_string(source_index) + "]";
  if (s.user_transform.enabled()) {
    ARROW_ASSIGN_OR_RAISE(auto callback, MakeRowCallback(s.user_transform.python,
                                                         key + ".transform.python"));
    return MakeUserTransform(config, source_index, std::move(callback));
  }
  if (s.text_column.empty() && !s.chat.enabled()) {
    return internal::MakeTokenColumnTransform(s.tokens_column, s.length_column,
                                              key + ".length_column");
  }
  const TokenizerConfig& tc = config.TokenizerFor(size_t(source_index));
  if (tc.model.empty()) {
    return ConfigError(key, "text_column and chat need a tokenizer (root-level or the "
                            "source's own)");
  }
  ARROW_ASSIGN_OR_RAISE(auto tok, Tokenizer::Make(tc));
  if (!s.image_column.empty()) {
    return internal::MakeImageCaptionTransform(s, key, std::move(tok));
  }
  if (!s.text_column.empty()) {
    return internal::MakeTextTransform(s.text_column, key + ".text_column",
                                       std::move(tok));
  }
  return internal::MakeChatTransform(s.chat, key + ".chat", std::move(tok));
}

}  // namespace braid
