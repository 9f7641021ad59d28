#include "braid/transform/user_transform.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <utility>

#include "braid/source/source_loader.h"
#include "braid/transform/transform.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::HasSubstr;

// A C++ stand-in for a Python function over (text, weight): the tokens are the text's
// bytes; loss_mask is 1 on bytes after a '|'; "drop" returns no sample; a text containing
// "bad" fails; `weight` (an int) is appended as a last token.
class BytesCallback : public RowCallback {
 public:
  Status Call(const std::vector<RowValue>& row, RowCallbackResult* out) const override {
    calls.fetch_add(1);
    if (row.size() != 2) return Status::Invalid("expected 2 columns");
    if (row[0].kind == RowValue::Kind::kNull) return Status::Invalid("TypeError: null");
    if (row[0].kind != RowValue::Kind::kString || row[1].kind != RowValue::Kind::kInt) {
      return Status::Invalid("wrong kinds");
    }
    const std::string_view text = row[0].bytes;
    if (text == "drop") {
      out->none = true;
      return Status::OK();
    }
    if (text.find("bad") != std::string_view::npos) {
      return Status::Invalid("ValueError: cannot use '", text, "'");
    }
    bool trained = false;
    for (char c : text) {
      out->tokens.push_back(static_cast<unsigned char>(c));
      out->loss_mask.push_back(trained ? 1 : 0);
      trained = trained || c == '|';
    }
    out->tokens.push_back(static_cast<int32_t>(row[1].integer));
    out->loss_mask.push_back(1);
    return Status::OK();
  }
  mutable std::atomic<int64_t> calls{0};
};

// BytesCallback with a batch form: a batch that holds a text containing "boom" fails as a
// whole (as a Python function that raises does), and fails alone too; other batches give
// each row BytesCallback's result. Records every CallRows (batched, rows).
class BatchCallback : public BytesCallback {
 public:
  Status CallRows(const std::vector<std::vector<RowValue>>& rows, bool batched,
                  RowCallbackResult* out, Status* row_status) const override {
    {
      std::lock_guard<std::mutex> lock(mu);
      entries.emplace_back(batched, rows.size());
    }
    if (batched) {
      for (const auto& row : rows) {
        if (row[0].kind == RowValue::Kind::kString &&
            row[0].bytes.find("boom") != std::string_view::npos) {
          return Status::Invalid(rows.size() == 1 ? "ValueError: boom alone"
                                                  : "RuntimeError: the batch failed");
        }
      }
    }
    return RowCallback::CallRows(rows, batched, out, row_status);
  }
  std::vector<std::pair<bool, size_t>> Entries() const {
    std::lock_guard<std::mutex> lock(mu);
    return entries;
  }
  mutable std::mutex mu;
  mutable std::vector<std::pair<bool, size_t>> entries;  // GUARDED_BY(mu)
};

// Writes columns text (string) and weight (int64) in row groups of 4.
Status WriteRows(const std::string& path, const std::vector<std::string>& texts,
                 int64_t row_group_rows = 4) {
  arrow::StringBuilder text;
  arrow::Int64Builder weight;
  for (size_t i = 0; i < texts.size(); ++i) {
    ARROW_RETURN_NOT_OK(texts[i] == "<null>" ? text.AppendNull() : text.Append(texts[i]));
    ARROW_RETURN_NOT_OK(weight.Append(int64_t(i) + 1000));
  }
  ARROW_ASSIGN_OR_RAISE(auto text_array, text.Finish());
  ARROW_ASSIGN_OR_RAISE(auto weight_array, weight.Finish());
  auto table = arrow::Table::Make(
      arrow::schema({arrow::field("text", arrow::utf8()),
                     arrow::field("weight", arrow::int64())}),
      {text_array, weight_array});
  ARROW_ASSIGN_OR_RAISE(auto out, arrow::io::FileOutputStream::Open(path));
  ARROW_RETURN_NOT_OK(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(),
                                                 out, row_group_rows));
  return out->Close();
}

class UserTransformTest : public ::testing::Test {
 protected:
  void SetUp() override {
    callback_ = std::make_shared<BatchCallback>();
    SetRowCallbackFactory([cb = callback_](const std::string& spec,
                                           const std::string& key)
                              -> Result<std::shared_ptr<const RowCallback>> {
      if (spec != "tests:bytes") return ConfigError(key, "unknown '" + spec + "'");
      return cb;
    });
  }
  void TearDown() override { SetRowCallbackFactory(nullptr); }

  Config MakeConfig(const std::vector<std::string>& texts, OnError on_error,
                    int64_t workers = 1) {
    EXPECT_TRUE(WriteRows(dir_.Sub("rows.parquet"), texts).ok());
    Config c;
    c.seed = 4;
    c.batch.seq_len = 64;
    c.batch.global_tokens = 64;
    SourceConfig s;
    s.name = "custom";
    s.path = dir_.Sub("rows.parquet");
    s.user_transform.python = "tests:bytes";
    s.user_transform.columns = {"text", "weight"};
    s.on_error = on_error;
    s.workers = workers;
    s.shuffle_window_rows = 1;  // file order: row i is sample i
    c.sources.push_back(s);
    return c;
  }

  std::unique_ptr<SourceLoader> MakeLoader(const Config& c) {
    auto loader = SourceLoader::Make(c, 0, {}, {});
    EXPECT_TRUE(loader.ok()) << loader.status().ToString();
    return loader.ok() ? std::move(*loader) : nullptr;
  }

  testing::ScopedTempDir dir_{"braid-user-transform"};
  std::shared_ptr<BatchCallback> callback_;
};

using Stream = std::vector<std::tuple<int64_t, SkipReason, std::vector<int32_t>>>;

// (row, skip, ids) of the first `n` samples; stops at the first error (EXPECTed ok).
Stream Pull(SourceLoader* loader, int n) {
  Stream out;
  for (int i = 0; i < n && loader != nullptr; ++i) {
    auto s = loader->Next();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) break;
    std::vector<int32_t> ids;
    if (s->payload) {
      const auto& tokens = (*s->payload.Get())->tokens;
      ids.assign(tokens.begin(), tokens.end());
    }
    out.emplace_back(s->meta.row, s->meta.skip, std::move(ids));
  }
  return out;
}

// 300 texts of 1-9 letters with failing rows ("bad"; "boom, bad" also fails any batch it
// is in) and dropped rows among them.
std::vector<std::string> MixedTexts() {
  std::vector<std::string> texts;
  for (int i = 0; i < 300; ++i) {
    texts.push_back(i % 17 == 0   ? "bad"
                    : i % 23 == 0 ? "boom, bad " + std::to_string(i)
                    : i % 13 == 0 ? "drop"
                                  : std::string(1 + i % 9, char('a' + i % 26)));
  }
  return texts;
}

TEST_F(UserTransformTest, TokensAndLossMaskComeFromTheCallback) {
  auto loader = MakeLoader(MakeConfig({"ab|c", "xyz"}, OnError::kFail));
  ASSERT_NE(loader, nullptr);
  auto first = loader->Next();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->meta.tokens, 5);
  EXPECT_EQ((*first->payload.Get())->tokens,
            (std::vector<int32_t>{'a', 'b', '|', 'c', 1000}));
  EXPECT_EQ((*first->payload.Get())->loss_mask, (std::vector<uint8_t>{0, 0, 0, 1, 1}));
  auto second = loader->Next();
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second->payload.Get())->tokens,
            (std::vector<int32_t>{'x', 'y', 'z', 1001}));
}

TEST_F(UserTransformTest, NoneIsASkipInEitherMode) {
  for (OnError mode : {OnError::kFail, OnError::kSkip}) {
    auto loader = MakeLoader(MakeConfig({"a", "drop", "b"}, mode));
    ASSERT_NE(loader, nullptr);
    std::vector<SkipReason> skips;
    for (int i = 0; i < 3; ++i) {
      auto s = loader->Next();
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      skips.push_back(s->meta.skip);
    }
    EXPECT_EQ(skips, (std::vector<SkipReason>{SkipReason::kNone, SkipReason::kEmpty,
                                              SkipReason::kNone}));
  }
}

TEST_F(UserTransformTest, CallbackErrorFailsNamingSourceFileRowGroupAndRow) {
  auto loader = MakeLoader(MakeConfig({"a", "b", "c", "d", "e", "is bad", "f"},
                                      OnError::kFail));
  ASSERT_NE(loader, nullptr);
  // Row groups are permuted: the samples before the bad row come first, then the error.
  Result<Sample> bad = loader->Next();
  int good = 0;
  for (; bad.ok() && good < 7; ++good) bad = loader->Next();
  EXPECT_LT(good, 7);
  ASSERT_FALSE(bad.ok());
  const std::string msg = bad.status().message();
  EXPECT_NE(msg.find("source 'custom'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rows.parquet (row group 1, row 5)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sources[0].transform.python"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ValueError: cannot use 'is bad'"), std::string::npos) << msg;
  // Errors repeat.
  EXPECT_FALSE(loader->Next().ok());
}

TEST_F(UserTransformTest, CallbackErrorIsSkippedAndTheStreamGoesOn) {
  auto loader = MakeLoader(MakeConfig({"a", "bad", "<null>", "c"}, OnError::kSkip));
  ASSERT_NE(loader, nullptr);
  std::vector<SkipReason> skips;
  std::vector<int64_t> tokens;
  for (int i = 0; i < 4; ++i) {
    auto s = loader->Next();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    skips.push_back(s->meta.skip);
    tokens.push_back(s->meta.tokens);
  }
  EXPECT_EQ(skips, (std::vector<SkipReason>{SkipReason::kNone, SkipReason::kError,
                                            SkipReason::kError, SkipReason::kNone}));
  EXPECT_EQ(tokens, (std::vector<int64_t>{2, 0, 0, 2}));
}

TEST_F(UserTransformTest, StreamIsTheSameForAnyWorkerCount) {
  std::vector<std::string> texts;
  for (int i = 0; i < 300; ++i) {
    texts.push_back(i % 17 == 0   ? "bad"
                    : i % 13 == 0 ? "drop"
                                  : std::string(1 + i % 9, char('a' + i % 26)));
  }
  auto run = [&](int64_t workers) {
    Config c = MakeConfig(texts, OnError::kSkip, workers);
    c.sources[0].shuffle_window_rows = 50;
    auto loader = MakeLoader(c);
    std::vector<std::tuple<int64_t, SkipReason, std::vector<int32_t>>> out;
    for (int i = 0; i < 450 && loader; ++i) {
      auto s = loader->Next();
      EXPECT_TRUE(s.ok());
      if (!s.ok()) break;
      std::vector<int32_t> ids;
      if (s->payload) {
        const auto& tokens = (*s->payload.Get())->tokens;
        ids.assign(tokens.begin(), tokens.end());
      }
      out.emplace_back(s->meta.row, s->meta.skip, std::move(ids));
    }
    return out;
  };
  const auto one = run(1);
  ASSERT_EQ(one.size(), 450u);
  EXPECT_EQ(run(4), one);
}

TEST_F(UserTransformTest, RowsReachTheCallbackInChunksWithAndWithoutPayloads) {
  for (bool payloads : {true, false}) {
    auto cb = std::make_shared<BatchCallback>();
    SetRowCallbackFactory([cb](const std::string&, const std::string&)
                              -> Result<std::shared_ptr<const RowCallback>> { return cb; });
    Config c = MakeConfig(MixedTexts(), OnError::kSkip);
    c.sources[0].shuffle_window_rows = 300;
    SourceLoader::Options options;
    options.read_payloads = payloads;
    auto loader = SourceLoader::Make(c, 0, {}, options);
    ASSERT_TRUE(loader.ok()) << loader.status().ToString();
    ASSERT_EQ(Pull(loader->get(), 300).size(), 300u);
    (*loader)->Stop();  // no call in flight from here on (it reads ahead)
    const auto entries = cb->Entries();
    size_t rows = 0, largest = 0;
    for (const auto& [batched, n] : entries) {
      EXPECT_FALSE(batched);
      rows += n;
      largest = std::max(largest, n);
    }
    // Up to 64 rows per call: a window of 300 rows is 5 calls (4 x 64 + 44).
    EXPECT_GE(rows, 300u) << payloads;
    EXPECT_EQ(largest, 64u) << payloads;
    EXPECT_LE(entries.size() * 50, rows) << payloads;
  }
}

TEST_F(UserTransformTest, BatchedStreamIsThePerRowStreamForAnyWorkerCount) {
  auto run = [&](bool batched, int64_t workers) {
    Config c = MakeConfig(MixedTexts(), OnError::kSkip, workers);
    c.sources[0].shuffle_window_rows = 50;
    c.sources[0].user_transform.batched = batched;
    auto loader = MakeLoader(c);
    return Pull(loader.get(), 450);
  };
  const Stream per_row = run(false, 1);
  ASSERT_EQ(per_row.size(), 450u);
  int64_t failed = 0;
  for (const auto& [row, skip, ids] : per_row) failed += skip == SkipReason::kError;
  EXPECT_GT(failed, 20);
  for (int64_t workers : {1, 2, 3}) {
    const size_t before = callback_->Entries().size();
    EXPECT_EQ(run(true, workers), per_row) << workers;
    const auto entries = callback_->Entries();
    size_t largest = 0;
    for (size_t e = before; e < entries.size(); ++e) {
      EXPECT_TRUE(entries[e].first);
      largest = std::max(largest, entries[e].second);
    }
    EXPECT_GT(largest, 1u) << workers;  // batches, not rows
  }
}

TEST_F(UserTransformTest, FailedBatchIsRetriedRowByRowAndTheErrorNamesTheRow) {
  // Row 6 fails its batch; rows 0-5 still arrive, then the error names row 6 (row group
  // 1, row 2 of it) and what the function said about that row alone.
  Config c = MakeConfig({"a", "b", "c", "d", "e", "f", "boom", "g"}, OnError::kFail);
  c.sources[0].user_transform.batched = true;
  c.sources[0].shuffle_window_rows = 8;
  auto loader = MakeLoader(c);
  ASSERT_NE(loader, nullptr);
  Result<Sample> s = loader->Next();
  int good = 0;
  for (; s.ok() && good < 8; ++good) s = loader->Next();
  ASSERT_FALSE(s.ok());
  EXPECT_LT(good, 8);
  const std::string msg = s.status().message();
  EXPECT_THAT(msg, HasSubstr("rows.parquet (row group 1, row 6)"));
  EXPECT_THAT(msg, HasSubstr("source 'custom'"));
  EXPECT_THAT(msg, HasSubstr("sources[0].transform.python ('tests:bytes', batched)"));
  EXPECT_THAT(msg, HasSubstr("ValueError: boom alone"));
  // With skip, only that row is skipped.
  c.sources[0].on_error = OnError::kSkip;
  loader = MakeLoader(c);
  ASSERT_NE(loader, nullptr);
  int errors = 0;
  for (const auto& [row, skip, ids] : Pull(loader.get(), 8)) {
    EXPECT_EQ(skip == SkipReason::kError, row == 6) << row;
    errors += skip == SkipReason::kError;
  }
  EXPECT_EQ(errors, 1);
}

TEST_F(UserTransformTest, UnresolvableSpecAndMissingFactoryNameTheKey) {
  Config c = MakeConfig({"a"}, OnError::kFail);
  c.sources[0].user_transform.python = "tests:nothing";
  auto loader = SourceLoader::Make(c, 0, {}, {});
  ASSERT_FALSE(loader.ok());
  EXPECT_THAT(loader.status().message(), HasSubstr("sources[0].transform.python"));
  SetRowCallbackFactory(nullptr);
  loader = SourceLoader::Make(MakeConfig({"a"}, OnError::kFail), 0, {}, {});
  ASSERT_FALSE(loader.ok());
  EXPECT_THAT(loader.status().message(), HasSubstr("sources[0].transform.python"));
  EXPECT_THAT(loader.status().message(), HasSubstr("no user transform runtime"));
}

TEST_F(UserTransformTest, MissingColumnNamesItsKey) {
  Config c = MakeConfig({"a"}, OnError::kFail);
  c.sources[0].user_transform.columns = {"text", "nope"};
  auto loader = SourceLoader::Make(c, 0, {}, {});
  ASSERT_FALSE(loader.ok());
  EXPECT_NE(loader.status().message().find("nope"), std::string::npos)
      << loader.status().ToString();
}

TEST_F(UserTransformTest, StopCancelsTheCallback) {
  // A callback told to cancel is what keeps a Python engine dropped with the GIL held
  // from hanging; here: Stop() reaches Cancel, and Next() then reports Cancelled.
  struct Counting : BytesCallback {
    void Cancel() const override { cancels.fetch_add(1); }
    mutable std::atomic<int> cancels{0};
  };
  auto counting = std::make_shared<Counting>();
  SetRowCallbackFactory([counting](const std::string&, const std::string&)
                            -> Result<std::shared_ptr<const RowCallback>> {
    return counting;
  });
  auto loader = MakeLoader(MakeConfig({"a", "b"}, OnError::kFail));
  ASSERT_NE(loader, nullptr);
  ASSERT_TRUE(loader->Next().ok());
  loader->Stop();
  EXPECT_EQ(counting->cancels.load(), 1);
  EXPECT_TRUE(loader->Next().status().IsCancelled());
}

}  // namespace
}  // namespace braid
