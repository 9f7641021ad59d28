#include "braid/transform/user_transform.h"

#include <limits>
#include <mutex>

#include <arrow/api.h>

#include "braid/transform/transform.h"

namespace braid {
namespace {

std::mutex& FactoryMutex() {
  static std::mutex mu;
  return mu;
}

RowCallbackFactory& Factory() {
  static RowCallbackFactory factory;  // GUARDED_BY(FactoryMutex())
  return factory;
}

// "" if rows of `t` convert to RowValues, else what is accepted.
std::string CheckUserType(const arrow::DataType& t) {
  const char* expected =
      "a column of null, bool, integer, float, string, binary, list or struct type";
  switch (t.id()) {
    case arrow::Type::NA:
    case arrow::Type::BOOL:
    case arrow::Type::INT8:
    case arrow::Type::INT16:
    case arrow::Type::INT32:
    case arrow::Type::INT64:
    case arrow::Type::UINT8:
    case arrow::Type::UINT16:
    case arrow::Type::UINT32:
    case arrow::Type::UINT64:
    case arrow::Type::FLOAT:
    case arrow::Type::DOUBLE:
    case arrow::Type::STRING:
    case arrow::Type::LARGE_STRING:
    case arrow::Type::STRING_VIEW:
    case arrow::Type::BINARY:
    case arrow::Type::LARGE_BINARY:
    case arrow::Type::BINARY_VIEW:
    case arrow::Type::FIXED_SIZE_BINARY:
      return "";
    case arrow::Type::LIST:
    case arrow::Type::LARGE_LIST:
    case arrow::Type::FIXED_SIZE_LIST:
    case arrow::Type::STRUCT:
      for (const auto& field : t.fields()) {
        if (!CheckUserType(*field->type()).empty()) return expected;
      }
      return "";
    default:
      return expected;
  }
}

template <typename ArrayT>
void ListItems(const arrow::Array& a, int64_t i, std::shared_ptr<arrow::Array>* values,
               int64_t* begin, int64_t* len) {
  const auto& list = static_cast<const ArrayT&>(a);
  *values = list.values();
  *begin = list.value_offset(i);
  *len = list.value_length(i);
}

// Row `i` of `a` as a RowValue. REQUIRES: CheckUserType(*a.type()) is "".
Status ToRowValue(const arrow::Array& a, int64_t i, RowValue* out) {
  using Kind = RowValue::Kind;
  if (a.IsNull(i)) {
    out->kind = Kind::kNull;
    return Status::OK();
  }
  switch (a.type_id()) {
    case arrow::Type::NA:
      out->kind = Kind::kNull;
      return Status::OK();
    case arrow::Type::BOOL:
      out->kind = Kind::kBool;
      out->boolean = static_cast<const arrow::BooleanArray&>(a).Value(i);
      return Status::OK();
#define BRAID_INT_CASE(TYPE, ARRAY)                                   \
  case arrow::Type::TYPE:                                             \
    out->kind = Kind::kInt;                                           \
    out->integer = static_cast<int64_t>(                              \
        static_cast<const arrow::ARRAY&>(a).Value(i));                \
    return Status::OK();
      BRAID_INT_CASE(INT8, Int8Array)
      BRAID_INT_CASE(INT16, Int16Array)
      BRAID_INT_CASE(INT32, Int32Array)
      BRAID_INT_CASE(INT64, Int64Array)
      BRAID_INT_CASE(UINT8, UInt8Array)
      BRAID_INT_CASE(UINT16, UInt16Array)
      BRAID_INT_CASE(UINT32, UInt32Array)
#undef BRAID_INT_CASE
    case arrow::Type::UINT64: {
      const uint64_t v = static_cast<const arrow::UInt64Array&>(a).Value(i);
      if (v > uint64_t(std::numeric_limits<int64_t>::max())) {
        return Status::Invalid("uint64 value ", v, " does not fit int64");
      }
      out->kind = Kind::kInt;
      out->integer = static_cast<int64_t>(v);
      return Status::OK();
    }
    case arrow::Type::FLOAT:
      out->kind = Kind::kFloat;
      out->real = static_cast<const arrow::FloatArray&>(a).Value(i);
      return Status::OK();
    case arrow::Type::DOUBLE:
      out->kind = Kind::kFloat;
      out->real = static_cast<const arrow::DoubleArray&>(a).Value(i);
      return Status::OK();
    case arrow::Type::STRING:
    case arrow::Type::LARGE_STRING:
    case arrow::Type::STRING_VIEW:
    case arrow::Type::BINARY:
    case arrow::Type::LARGE_BINARY:
    case arrow::Type::BINARY_VIEW:
    case arrow::Type::FIXED_SIZE_BINARY: {
      const auto id = a.type_id();
      const bool text = id == arrow::Type::STRING || id == arrow::Type::LARGE_STRING ||
                        id == arrow::Type::STRING_VIEW;
      out->kind = text ? Kind::kString : Kind::kBytes;
      if (id == arrow::Type::STRING || id == arrow::Type::BINARY) {
        out->bytes = static_cast<const arrow::BinaryArray&>(a).GetView(i);
      } else if (id == arrow::Type::LARGE_STRING || id == arrow::Type::LARGE_BINARY) {
        out->bytes = static_cast<const arrow::LargeBinaryArray&>(a).GetView(i);
      } else if (id == arrow::Type::FIXED_SIZE_BINARY) {
        out->bytes = static_cast<const arrow::FixedSizeBinaryArray&>(a).GetView(i);
      } else {
        out->bytes = static_cast<const arrow::BinaryViewArray&>(a).GetView(i);
      }
      return Status::OK();
    }
    case arrow::Type::LIST:
    case arrow::Type::LARGE_LIST:
    case arrow::Type::FIXED_SIZE_LIST: {
      std::shared_ptr<arrow::Array> values;
      int64_t begin = 0, len = 0;
      if (a.type_id() == arrow::Type::LIST) {
        ListItems<arrow::ListArray>(a, i, &values, &begin, &len);
      } else if (a.type_id() == arrow::Type::LARGE_LIST) {
        ListItems<arrow::LargeListArray>(a, i, &values, &begin, &len);
      } else {
        ListItems<arrow::FixedSizeListArray>(a, i, &values, &begin, &len);
      }
      out->kind = Kind::kList;
      out->items.resize(static_cast<size_t>(len));
      for (int64_t k = 0; k < len; ++k) {
        ARROW_RETURN_NOT_OK(ToRowValue(*values, begin + k, &out->items[size_t(k)]));
      }
      return Status::OK();
    }
    case arrow::Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(a);
      const auto& type = *s.struct_type();
      out->kind = Kind::kStruct;
      out->items.resize(static_cast<size_t>(type.num_fields()));
      out->field_names.resize(static_cast<size_t>(type.num_fields()));
      for (int f = 0; f < type.num_fields(); ++f) {
        out->field_names[size_t(f)] = type.field(f)->name();
        // field(f) applies the struct's offset; its own index is then `i`.
        ARROW_RETURN_NOT_OK(ToRowValue(*s.field(f), i, &out->items[size_t(f)]));
      }
      return Status::OK();
    }
    default:
      return Status::Invalid("unsupported column type ", a.type()->ToString());
  }
}

// Rough payload bytes of row `i` of `a`: text / binary bytes, 4 per list element.
int64_t RoughBytes(const arrow::Array& a, int64_t i) {
  if (a.IsNull(i)) return 0;
  switch (a.type_id()) {
    case arrow::Type::STRING:
    case arrow::Type::BINARY:
      return static_cast<const arrow::BinaryArray&>(a).value_length(i);
    case arrow::Type::LARGE_STRING:
    case arrow::Type::LARGE_BINARY:
      return static_cast<const arrow::LargeBinaryArray&>(a).value_length(i);
    case arrow::Type::LIST:
      return 4 * int64_t{static_cast<const arrow::ListArray&>(a).value_length(i)};
    case arrow::Type::LARGE_LIST:
      return 4 * static_cast<const arrow::LargeListArray&>(a).value_length(i);
    default:
      return 8;
  }
}

// Rows per CallRows: one GIL hold per chunk of a loader batch (256 rows per worker). Row
// by row, 64 spread a batch over the workers for functions that release the GIL; batched,
// 256 give the function a batch worth vectorizing.
constexpr int64_t kRowChunk = 64;
constexpr int64_t kBatchedChunk = 256;

class UserTransform : public Transform {
 public:
  UserTransform(const SourceConfig& s, std::string key,
                std::shared_ptr<const RowCallback> callback)
      : source_name_(s.name),
        spec_(s.user_transform.python),
        key_(std::move(key)),
        columns_(s.user_transform.columns),
        batched_(s.user_transform.batched),
        callback_(std::move(callback)) {}

  std::vector<ColumnSpec> columns() const override {
    std::vector<ColumnSpec> specs;
    for (size_t c = 0; c < columns_.size(); ++c) {
      ColumnSpec spec{columns_[c], key_ + ".columns[" + std::to_string(c) + "]",
                      CheckUserType};
      spec.any_type = true;
      specs.push_back(std::move(spec));
    }
    return specs;
  }

  int64_t EstimateBytes(const Columns& cols, int64_t i) const override {
    int64_t bytes = 0;
    for (const auto& col : cols) bytes += RoughBytes(*col, i);
    return bytes;
  }

  Status Apply(const Columns& cols, int64_t i, bool want_payload,
               const RowLocation& where, RowOutput* out) const override {
    Status st;
    ApplyBatch({BatchRow{&cols, i, where}}, want_payload, out, &st);
    return st;
  }

  int64_t batch_rows() const override { return batched_ ? kBatchedChunk : kRowChunk; }

  void ApplyBatch(const std::vector<BatchRow>& rows, bool want_payload, RowOutput* out,
                  Status* status) const override {
    std::vector<std::vector<RowValue>> values;  // the rows that converted
    std::vector<size_t> which;                  // their indices in `rows`
    values.reserve(rows.size());
    which.reserve(rows.size());
    for (size_t k = 0; k < rows.size(); ++k) {
      const Columns& cols = *rows[k].cols;
      std::vector<RowValue> row(cols.size());
      Status st;
      for (size_t c = 0; c < cols.size() && st.ok(); ++c) {
        st = ToRowValue(*cols[c], rows[k].index, &row[c]);
        if (!st.ok()) Fail("column '" + columns_[c] + "': " + st.message(), &out[k]);
      }
      if (!st.ok()) continue;
      values.push_back(std::move(row));
      which.push_back(k);
    }
    if (values.empty()) return;
    const size_t n = values.size();
    std::vector<RowCallbackResult> results(n);
    std::vector<Status> row_status(n);
    Status st = callback_->CallRows(values, batched_, results.data(), row_status.data());
    if (!st.ok() && !st.IsCancelled()) {
      // The batch failed as a whole: each row alone, so the error names its row.
      for (size_t r = 0; r < n && !st.IsCancelled(); ++r) {
        results[r] = RowCallbackResult{};
        const std::vector<std::vector<RowValue>> one{values[r]};
        const Status alone =
            callback_->CallRows(one, batched_, &results[r], &row_status[r]);
        if (alone.IsCancelled()) st = alone;
        if (!alone.ok()) row_status[r] = alone;
      }
    }
    if (st.IsCancelled()) {  // the loader is stopping
      for (size_t k : which) status[k] = st;
      return;
    }
    for (size_t r = 0; r < n; ++r) {
      status[which[r]] =
          Finish(row_status[r], std::move(results[r]), want_payload, &out[which[r]]);
    }
  }

  void Cancel() const override { callback_->Cancel(); }

 private:
  // Row `out` from the function's result (or its failure).
  Status Finish(const Status& called, RowCallbackResult result, bool want_payload,
                RowOutput* out) const {
    if (called.IsCancelled()) return called;
    if (!called.ok()) return Fail(called.message(), out);
    if (result.none || result.tokens.empty()) {
      out->skip = SkipReason::kEmpty;
      out->null_what = result.none ? "the transform returned None"
                                   : "the transform returned no tokens";
      return Status::OK();
    }
    const size_t n = result.tokens.size();
    if (!result.loss_mask.empty() && result.loss_mask.size() != n) {
      return Fail("loss_mask has " + std::to_string(result.loss_mask.size()) +
                      " values for " + std::to_string(n) + " tokens",
                  out);
    }
    for (int32_t id : result.tokens) {
      if (id < 0) return Fail("token id " + std::to_string(id) + " is negative", out);
    }
    out->tokens = static_cast<int64_t>(n);
    if (want_payload) {
      auto payload = std::make_shared<Payload>();
      payload->tokens = std::move(result.tokens);
      for (uint8_t& m : result.loss_mask) m = m != 0 ? 1 : 0;
      payload->loss_mask = std::move(result.loss_mask);
      out->payload = std::move(payload);
    }
    return Status::OK();
  }

  // A failed row follows on_error: the loader fails naming file, row group and row, or
  // counts a skip.
  Status Fail(const std::string& what, RowOutput* out) const {
    out->skip = SkipReason::kError;
    out->null_what = "source '" + source_name_ + "': transform " + key_ + ".python ('" +
                     spec_ + "'" + (batched_ ? ", batched" : "") + ") failed: " + what;
    return Status::OK();
  }

  const std::string source_name_;
  const std::string spec_;
  const std::string key_;  // "sources[i].transform"
  const std::vector<std::string> columns_;
  const bool batched_;
  const std::shared_ptr<const RowCallback> callback_;
};

}  // namespace

Status RowCallback::CallRows(const std::vector<std::vector<RowValue>>& rows,
                             bool /*batched*/, RowCallbackResult* out,
                             Status* row_status) const {
  for (size_t k = 0; k < rows.size(); ++k) {
    row_status[k] = Call(rows[k], &out[k]);
    if (row_status[k].IsCancelled()) return row_status[k];
  }
  return Status::OK();
}

void SetRowCallbackFactory(RowCallbackFactory factory) {
  std::lock_guard<std::mutex> lock(FactoryMutex());
  Factory() = std::move(factory);
}

Result<std::shared_ptr<const RowCallback>> MakeRowCallback(const std::string& spec,
                                                           const std::string& key) {
  RowCallbackFactory factory;
  {
    std::lock_guard<std::mutex> lock(FactoryMutex());
    factory = Factory();
  }
  if (!factory) {
    return ConfigError(key, "no user transform runtime is installed (import braid in "
                            "Python, or call SetRowCallbackFactory from C++)");
  }
  // The factory runs outside the lock: it may import a module, which may take a while.
  ARROW_ASSIGN_OR_RAISE(auto callback, factory(spec, key));
  if (!callback) return ConfigError(key, "'" + spec + "' made no callback");
  return callback;
}

std::unique_ptr<Transform> MakeUserTransform(
    const Config& config, int32_t source_index,
    std::shared_ptr<const RowCallback> callback) {
  const SourceConfig& s = config.sources[static_cast<size_t>(source_index)];
  return std::make_unique<UserTransform>(
      s, "sources[" + std::to_string(source_index) + "].transform", std::move(callback));
}

}  // namespace braid
