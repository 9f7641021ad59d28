// Transforms through the source loader: text tokenized with a tiny SentencePiece model
// that the test trains, chat loss masks, and worker parallelism (same stream for any
// worker count, bounded read-ahead, clean shutdown).
#include "braid/transform/transform.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>
#include <sentencepiece_processor.h>

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "braid/source/source_loader.h"
#include "braid/transform/tokenizer.h"
#include "braid/transform/transform_internal.h"
#include "braid/testing/memory_stream.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/sentencepiece_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::HasSubstr;

std::vector<int32_t> Encode(const std::string& model, const std::string& text) {
  sentencepiece::SentencePieceProcessor sp;
  EXPECT_TRUE(sp.Load(model).ok());
  std::vector<int> ids;
  EXPECT_TRUE(sp.Encode(text, &ids).ok());
  return {ids.begin(), ids.end()};
}

using Read = Sample;

// The next n samples; a read error fails the test.
std::vector<Sample> ReadN(SampleStream* stream, int64_t n) {
  Status st;
  auto out = braid::testing::ReadSamples(stream, n, &st);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

// A trained model and two text files (70 + 50 rows, row groups of 16), shared by the suite.
class TransformTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::ScopedTempDir("braid-transform");
    texts_ = new std::vector<std::vector<std::optional<std::string>>>();
    const auto corpus = testing::RandomSentences(400, /*seed=*/3);
    ASSERT_TRUE(testing::TrainTinySentencePiece(corpus, dir_->Sub("tok"), 120).ok());
    for (int f = 0; f < 2; ++f) {
      auto sentences = testing::RandomSentences(70 - 20 * f, /*seed=*/10 + uint64_t(f));
      texts_->emplace_back(sentences.begin(), sentences.end());
      ASSERT_TRUE(testing::WriteTextFile(dir_->Sub("text/part-" + std::to_string(f) +
                                                   ".parquet"),
                                         "text", texts_->back(), 16)
                      .ok());
    }
  }
  static void TearDownTestSuite() {
    delete texts_;
    delete dir_;
  }

  static std::string model() { return dir_->Sub("tok.model"); }

  static Config TextConfig(const std::string& path, int64_t workers = 1,
                           OnError on_error = OnError::kFail) {
    Config c;
    c.seed = 11;
    c.batch.seq_len = 128;
    c.batch.global_tokens = 128;
    c.tokenizer.model = model();
    SourceConfig s;
    s.name = "text";
    s.path = path;
    s.text_column = "text";
    s.shuffle_window_rows = 32;
    s.workers = workers;
    s.on_error = on_error;
    c.sources.push_back(s);
    return c;
  }

  static std::unique_ptr<SourceLoader> MakeLoader(const Config& config,
                                                  SourceLoader::Options options = {}) {
    auto loader = SourceLoader::Make(config, 0, StreamPos{}, options);
    EXPECT_TRUE(loader.ok()) << loader.status().ToString();
    return loader.ok() ? std::move(*loader) : nullptr;
  }

  static testing::ScopedTempDir* dir_;
  static std::vector<std::vector<std::optional<std::string>>>* texts_;
};

testing::ScopedTempDir* TransformTest::dir_ = nullptr;
std::vector<std::vector<std::optional<std::string>>>* TransformTest::texts_ = nullptr;

// A list<int32|int64> column from rows (nullopt: a null row).
std::shared_ptr<arrow::Array> TokenLists(
    const std::vector<std::optional<std::vector<int64_t>>>& rows, bool wide) {
  auto values = wide ? std::shared_ptr<arrow::ArrayBuilder>(new arrow::Int64Builder())
                     : std::shared_ptr<arrow::ArrayBuilder>(new arrow::Int32Builder());
  arrow::ListBuilder list(arrow::default_memory_pool(), values);
  for (const auto& row : rows) {
    if (!row) {
      EXPECT_TRUE(list.AppendNull().ok());
      continue;
    }
    EXPECT_TRUE(list.Append().ok());
    for (int64_t v : *row) {
      EXPECT_TRUE(wide ? static_cast<arrow::Int64Builder&>(*values).Append(v).ok()
                       : static_cast<arrow::Int32Builder&>(*values)
                             .Append(static_cast<int32_t>(v))
                             .ok());
    }
  }
  std::shared_ptr<arrow::Array> out;
  EXPECT_TRUE(list.Finish(&out).ok());
  return out;
}

TEST(TokenColumnTransformTest, BatchGivesWhatApplyGivesRowByRow) {
  const std::string path = "f.parquet";
  const std::vector<std::optional<std::vector<int64_t>>> rows = {
      std::vector<int64_t>{1, 2, 3}, std::nullopt, std::vector<int64_t>{},
      std::vector<int64_t>{7}, std::vector<int64_t>{int64_t{1} << 40, 5},
      std::vector<int64_t>{4, 4}};
  for (bool wide : {false, true}) {
    const Columns cols = {TokenLists(rows, wide)};
    auto transform = internal::MakeTokenColumnTransform("ids", "", "");
    std::vector<BatchRow> batch;
    for (int64_t i = 0; i < int64_t(rows.size()); ++i) {
      batch.push_back(BatchRow{&cols, i, RowLocation{&path, 0, i}});
    }
    std::vector<RowOutput> out(batch.size());
    std::vector<Status> st(batch.size());
    transform->ApplyBatch(batch, /*want_payload=*/true, out.data(), st.data());
    for (size_t k = 0; k < batch.size(); ++k) {
      SCOPED_TRACE("wide " + std::to_string(wide) + " row " + std::to_string(k));
      RowOutput one;
      const Status one_st =
          transform->Apply(cols, int64_t(k), /*want_payload=*/true, batch[k].where, &one);
      EXPECT_EQ(st[k].ToString(), one_st.ToString());
      EXPECT_EQ(out[k].skip, one.skip);
      EXPECT_EQ(out[k].null_what, one.null_what);
      EXPECT_EQ(out[k].tokens, one.tokens);
      ASSERT_EQ(out[k].payload == nullptr, one.payload == nullptr);
      if (one.payload != nullptr) EXPECT_EQ(out[k].payload->tokens, one.payload->tokens);
    }
    // The int64 id past int32 fails its own row only, naming it.
    if (wide) {
      EXPECT_THAT(st[4].message(), HasSubstr("f.parquet"));
      EXPECT_THAT(st[4].message(), HasSubstr("does not fit int32"));
    } else {
      EXPECT_TRUE(st[4].ok());
    }
    EXPECT_EQ(out[1].skip, SkipReason::kNull);
    EXPECT_EQ(out[2].skip, SkipReason::kEmpty);
    // A payload outlives the batch's other payloads and the columns.
    TokenPayload last = std::move(out[5].payload);
    out.clear();
    batch.clear();
    EXPECT_EQ(last->tokens, (std::vector<int32_t>{4, 4}));
    EXPECT_EQ(last->tokens.is_view(), !wide);
  }
}

TEST(TokenColumnTransformTest, AKeptPayloadHoldsItsOwnChunkNotTheBatchsOthers) {
  const std::string path = "f.parquet";
  // Two chunks of one row group, their rows interleaved in the batch (a shuffle window).
  Columns a = {TokenLists({std::vector<int64_t>{1, 2}, std::vector<int64_t>{3}},
                          /*wide=*/false)};
  Columns b = {TokenLists({std::vector<int64_t>{4}, std::vector<int64_t>{5, 6}},
                          /*wide=*/false)};
  auto values_of = [](const Columns& cols) {
    const auto& list = static_cast<const arrow::ListArray&>(*cols[0]);
    return std::weak_ptr<arrow::Buffer>(list.values()->data()->buffers[1]);
  };
  const std::weak_ptr<arrow::Buffer> a_ids = values_of(a), b_ids = values_of(b);
  auto transform = internal::MakeTokenColumnTransform("ids", "", "");
  std::vector<BatchRow> batch = {{&a, 0, {&path, 0, 0}}, {&b, 0, {&path, 0, 2}},
                                 {&a, 1, {&path, 0, 1}}, {&b, 1, {&path, 0, 3}}};
  std::vector<RowOutput> out(batch.size());
  std::vector<Status> st(batch.size());
  transform->ApplyBatch(batch, /*want_payload=*/true, out.data(), st.data());
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(out[3].payload->tokens, (std::vector<int32_t>{5, 6}));
  // Keep one of chunk a's payloads (a long document still in a plan); drop the rest and
  // the chunks themselves.
  TokenPayload kept = std::move(out[2].payload);
  out.clear();
  batch.clear();
  a.clear();  // the loader's chunks go too
  b.clear();
  EXPECT_EQ(kept->tokens, (std::vector<int32_t>{3}));
  EXPECT_FALSE(a_ids.expired());  // the kept view's own chunk
  EXPECT_TRUE(b_ids.expired());   // not the other chunk of its batch
}

TEST_F(TransformTest, TextIsTokenizedWithEosByDefault) {
  Config config = TextConfig(dir_->Sub("text"));
  auto loader = MakeLoader(config);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->rows_per_epoch(), 120);
  const auto reads = ReadN(loader.get(), 120);
  ASSERT_EQ(reads.size(), 120u);
  std::set<std::pair<int32_t, int64_t>> seen;
  for (const auto& r : reads) {
    EXPECT_TRUE(seen.emplace(r.meta.file, r.meta.row).second);
    const std::string& text = *(*texts_)[size_t(r.meta.file)][size_t(r.meta.row)];
    auto expected = Encode(model(), text);
    ASSERT_GT(expected.size(), 2u);
    expected.push_back(2);  // eos id of the trained model
    ASSERT_TRUE(r.payload);
    EXPECT_EQ(r.payload->tokens, expected) << text;
    EXPECT_TRUE(r.payload->loss_mask.empty());
    EXPECT_EQ(r.meta.tokens, int64_t(expected.size()));
  }
  // BOS on, EOS off.
  config.tokenizer.bos = true;
  config.tokenizer.eos = false;
  auto bos_loader = MakeLoader(config);
  const auto bos_reads = ReadN(bos_loader.get(), 5);
  for (size_t i = 0; i < bos_reads.size(); ++i) {
    EXPECT_EQ(bos_reads[i].meta.row, reads[i].meta.row);  // same order
    auto expected = Encode(
        model(), *(*texts_)[size_t(bos_reads[i].meta.file)][size_t(bos_reads[i].meta.row)]);
    expected.insert(expected.begin(), 1);
    EXPECT_EQ(bos_reads[i].payload->tokens, expected);
  }
}

TEST_F(TransformTest, MetadataOnlyCountsTokensWithoutPayload) {
  auto full = MakeLoader(TextConfig(dir_->Sub("text")));
  auto meta = MakeLoader(TextConfig(dir_->Sub("text")), {.read_payloads = false});
  const auto a = ReadN(full.get(), 40);
  const auto b = ReadN(meta.get(), 40);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].meta.tokens, b[i].meta.tokens);
    EXPECT_EQ(a[i].meta.row, b[i].meta.row);
    EXPECT_FALSE(b[i].payload);
  }
}

TEST_F(TransformTest, NullTextFailsNamingRowAndSkipCounts) {
  testing::ScopedTempDir dir("braid-nulltext");
  std::vector<std::optional<std::string>> rows;
  for (int i = 0; i < 40; ++i) rows.push_back("row number " + std::to_string(i) + ".");
  rows[21] = std::nullopt;
  rows[30] = "";
  const std::string path = dir.Sub("bad.parquet");
  ASSERT_TRUE(testing::WriteTextFile(path, "text", rows, 16).ok());

  auto fail = MakeLoader(TextConfig(path, /*workers=*/3));
  Status st;
  int64_t good = 0;
  for (int i = 0; i < 50 && st.ok(); ++i) {
    auto s = fail->Next();
    if (s.ok()) ++good;
    else st = s.status();
  }
  ASSERT_FALSE(st.ok());
  EXPECT_LT(good, 40);
  EXPECT_THAT(st.message(), HasSubstr("bad.parquet"));
  EXPECT_THAT(st.message(), HasSubstr("row group 1"));
  EXPECT_THAT(st.message(), HasSubstr("row 21"));
  EXPECT_THAT(st.message(), HasSubstr("null column 'text'"));

  auto skip = MakeLoader(TextConfig(path, /*workers=*/3, OnError::kSkip));
  std::map<SkipReason, std::set<int64_t>> skipped;
  for (const auto& r : ReadN(skip.get(), 40)) {
    if (r.meta.skip != SkipReason::kNone) {
      skipped[r.meta.skip].insert(r.meta.row);
      EXPECT_FALSE(r.payload);
      EXPECT_EQ(r.meta.tokens, 0);
    } else {
      EXPECT_GT(r.meta.tokens, 0);
    }
  }
  EXPECT_EQ(skipped[SkipReason::kNull], std::set<int64_t>{21});
  EXPECT_EQ(skipped[SkipReason::kEmpty], std::set<int64_t>{30});
}

TEST_F(TransformTest, BadModelAndWrongColumnTypeAreNamedErrors) {
  Config config = TextConfig(dir_->Sub("text"));
  config.tokenizer.model = dir_->Sub("missing.model");
  auto bad = SourceLoader::Make(config, 0, StreamPos{}, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("tokenizer.model"));

  testing::ScopedTempDir dir("braid-texttype");
  ASSERT_TRUE(testing::WriteTokenFile(dir.Sub("t.parquet"), {{1, 2}}, {.column = "text"}).ok());
  auto wrong = SourceLoader::Make(TextConfig(dir.Sub("t.parquet")), 0, StreamPos{}, {});
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("sources[0].text_column"));
  EXPECT_THAT(wrong.status().message(), HasSubstr("expected a string column"));
}

// The stream (order, tokens, skips) is the same for every worker count.
class WorkersTest : public TransformTest, public ::testing::WithParamInterface<int64_t> {};

TEST_P(WorkersTest, SameStreamForAnyWorkerCount) {
  const int64_t n = 2 * 120 + 17;  // over an epoch boundary
  auto base = MakeLoader(TextConfig(dir_->Sub("text"), 1));
  // A small read-ahead keeps back-pressure on while the workers run.
  auto par = MakeLoader(TextConfig(dir_->Sub("text"), GetParam()),
                        {.read_ahead_bytes = 2048});
  const auto a = ReadN(base.get(), n);
  const auto b = ReadN(par.get(), n);
  ASSERT_EQ(a.size(), size_t(n));
  ASSERT_EQ(b.size(), size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(a[size_t(i)].meta.file, b[size_t(i)].meta.file);
    EXPECT_EQ(a[size_t(i)].meta.row, b[size_t(i)].meta.row);
    EXPECT_EQ(a[size_t(i)].meta.pos, b[size_t(i)].meta.pos);
    EXPECT_EQ(a[size_t(i)].payload->tokens, b[size_t(i)].payload->tokens);
  }
}

TEST_P(WorkersTest, TokenColumnSameStreamForAnyWorkerCount) {
  testing::ScopedTempDir dir("braid-tokworkers");
  testing::LengthSpec spec;
  spec.median_tokens = 30;
  spec.max_tokens = 300;
  ASSERT_TRUE(testing::WriteTokenFile(dir.Sub("a.parquet"),
                                      testing::RandomDocs(200, spec, 4),
                                      {.row_group_rows = 25})
                  .ok());
  Config c = TextConfig(dir.Sub("a.parquet"));
  c.sources[0].text_column.clear();
  c.sources[0].tokens_column = "input_ids";
  auto base = MakeLoader(c);
  c.sources[0].workers = GetParam();
  auto par = MakeLoader(c, {.read_ahead_bytes = 4096});
  const auto a = ReadN(base.get(), 450);
  const auto b = ReadN(par.get(), 450);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].meta.pos, b[i].meta.pos);
    EXPECT_EQ(a[i].payload->tokens, b[i].payload->tokens);
  }
}

TEST_P(WorkersTest, DestroyMidStreamDoesNotHang) {
  for (int round = 0; round < 5; ++round) {
    auto loader = MakeLoader(TextConfig(dir_->Sub("text"), GetParam()),
                             {.read_ahead_bytes = 512});
    ReadN(loader.get(), 3 + round * 7);
    // The reader is blocked on a full queue or inside a batch; destruction must join it.
    if (round % 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto loader = MakeLoader(TextConfig(dir_->Sub("text"), GetParam()));
  ReadN(loader.get(), 1);
  loader->Stop();
  EXPECT_TRUE(loader->Next().status().IsCancelled());
}

INSTANTIATE_TEST_SUITE_P(Workers, WorkersTest, ::testing::Values(2, 3, 8));

// Chat sources.

Status WriteChatFile(const std::string& path, const std::vector<std::string>& prompts,
                     const std::vector<std::string>& responses) {
  arrow::StringBuilder p, r;
  for (const auto& s : prompts) ARROW_RETURN_NOT_OK(p.Append(s));
  for (const auto& s : responses) ARROW_RETURN_NOT_OK(r.Append(s));
  ARROW_ASSIGN_OR_RAISE(auto pa, p.Finish());
  ARROW_ASSIGN_OR_RAISE(auto ra, r.Finish());
  auto table = arrow::Table::Make(
      arrow::schema({arrow::field("prompt", arrow::utf8()),
                     arrow::field("response", arrow::utf8())}),
      {pa, ra});
  ARROW_ASSIGN_OR_RAISE(auto out, arrow::io::FileOutputStream::Open(path));
  ARROW_RETURN_NOT_OK(
      parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out, 8));
  return out->Close();
}

Status WriteMessagesFile(
    const std::string& path,
    const std::vector<std::vector<std::pair<std::string, std::string>>>& chats) {
  auto type = arrow::struct_({arrow::field("role", arrow::utf8()),
                              arrow::field("content", arrow::utf8())});
  auto role = std::make_shared<arrow::StringBuilder>();
  auto content = std::make_shared<arrow::StringBuilder>();
  auto item = std::make_shared<arrow::StructBuilder>(
      type, arrow::default_memory_pool(),
      std::vector<std::shared_ptr<arrow::ArrayBuilder>>{role, content});
  arrow::ListBuilder list(arrow::default_memory_pool(), item);
  for (const auto& chat : chats) {
    ARROW_RETURN_NOT_OK(list.Append());
    for (const auto& [r, c] : chat) {
      ARROW_RETURN_NOT_OK(item->Append());
      ARROW_RETURN_NOT_OK(role->Append(r));
      ARROW_RETURN_NOT_OK(content->Append(c));
    }
  }
  ARROW_ASSIGN_OR_RAISE(auto array, list.Finish());
  auto table =
      arrow::Table::Make(arrow::schema({arrow::field("messages", array->type())}), {array});
  ARROW_ASSIGN_OR_RAISE(auto out, arrow::io::FileOutputStream::Open(path));
  ARROW_RETURN_NOT_OK(
      parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out, 8));
  return out->Close();
}

// The expected ids and mask of one chat under the template of docs/sources.md.
void ExpectChat(const std::string& model,
                const std::vector<std::pair<std::string, std::string>>& turns,
                const Payload& p) {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  for (const auto& [role, content] : turns) {
    for (int32_t id : Encode(model, role + ":")) {
      ids.push_back(id);
      mask.push_back(0);
    }
    const bool trained = role == "assistant";
    for (int32_t id : Encode(model, content)) {
      ids.push_back(id);
      mask.push_back(trained ? 1 : 0);
    }
    if (trained) {
      ids.push_back(2);
      mask.push_back(1);
    }
  }
  EXPECT_EQ(p.tokens, ids);
  EXPECT_EQ(p.loss_mask, mask);
}

TEST_F(TransformTest, ChatPromptResponseMasksOnlyTheResponse) {
  testing::ScopedTempDir dir("braid-chat");
  const auto prompts = testing::RandomSentences(20, 21);
  const auto responses = testing::RandomSentences(20, 22);
  ASSERT_TRUE(WriteChatFile(dir.Sub("c.parquet"), prompts, responses).ok());
  Config c = TextConfig(dir.Sub("c.parquet"), /*workers=*/2);
  c.sources[0].text_column.clear();
  c.sources[0].chat.prompt_column = "prompt";
  c.sources[0].chat.response_column = "response";
  auto loader = MakeLoader(c);
  ASSERT_NE(loader, nullptr);
  for (const auto& r : ReadN(loader.get(), 20)) {
    ASSERT_TRUE(r.payload);
    const size_t row = size_t(r.meta.row);
    ExpectChat(model(), {{"user", prompts[row]}, {"assistant", responses[row]}},
               *r.payload.Get().ValueUnsafe());
    const auto& mask = r.payload->loss_mask;
    ASSERT_EQ(mask.size(), r.payload->tokens.size());
    EXPECT_EQ(mask.front(), 0);
    EXPECT_EQ(mask.back(), 1);
    EXPECT_EQ(r.meta.tokens, int64_t(mask.size()));
  }
}

TEST_F(TransformTest, ChatMessagesMaskEveryAssistantTurn) {
  testing::ScopedTempDir dir("braid-messages");
  const auto s = testing::RandomSentences(40, 31);
  std::vector<std::vector<std::pair<std::string, std::string>>> chats;
  for (int i = 0; i < 10; ++i) {
    chats.push_back({{"system", s[size_t(4 * i)]},
                     {"user", s[size_t(4 * i + 1)]},
                     {"assistant", s[size_t(4 * i + 2)]},
                     {"user", s[size_t(4 * i + 3)]},
                     {"assistant", "ok."}});
  }
  chats.push_back({});  // no messages: an empty sample
  ASSERT_TRUE(WriteMessagesFile(dir.Sub("m.parquet"), chats).ok());
  Config c = TextConfig(dir.Sub("m.parquet"));
  c.sources[0].text_column.clear();
  c.sources[0].chat.messages_column = "messages";
  auto loader = MakeLoader(c);
  ASSERT_NE(loader, nullptr);
  int empty = 0;
  for (const auto& r : ReadN(loader.get(), 11)) {
    if (r.meta.row == 10) {
      EXPECT_EQ(r.meta.skip, SkipReason::kEmpty);
      ++empty;
      continue;
    }
    ASSERT_TRUE(r.payload);
    ExpectChat(model(), chats[size_t(r.meta.row)], *r.payload.Get().ValueUnsafe());
  }
  EXPECT_EQ(empty, 1);
}

}  // namespace
}  // namespace braid
