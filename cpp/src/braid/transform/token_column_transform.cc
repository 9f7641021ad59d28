// The token column transform (transform.h: tokens_column): list<int32|int64> token ids,
// passed through. int32 ids are not copied: the payload views the column's values
// buffer (shared by the row group's rows, kept alive by the payload); int64 ids are
// range-checked and narrowed into the payload's own vector. With a length column, each
// list's length is checked against it.
//
// Rows come in batches (batch_rows()): a row costs a few dozen nanoseconds, so the
// loader's per-call work would otherwise outweigh it, and the payloads of a batch's
// int32 rows of one chunk of columns (views into that chunk, holding nothing of their
// own) share one allocation, freed with the last of them, instead of one each. One
// block per chunk, not per batch: a payload kept long (a long document's pieces in later
// plans) holds the chunk its view already holds, not the other chunks of its batch.
//
// Thread-safe: Apply is const and keeps no state.
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <arrow/api.h>

#include "braid/transform/transform_internal.h"

namespace braid::internal {
namespace {

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
Result<TokenSpan> RowTokens(const arrow::Array& array, int64_t i,
                            const RowLocation& where) {
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
  Status Apply(const Columns& cols, int64_t i, bool want_payload,
               const RowLocation& where, RowOutput* out) const override {
    ARROW_RETURN_NOT_OK(ApplyMeta(cols, i, where, out));
    if (out->skip == SkipReason::kNone && want_payload) {
      auto payload = std::make_shared<Payload>();
      ARROW_ASSIGN_OR_RAISE(payload->tokens, RowTokens(*cols[0], i, where));
      out->payload = std::move(payload);
    }
    return Status::OK();
  }
  int64_t batch_rows() const override { return kBatchRows; }
  void ApplyBatch(const std::vector<BatchRow>& rows, bool want_payload, RowOutput* out,
                  Status* status) const override {
    // One block per chunk of columns the batch's rows come from (a few: the rows of a
    // shuffle window), sized by its rows here, each filled in row order.
    struct Chunk {
      const Columns* cols;
      size_t rows = 0, used = 0;
      std::shared_ptr<PayloadBlock> block;
    };
    std::vector<Chunk> chunks;
    auto chunk_of = [&](const Columns* cols) -> Chunk& {
      for (Chunk& c : chunks) {
        if (c.cols == cols) return c;
      }
      return chunks.emplace_back(Chunk{cols});
    };
    if (want_payload) {
      for (const BatchRow& r : rows) ++chunk_of(r.cols).rows;
    }
    for (size_t k = 0; k < rows.size(); ++k) {
      const BatchRow& r = rows[k];
      status[k] = ApplyMeta(*r.cols, r.index, r.where, &out[k]);
      if (!status[k].ok() || out[k].skip != SkipReason::kNone || !want_payload) continue;
      auto ids = RowTokens(*(*r.cols)[0], r.index, r.where);
      if (!ids.ok()) {
        status[k] = ids.status();
        continue;
      }
      if (!ids->is_view()) {  // narrowed ids: owned, so freed with their own row
        out[k].payload = std::make_shared<Payload>();
        out[k].payload->tokens = std::move(*ids);
        continue;
      }
      Chunk& c = chunk_of(r.cols);
      if (c.block == nullptr) {
        c.block = std::make_shared<PayloadBlock>();
        c.block->payloads.resize(c.rows);
      }
      Payload* payload = &c.block->payloads[c.used++];
      payload->tokens = std::move(*ids);
      out[k].payload = std::shared_ptr<Payload>(c.block, payload);
    }
  }
  bool metadata_from_lengths() const override { return true; }
  int64_t ApplyLength(const RowLength& row, RowOutput* out) const override {
    FromLength(row, out);
    return (row.null ? 0 : row.tokens) * int64_t{sizeof(int32_t)};
  }

 private:
  static constexpr int64_t kBatchRows = 1024;

  // The payloads of one ApplyBatch call, in one allocation; each row's payload is an
  // aliasing pointer into it (the block goes with the last of them).
  struct PayloadBlock {
    std::vector<Payload> payloads;
  };

  // Apply's metadata (what FromLength says), and the length column's check.
  Status ApplyMeta(const Columns& cols, int64_t i, const RowLocation& where,
                   RowOutput* out) const {
    const ListInfo info = InfoOf(*cols[0], i);
    if (cols.size() > 1) ARROW_RETURN_NOT_OK(CheckLength(*cols[1], i, info, where));
    FromLength(RowLength{info.length, info.null, info.has_null_values}, out);
    return Status::OK();
  }

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

}  // namespace

std::unique_ptr<Transform> MakeTokenColumnTransform(std::string column,
                                                    std::string length_column,
                                                    std::string length_key) {
  return std::make_unique<TokenColumnTransform>(
      std::move(column), std::move(length_column), std::move(length_key));
}

}  // namespace braid::internal
