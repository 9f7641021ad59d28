// The chat transform (transform.h: chat): prompt/response columns or a messages list.
// Template in docs/sources.md:
//   [BOS] for each message: ids(role + ":") ids(content) [EOS after an assistant turn]
// loss_mask is 1 on an assistant turn's content ids and its EOS, 0 elsewhere. BOS / EOS
// are the tokenizer's prefix() / suffix() (for Hugging Face, what its post-processor
// puts around a text). A batch of rows is encoded in one tokenizer call. A Hugging Face
// tokenizer with a chat template of its own renders the chats with it instead
// (Tokenizer::ApplyChatTemplate).
//
// Thread-safe: Apply and ApplyBatch are const; the tokenizer is thread-safe.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <arrow/api.h>

#include "braid/transform/transform_internal.h"

namespace braid::internal {
namespace {

struct Turn {
  std::string_view role;
  std::string_view content;
};

// A ShareGPT message's `from` as the role the templates know: `human` is the user, `gpt`
// the assistant; any other (`system`, `tool`, ...) is its own.
std::string_view ShareGptRole(std::string_view from) {
  if (from == "human") return "user";
  if (from == "gpt") return "assistant";
  return from;
}

// The fields of a message struct: {role, content}, or ShareGPT's {from, value}; a JSON
// field may hold either (it is read with all four).
struct MessageFields {
  std::shared_ptr<arrow::Array> role, content, from, value;
  explicit MessageFields(const arrow::StructArray& s)
      : role(s.GetFieldByName("role")),
        content(s.GetFieldByName("content")),
        from(s.GetFieldByName("from")),
        value(s.GetFieldByName("value")) {}
  // Message k's turn; false if neither pair holds it.
  bool At(int64_t k, Turn* t) const {
    if (role && content && StringAt(*role, k, &t->role)) {
      return StringAt(*content, k, &t->content);
    }
    if (from && value && StringAt(*from, k, &t->role)) {
      t->role = ShareGptRole(t->role);
      return StringAt(*value, k, &t->content);
    }
    return false;
  }
  int64_t Bytes(int64_t k) const {
    if (role && content && role->IsValid(k)) return StringBytes(*content, k);
    return value ? StringBytes(*value, k) : 0;
  }
};

class ChatTransform : public TokenizedTransform {
 public:
  ChatTransform(ChatColumns chat, std::string key, std::shared_ptr<const Tokenizer> tok)
      : TokenizedTransform(std::move(tok)),
        chat_(std::move(chat)),
        key_(std::move(key)) {}

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
      const MessageFields fields(*Structs(a, i, &begin, &len));
      int64_t bytes = 0;
      for (int64_t k = 0; k < len; ++k) bytes += fields.Bytes(begin + k);
      return bytes;
    }
    return StringBytes(*cols[0], i) + StringBytes(*cols[1], i);
  }

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
        errors[r] =
            tok_->ApplyChatTemplate({chats[r]}, &one_ids, &one_mask, &one_refused);
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
      const MessageFields fields(*s);
      for (int64_t k = 0; k < len; ++k) {
        Turn t;
        if (s->IsNull(begin + k) || !fields.At(begin + k, &t)) {
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
    const char* expected =
        "list<struct<role: string, content: string>> (or ShareGPT's {from, value})";
    if (t.id() != arrow::Type::LIST && t.id() != arrow::Type::LARGE_LIST) return expected;
    const auto& item = *t.field(0)->type();
    if (item.id() != arrow::Type::STRUCT) return expected;
    const auto& st = static_cast<const arrow::StructType&>(item);
    auto pair = [&](const char* a, const char* b) {
      const auto x = st.GetFieldByName(a), y = st.GetFieldByName(b);
      return x && y && IsString(*x->type()) && IsString(*y->type());
    };
    return pair("role", "content") || pair("from", "value") ? "" : expected;
  }

  // The struct values of row `i` of a list<struct> array: [begin, begin + len).
  static const arrow::StructArray* Structs(const arrow::Array& a, int64_t i,
                                           int64_t* begin, int64_t* len) {
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
};

}  // namespace

std::unique_ptr<Transform> MakeChatTransform(ChatColumns chat, std::string key,
                                             std::shared_ptr<const Tokenizer> tok) {
  return std::make_unique<ChatTransform>(std::move(chat), std::move(key), std::move(tok));
}

}  // namespace braid::internal
