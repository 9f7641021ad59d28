#include "braid/transform/transform.h"

#include <algorithm>
#include <limits>
#include <string_view>

#include <arrow/api.h>

#include "braid/transform/image.h"
#include "braid/transform/user_transform.h"

namespace braid {
namespace {

// ---------------------------------------------------------------------------------------
// Token column: list<int32|int64>, passed through. int32 ids are not copied: the payload
// views the column's values buffer (shared by the row group's rows, kept alive by the
// payload); int64 ids are range-checked and narrowed into the payload's own vector.

template <typename ListT>
Result<TokenSpan> Int64Tokens(const ListT& list, int64_t i, const RowLocation& where) {
  const auto& values = static_cast<const arrow::Int64Array&>(*list.values());
  const int64_t begin = list.value_offset(i);
  const int64_t len = list.value_length(i);
  const int64_t* raw = values.raw_values() + begin;
  std::vector<int32_t> out(static_cast<size_t>(len));
  for (int64_t k = 0; k < len; ++k) {
    const int64_t v = raw[k];
    if (v < 0 || v > std::numeric_limits<int32_t>::max()) {
      return DataError(where.ToString(),
                       "token id " + std::to_string(v) + " does not fit int32");
    }
    out[size_t(k)] = static_cast<int32_t>(v);
  }
  return TokenSpan(std::move(out));
}

template <typename ListT>
TokenSpan Int32Tokens(const ListT& list, int64_t i) {
  const auto& values = static_cast<const arrow::Int32Array&>(*list.values());
  const int32_t* raw = values.raw_values() + list.value_offset(i);
  return TokenSpan::View(raw, static_cast<size_t>(list.value_length(i)),
                         values.data()->buffers[1]);
}

// Length, null flag, and child-null check of row `i` of a list<int> array.
struct ListInfo {
  int64_t length = 0;
  bool null = false;
  bool has_null_values = false;
};

ListInfo InfoOf(const arrow::Array& array, int64_t i) {
  ListInfo info;
  info.null = array.IsNull(i);
  if (info.null) return info;
  const arrow::Array* values = nullptr;
  int64_t begin = 0;
  if (array.type_id() == arrow::Type::LIST) {
    const auto& list = static_cast<const arrow::ListArray&>(array);
    info.length = list.value_length(i);
    begin = list.value_offset(i);
    values = list.values().get();
  } else {
    const auto& list = static_cast<const arrow::LargeListArray&>(array);
    info.length = list.value_length(i);
    begin = list.value_offset(i);
    values = list.values().get();
  }
  if (values->null_count() > 0) {
    for (int64_t k = 0; k < info.length; ++k) {
      if (values->IsNull(begin + k)) {
        info.has_null_values = true;
        break;
      }
    }
  }
  return info;
}

// The ids of row `i`. REQUIRES: the row and its values are not null.
Result<TokenSpan> RowTokens(const arrow::Array& array, int64_t i, const RowLocation& where) {
  const bool wide = array.type()->field(0)->type()->id() == arrow::Type::INT64;
  if (array.type_id() == arrow::Type::LIST) {
    const auto& list = static_cast<const arrow::ListArray&>(array);
    return wide ? Int64Tokens(list, i, where) : Int32Tokens(list, i);
  }
  const auto& list = static_cast<const arrow::LargeListArray&>(array);
  return wide ? Int64Tokens(list, i, where) : Int32Tokens(list, i);
}

class TokenColumnTransform : public Transform {
 public:
  // `length_column` (may be ""): the source's length column, Apply's second column.
  TokenColumnTransform(std::string column, std::string length_column,
                       std::string length_key)
      : column_(std::move(column)),
        length_column_(std::move(length_column)),
        length_key_(std::move(length_key)) {}
  std::vector<ColumnSpec> columns() const override { return {}; }
  int64_t EstimateBytes(const Columns& cols, int64_t i) const override {
    return InfoOf(*cols[0], i).length * int64_t{sizeof(int32_t)};
  }
  Status Apply(const Columns& cols, int64_t i, bool want_payload, const RowLocation& where,
               RowOutput* out) const override {
    const ListInfo info = InfoOf(*cols[0], i);
    if (cols.size() > 1) ARROW_RETURN_NOT_OK(CheckLength(*cols[1], i, info, where));
    FromLength(RowLength{info.length, info.null, info.has_null_values}, out);
    if (out->skip == SkipReason::kNone && want_payload) {
      ARROW_ASSIGN_OR_RAISE(TokenSpan ids, RowTokens(*cols[0], i, where));
      out->payload = std::make_shared<Payload>();
      out->payload->tokens = std::move(ids);
    }
    return Status::OK();
  }
  bool metadata_from_lengths() const override { return true; }
  int64_t ApplyLength(const RowLength& row, RowOutput* out) const override {
    FromLength(row, out);
    return (row.null ? 0 : row.tokens) * int64_t{sizeof(int32_t)};
  }

 private:
  // What a row is, from its count and nulls (Apply and ApplyLength agree by using it).
  void FromLength(const RowLength& row, RowOutput* out) const {
    if (row.null || row.null_values) {
      out->skip = SkipReason::kNull;
      out->null_what =
          std::string(row.null ? "null" : "null token in") + " column '" + column_ + "'";
    } else if (row.tokens == 0) {
      out->skip = SkipReason::kEmpty;
    } else {
      out->tokens = row.tokens;
    }
  }
  // A plan read from the length column must be the plan of the tokens: a row whose
  // length disagrees with its list (or whose list holds a null id, which the length
  // cannot say) is an error whatever on_error says; a null length goes with a null list.
  Status CheckLength(const arrow::Array& lengths, int64_t i, const ListInfo& info,
                     const RowLocation& where) const {
    int64_t n = 0;
    const bool has = IntegerAt(lengths, i, &n);
    std::string what;
    if (!has && !info.null) {
      what = "is null, the token list of column '" + column_ + "' is not (" +
             std::to_string(info.length) + " tokens)";
    } else if (has && info.null) {
      what = "says " + std::to_string(n) + " tokens, the token list of column '" +
             column_ + "' is null";
    } else if (has && n != info.length) {
      what = "says " + std::to_string(n) + " tokens, the token list of column '" +
             column_ + "' holds " + std::to_string(info.length);
    } else if (has && info.has_null_values) {
      what = "says " + std::to_string(n) + " tokens, the token list of column '" +
             column_ + "' holds a null id";
    } else {
      return Status::OK();
    }
    return DataError(where.ToString(), "length column '" + length_column_ + "' (" +
                                           length_key_ + ") " + what +
                                           "; planning reads the length column alone, so "
                                           "it must hold each row's token count");
  }

  const std::string column_;
  const std::string length_column_;
  const std::string length_key_;
};

// ---------------------------------------------------------------------------------------
// Strings.

bool IsString(const arrow::DataType& t) {
  return t.id() == arrow::Type::STRING || t.id() == arrow::Type::LARGE_STRING ||
         t.id() == arrow::Type::STRING_VIEW;
}

std::string CheckString(const arrow::DataType& t) {
  return IsString(t) ? "" : "a string column";
}

// Row `i` of a string array; false if null.
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

// ---------------------------------------------------------------------------------------
// Tokenizing several rows in one call.

// The ids of the texts of several rows, from one EncodeBatch call: (*ids)[r][t] are the
// ids of texts[r][t]. When the call fails, each row is encoded on its own so that the
// error names its row: (*errors)[r] is a data error naming where[r] for a row that fails
// (every row gets a Cancelled status when the loader stops).
void EncodeRows(const Tokenizer& tok, const std::vector<std::vector<std::string_view>>& texts,
                bool document, const std::vector<const RowLocation*>& where,
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
      st = texts[r].empty() ? Status::OK() : tok.EncodeBatch(texts[r], document, &(*ids)[r]);
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

// ---------------------------------------------------------------------------------------
// Text column: tokenized as documents (BOS / EOS, or the tokenizer's post-processor).

class TextTransform : public Transform {
 public:
  TextTransform(std::string column, std::string key, std::shared_ptr<const Tokenizer> tok)
      : column_(std::move(column)), key_(std::move(key)), tok_(std::move(tok)) {}
  std::vector<ColumnSpec> columns() const override {
    return {{column_, key_, CheckString}};
  }
  int64_t EstimateBytes(const Columns& cols, int64_t i) const override {
    return StringBytes(*cols[0], i);  // ~4 bytes of text per 4-byte token
  }
  Status Apply(const Columns& cols, int64_t i, bool want_payload, const RowLocation& where,
               RowOutput* out) const override {
    Status st;
    ApplyBatch({BatchRow{&cols, i, where}}, want_payload, out, &st);
    return st;
  }
  int64_t batch_rows() const override { return tok_->batch_rows(); }
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
  void Cancel() const override { tok_->Cancel(); }

 private:
  const std::string column_;
  const std::string key_;
  const std::shared_ptr<const Tokenizer> tok_;
};

// ---------------------------------------------------------------------------------------
// Chat: prompt/response columns or a messages list. Template in docs/sources.md:
//   [BOS] for each message: ids(role + ":") ids(content) [EOS after an assistant turn]
// loss_mask is 1 on an assistant turn's content ids and its EOS, 0 elsewhere. BOS / EOS
// are the tokenizer's prefix() / suffix() (for Hugging Face, what its post-processor
// puts around a text). A batch of rows is encoded in one tokenizer call.

struct Turn {
  std::string_view role;
  std::string_view content;
};

class ChatTransform : public Transform {
 public:
  ChatTransform(ChatColumns chat, std::string key, std::shared_ptr<const Tokenizer> tok)
      : chat_(std::move(chat)), key_(std::move(key)), tok_(std::move(tok)) {}

  std::vector<ColumnSpec> columns() const override {
    if (!chat_.messages_column.empty()) {
      return {{chat_.messages_column, key_ + ".messages_column", CheckMessages}};
    }
    return {{chat_.prompt_column, key_ + ".prompt_column", CheckString},
            {chat_.response_column, key_ + ".response_column", CheckString}};
  }

  int64_t EstimateBytes(const Columns& cols, int64_t i) const override {
    if (!chat_.messages_column.empty()) {
      // The content bytes of the row's messages.
      const arrow::Array& a = *cols[0];
      if (a.IsNull(i)) return 0;
      int64_t begin = 0, len = 0;
      const arrow::StructArray* s = Structs(a, i, &begin, &len);
      int64_t bytes = 0;
      const auto content = s->GetFieldByName("content");
      for (int64_t k = 0; k < len; ++k) bytes += StringBytes(*content, begin + k);
      return bytes;
    }
    return StringBytes(*cols[0], i) + StringBytes(*cols[1], i);
  }

  Status Apply(const Columns& cols, int64_t i, bool want_payload, const RowLocation& where,
               RowOutput* out) const override {
    Status st;
    ApplyBatch({BatchRow{&cols, i, where}}, want_payload, out, &st);
    return st;
  }

  int64_t batch_rows() const override { return tok_->batch_rows(); }

  // The turns of each row are read first, then every turn's header and content of the
  // batch is encoded in one call, then each row's ids and loss mask are put together.
  void ApplyBatch(const std::vector<BatchRow>& rows, bool want_payload, RowOutput* out,
                  Status* status) const override {
    if (tok_->has_chat_template()) return ApplyTemplate(rows, want_payload, out, status);
    std::vector<std::vector<Turn>> turns;
    std::vector<std::vector<std::string_view>> texts;  // per row: header, content, ...
    std::vector<const RowLocation*> where;
    std::vector<size_t> which;
    std::vector<std::string> headers;  // "role:", kept alive for the encode
    std::vector<Turn> row_turns;
    for (size_t k = 0; k < rows.size(); ++k) {
      if (!ReadTurns(*rows[k].cols, rows[k].index, &row_turns, &out[k])) continue;
      which.push_back(k);
      where.push_back(&rows[k].where);
      turns.push_back(row_turns);
    }
    // Every header string first (the vector must not grow once views point into it).
    size_t n_headers = 0;
    for (const auto& row : turns) n_headers += row.size();
    headers.reserve(n_headers);
    for (const auto& row : turns) {
      texts.emplace_back();
      for (const Turn& t : row) {
        headers.emplace_back(t.role);
        headers.back() += ':';
        texts.back().push_back(headers.back());
        texts.back().push_back(t.content);  // empty: no ids
      }
    }
    std::vector<std::vector<std::vector<int32_t>>> ids;
    std::vector<Status> errors;
    EncodeRows(*tok_, texts, /*document=*/false, where, &ids, &errors);
    const auto& prefix = tok_->prefix();
    const auto& suffix = tok_->suffix();
    for (size_t r = 0; r < which.size(); ++r) {
      RowOutput& o = out[which[r]];
      status[which[r]] = errors[r];
      if (!errors[r].ok()) continue;
      auto payload = std::make_shared<Payload>();
      std::vector<int32_t> row(prefix.begin(), prefix.end());
      auto& mask = payload->loss_mask;
      for (size_t t = 0; t < turns[r].size(); ++t) {
        const bool trained = turns[r][t].role == "assistant";
        const auto& header = ids[r][2 * t];
        row.insert(row.end(), header.begin(), header.end());
        mask.resize(row.size(), 0);
        if (!turns[r][t].content.empty()) {
          const auto& content = ids[r][2 * t + 1];
          row.insert(row.end(), content.begin(), content.end());
        }
        if (trained) row.insert(row.end(), suffix.begin(), suffix.end());
        mask.resize(row.size(), trained ? 1 : 0);
      }
      o.tokens = static_cast<int64_t>(row.size());
      payload->tokens = std::move(row);
      if (want_payload) o.payload = std::move(payload);
    }
  }

  void Cancel() const override { tok_->Cancel(); }

 private:
  // The tokenizer's own chat template (Tokenizer::ApplyChatTemplate) for the batch's
  // rows; a batch that fails is done again row by row, so an error names its row.
  void ApplyTemplate(const std::vector<BatchRow>& rows, bool want_payload, RowOutput* out,
                     Status* status) const {
    std::vector<std::vector<ChatMessage>> chats;
    std::vector<size_t> which;
    std::vector<Turn> row_turns;
    for (size_t k = 0; k < rows.size(); ++k) {
      if (!ReadTurns(*rows[k].cols, rows[k].index, &row_turns, &out[k])) continue;
      which.push_back(k);
      chats.emplace_back();
      for (const Turn& t : row_turns) chats.back().push_back({t.role, t.content});
    }
    if (chats.empty()) return;
    std::vector<std::vector<int32_t>> ids;
    std::vector<std::vector<uint8_t>> masks;
    std::vector<std::string> refused;
    Status st = tok_->ApplyChatTemplate(chats, &ids, &masks, &refused);
    std::vector<Status> errors(chats.size());
    if (!st.ok() && chats.size() > 1 && !st.IsCancelled()) {
      ids.assign(chats.size(), {});
      masks.assign(chats.size(), {});
      refused.assign(chats.size(), {});
      for (size_t r = 0; r < chats.size(); ++r) {
        std::vector<std::vector<int32_t>> one_ids;
        std::vector<std::vector<uint8_t>> one_mask;
        std::vector<std::string> one_refused;
        errors[r] = tok_->ApplyChatTemplate({chats[r]}, &one_ids, &one_mask, &one_refused);
        if (errors[r].ok()) {
          ids[r] = std::move(one_ids.at(0));
          masks[r] = std::move(one_mask.at(0));
          refused[r] = std::move(one_refused.at(0));
        }
      }
    } else if (!st.ok()) {
      errors.assign(chats.size(), st);
    }
    for (size_t r = 0; r < which.size(); ++r) {
      if (!errors[r].ok()) {
        status[which[r]] = errors[r].IsCancelled()
                               ? errors[r]
                               : DataError(rows[which[r]].where.ToString(),
                                           "chat template: " + errors[r].message());
        continue;
      }
      RowOutput& o = out[which[r]];
      if (!refused[r].empty()) {  // bad data: follows on_error, like a null
        Null("chat template: " + refused[r], &o);
        continue;
      }
      auto payload = std::make_shared<Payload>();
      o.tokens = static_cast<int64_t>(ids[r].size());
      payload->tokens = std::move(ids[r]);
      payload->loss_mask = std::move(masks[r]);
      if (want_payload) o.payload = std::move(payload);
    }
  }

  // The turns of row `i`; false if the row has no sample (`out` says why).
  bool ReadTurns(const Columns& cols, int64_t i, std::vector<Turn>* turns,
                 RowOutput* out) const {
    turns->clear();
    if (!chat_.messages_column.empty()) {
      const arrow::Array& a = *cols[0];
      if (a.IsNull(i)) return Null("null column '" + chat_.messages_column + "'", out);
      int64_t begin = 0, len = 0;
      const arrow::StructArray* s = Structs(a, i, &begin, &len);
      const auto role = s->GetFieldByName("role");
      const auto content = s->GetFieldByName("content");
      for (int64_t k = 0; k < len; ++k) {
        Turn t;
        if (s->IsNull(begin + k) || !StringAt(*role, begin + k, &t.role) ||
            !StringAt(*content, begin + k, &t.content)) {
          return Null("null role or content in message " + std::to_string(k) +
                          " of column '" + chat_.messages_column + "'",
                      out);
        }
        turns->push_back(t);
      }
    } else {
      Turn prompt{"user", {}}, response{"assistant", {}};
      if (!StringAt(*cols[0], i, &prompt.content)) {
        return Null("null column '" + chat_.prompt_column + "'", out);
      }
      if (!StringAt(*cols[1], i, &response.content)) {
        return Null("null column '" + chat_.response_column + "'", out);
      }
      *turns = {prompt, response};
    }
    bool any = false;
    for (const auto& t : *turns) any = any || !t.content.empty();
    if (!any) {
      out->skip = SkipReason::kEmpty;
      return false;
    }
    return true;
  }

  static std::string CheckMessages(const arrow::DataType& t) {
    const char* expected = "list<struct<role: string, content: string>>";
    if (t.id() != arrow::Type::LIST && t.id() != arrow::Type::LARGE_LIST) return expected;
    const auto& item = *t.field(0)->type();
    if (item.id() != arrow::Type::STRUCT) return expected;
    const auto& st = static_cast<const arrow::StructType&>(item);
    const auto role = st.GetFieldByName("role");
    const auto content = st.GetFieldByName("content");
    if (!role || !content || !IsString(*role->type()) || !IsString(*content->type())) {
      return expected;
    }
    return "";
  }

  // The struct values of row `i` of a list<struct> array: [begin, begin + len).
  static const arrow::StructArray* Structs(const arrow::Array& a, int64_t i, int64_t* begin,
                                           int64_t* len) {
    if (a.type_id() == arrow::Type::LIST) {
      const auto& l = static_cast<const arrow::ListArray&>(a);
      *begin = l.value_offset(i);
      *len = l.value_length(i);
      return static_cast<const arrow::StructArray*>(l.values().get());
    }
    const auto& l = static_cast<const arrow::LargeListArray&>(a);
    *begin = l.value_offset(i);
    *len = l.value_length(i);
    return static_cast<const arrow::StructArray*>(l.values().get());
  }

  static bool Null(const std::string& what, RowOutput* out) {
    out->skip = SkipReason::kNull;
    out->null_what = what;
    return false;
  }

  const ChatColumns chat_;
  const std::string key_;
  const std::shared_ptr<const Tokenizer> tok_;
};

// ---------------------------------------------------------------------------------------
// Image + caption: [BOS] image_token_id x num_patches, ids(caption) [EOS]. loss_mask is 0
// on BOS and the placeholders, 1 on the caption and EOS. Apply reads only the image's
// header (the grid, hence the token count, and header-level skips, the same with or
// without a payload); Finish decodes the pixels (docs/sources.md, "Metadata first").

bool IsBinary(const arrow::DataType& t) {
  return t.id() == arrow::Type::BINARY || t.id() == arrow::Type::LARGE_BINARY ||
         t.id() == arrow::Type::BINARY_VIEW;
}

// Row `i` of a binary array; false if null.
bool BinaryAt(const arrow::Array& a, int64_t i, std::string_view* out) {
  if (a.IsNull(i)) return false;
  switch (a.type_id()) {
    case arrow::Type::BINARY:
      *out = static_cast<const arrow::BinaryArray&>(a).GetView(i);
      break;
    case arrow::Type::LARGE_BINARY:
      *out = static_cast<const arrow::LargeBinaryArray&>(a).GetView(i);
      break;
    default:
      *out = static_cast<const arrow::BinaryViewArray&>(a).GetView(i);
      break;
  }
  return true;
}

bool IsImageColumn(const arrow::DataType& t) {
  if (IsBinary(t)) return true;
  const auto id = t.id();
  return (id == arrow::Type::LIST || id == arrow::Type::LARGE_LIST) &&
         IsBinary(*t.field(0)->type());
}

// The encoded images of row `i`: one for a binary column, each element of a list<binary>
// column in order. False if the row (or an element of its list) is null.
bool ImagesAt(const arrow::Array& a, int64_t i, std::vector<std::string_view>* out) {
  out->clear();
  if (a.IsNull(i)) return false;
  if (IsBinary(*a.type())) {
    out->emplace_back();
    return BinaryAt(a, i, &out->back());
  }
  int64_t begin = 0, end = 0;
  std::shared_ptr<arrow::Array> values;
  if (a.type_id() == arrow::Type::LIST) {
    const auto& list = static_cast<const arrow::ListArray&>(a);
    begin = list.value_offset(i);
    end = list.value_offset(i + 1);
    values = list.values();
  } else {
    const auto& list = static_cast<const arrow::LargeListArray&>(a);
    begin = list.value_offset(i);
    end = list.value_offset(i + 1);
    values = list.values();
  }
  for (int64_t k = begin; k < end; ++k) {
    out->emplace_back();
    if (!BinaryAt(*values, k, &out->back())) return false;
  }
  return true;
}

class ImageCaptionTransform : public Transform {
 public:
  ImageCaptionTransform(const SourceConfig& s, std::string key,
                        std::shared_ptr<const Tokenizer> tok)
      : image_column_(s.image_column),
        text_column_(s.text_column),
        key_(std::move(key)),
        image_token_id_(static_cast<int32_t>(s.image_token_id)),
        options_{s.image_patch_size, s.image_max_pixels},
        tok_(std::move(tok)) {}

  std::vector<ColumnSpec> columns() const override {
    auto check_binary = [](const arrow::DataType& t) -> std::string {
      return IsImageColumn(t) ? ""
                              : "a binary column (encoded JPEG / PNG / WebP bytes) or a "
                                "list of them";
    };
    return {{image_column_, key_ + ".image_column", check_binary},
            {text_column_, key_ + ".text_column", CheckString}};
  }

  int64_t EstimateBytes(const Columns& cols, int64_t i) const override {
    std::vector<std::string_view> images;
    ImagesAt(*cols[0], i, &images);
    int64_t bytes = StringBytes(*cols[1], i);
    for (std::string_view image : images) {
      bytes += std::min(int64_t(image.size()) * 64, options_.max_pixels * 12);
    }
    return bytes;
  }

  Status Apply(const Columns& cols, int64_t i, bool want_payload, const RowLocation& where,
               RowOutput* out) const override {
    std::vector<std::string_view> images;
    std::string_view caption;
    if (!ImagesAt(*cols[0], i, &images)) {
      return Null("null column '" + image_column_ + "'", out);
    }
    if (!StringAt(*cols[1], i, &caption)) {
      return Null("null column '" + text_column_ + "'", out);
    }
    if (images.empty() ||
        std::any_of(images.begin(), images.end(), [](auto im) { return im.empty(); })) {
      out->skip = SkipReason::kEmpty;
      return Status::OK();
    }
    // Metadata first: the headers give the grids, hence the token count; the pixels are
    // decoded by Finish, or never when only metadata is read.
    std::vector<ImageGrid> grids;
    for (size_t k = 0; k < images.size(); ++k) {
      Result<ImageGrid> grid = ReadImageGrid(images[k], options_);
      if (!grid.ok()) {
        // Bad bytes follow on_error like a null: fail naming the row, or a counted skip.
        return Null(grid.status().message() + " (column '" + image_column_ + "'" +
                        (images.size() > 1 ? ", image " + std::to_string(k) : "") + ")",
                    out);
      }
      grids.push_back(*grid);
    }
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
    std::vector<int64_t> starts;
    ids = tok_->prefix();
    int64_t n = 0;  // placeholders of every image, leading the document
    for (const ImageGrid& grid : grids) {
      starts.push_back(static_cast<int64_t>(ids.size()));
      ids.insert(ids.end(), size_t(grid.num_patches()), image_token_id_);
      n += grid.num_patches();
    }
    mask.resize(ids.size(), 0);
    if (!caption.empty()) {
      const Status st = tok_->Encode(caption, &ids);
      if (!st.ok()) return DataError(where.ToString(), st.message());
    }
    ids.insert(ids.end(), tok_->suffix().begin(), tok_->suffix().end());
    mask.resize(ids.size(), 1);
    out->tokens = static_cast<int64_t>(ids.size());
    out->image_tokens = n;
    if (want_payload) {
      auto payload = std::make_shared<Payload>();
      payload->tokens = std::move(ids);
      payload->loss_mask = std::move(mask);
      payload->image_start = std::move(starts);
      for (const ImageGrid& grid : grids) {
        ImagePatches patches;  // pixels: Finish
        patches.grid_h = grid.grid_h;
        patches.grid_w = grid.grid_w;
        payload->images.push_back(std::move(patches));
      }
      out->payload_bytes = payload->bytes() + n * PatchValues() * int64_t{sizeof(float)};
      out->payload = std::move(payload);
      out->deferred = true;
    }
    return Status::OK();
  }

  bool defers() const override { return true; }
  void Cancel() const override { tok_->Cancel(); }

  Status Finish(const Columns& cols, int64_t i, const RowLocation& where,
                Payload* payload) const override {
    std::vector<std::string_view> images;
    ImagesAt(*cols[0], i, &images);  // not null, as many as Apply saw
    for (size_t k = 0; k < payload->images.size(); ++k) {
      ImagePatches& im = payload->images[k];
      Result<ImagePatches> patches =
          DecodeImageAs(images[k], options_, ImageGrid{im.grid_h, im.grid_w});
      if (patches.ok()) {
        im = std::move(*patches);
        continue;
      }
      BlankImagePayload(options_, payload);
      return DataError(where.ToString(), ImageErrorMessage(patches.status(), image_column_,
                                                           k, images.size()));
    }
    return Status::OK();
  }

  void EncodedImages(const Columns& cols, int64_t i,
                     std::vector<std::string_view>* out) const override {
    ImagesAt(*cols[0], i, out);
  }

 private:
  static Status Null(const std::string& what, RowOutput* out) {
    out->skip = SkipReason::kNull;
    out->null_what = what;
    return Status::OK();
  }

  const std::string image_column_;
  const std::string text_column_;
  const std::string key_;
  const int32_t image_token_id_;
  int64_t PatchValues() const { return 3 * options_.patch_size * options_.patch_size; }

  const ImageOptions options_;
  const std::shared_ptr<const Tokenizer> tok_;
};

}  // namespace

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
    return std::make_unique<TokenColumnTransform>(s.tokens_column, s.length_column,
                                                  key + ".length_column");
  }
  const TokenizerConfig& tc = config.TokenizerFor(size_t(source_index));
  if (tc.model.empty()) {
    return ConfigError(key, "text_column and chat need a tokenizer (root-level or the "
                            "source's own)");
  }
  ARROW_ASSIGN_OR_RAISE(auto tok, Tokenizer::Make(tc));
  if (!s.image_column.empty()) {
    return std::make_unique<ImageCaptionTransform>(s, key, std::move(tok));
  }
  if (!s.text_column.empty()) {
    return std::make_unique<TextTransform>(s.text_column, key + ".text_column",
                                           std::move(tok));
  }
  return std::make_unique<ChatTransform>(s.chat, key + ".chat", std::move(tok));
}

}  // namespace braid
