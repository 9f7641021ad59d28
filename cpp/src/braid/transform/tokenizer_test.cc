// The Hugging Face side of the tokenizer interface with a fake encoder standing in for
// the `tokenizers` library (the Python tests use the library itself): framing by the
// post-processor, bos_token / eos_token, config errors, batches through the loader with
// the same stream for any worker count, chat framing, and encode errors naming the row.
#include "braid/transform/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <set>

#include "braid/source/source_loader.h"
#include "braid/testing/memory_stream.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/sentencepiece_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Byte-level: each byte b is id b + 10; the "post-processor" puts 1 before and 2 after.
// Token "<eos>" is 3, "<bos>" 4. A text containing "BAD" fails the whole call.
class FakeEncoder : public HfEncoder {
 public:
  Status EncodeBatch(const std::vector<std::string_view>& texts, bool add_special_tokens,
                     std::vector<std::vector<int32_t>>* out) const override {
    calls.fetch_add(1);
    int64_t seen = max_batch.load();
    while (int64_t(texts.size()) > seen &&
           !max_batch.compare_exchange_weak(seen, int64_t(texts.size()))) {
    }
    out->assign(texts.size(), {});
    for (size_t k = 0; k < texts.size(); ++k) {
      if (texts[k].find("BAD") != std::string_view::npos) {
        return Status::Invalid("cannot encode this");
      }
      (*out)[k] = Ids(texts[k], add_special_tokens);
    }
    return Status::OK();
  }
  int32_t TokenId(const std::string& token) const override {
    return token == "<eos>" ? 3 : token == "<bos>" ? 4 : -1;
  }
  static std::vector<int32_t> Ids(std::string_view text, bool specials) {
    std::vector<int32_t> ids;
    if (specials) ids.push_back(1);
    for (unsigned char c : text) ids.push_back(int32_t(c) + 10);
    if (specials) ids.push_back(2);
    return ids;
  }
  mutable std::atomic<int64_t> calls{0};
  mutable std::atomic<int64_t> max_batch{0};
};

TokenizerConfig HfConfig(const std::string& file = "/unused/tokenizer.json") {
  TokenizerConfig c;
  c.type = "huggingface";
  c.model = file;
  return c;
}

std::vector<int32_t> Doc(const Tokenizer& tok, std::string_view text) {
  std::vector<std::vector<int32_t>> out;
  EXPECT_TRUE(tok.EncodeBatch({text}, /*document=*/true, &out).ok());
  return out.at(0);
}

TEST(HfTokenizerTest, PostProcessorFramesDocumentsAndTurns) {
  auto enc = std::make_shared<FakeEncoder>();
  auto tok = MakeHfTokenizer(HfConfig(), enc);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_THAT((*tok)->prefix(), ElementsAre(1));
  EXPECT_THAT((*tok)->suffix(), ElementsAre(2));
  EXPECT_THAT(Doc(**tok, "ab"), ElementsAre(1, 'a' + 10, 'b' + 10, 2));
  std::vector<int32_t> plain;
  ASSERT_TRUE((*tok)->Encode("ab", &plain).ok());
  EXPECT_THAT(plain, ElementsAre('a' + 10, 'b' + 10));
  EXPECT_GT((*tok)->batch_rows(), 1);

  // An EOS the post-processor lacks, on top of it.
  TokenizerConfig c = HfConfig();
  c.eos_token = "<eos>";
  tok = MakeHfTokenizer(c, enc);
  ASSERT_TRUE(tok.ok());
  EXPECT_THAT((*tok)->suffix(), ElementsAre(2, 3));
  EXPECT_THAT(Doc(**tok, "a"), ElementsAre(1, 'a' + 10, 2, 3));

  // Without the post-processor: only the configured tokens.
  c = HfConfig();
  c.add_special_tokens = false;
  c.bos_token = "<bos>";
  tok = MakeHfTokenizer(c, enc);
  ASSERT_TRUE(tok.ok());
  EXPECT_THAT((*tok)->prefix(), ElementsAre(4));
  EXPECT_TRUE((*tok)->suffix().empty());
  EXPECT_THAT(Doc(**tok, "a"), ElementsAre(4, 'a' + 10));

  c.key = "sources[2].tokenizer";
  c.eos_token = "</nope>";
  tok = MakeHfTokenizer(c, enc);
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status().message(), HasSubstr("sources[2].tokenizer.eos_token"));
  EXPECT_THAT(tok.status().message(), HasSubstr("</nope>"));
  ASSERT_NE(GetErrorDetail(tok.status()), nullptr);
  EXPECT_EQ(GetErrorDetail(tok.status())->kind(), ErrorKind::kConfig);
}

TEST(HfTokenizerTest, MakeNamesTheKeyWithoutFactoryOrFile) {
  SetHfEncoderFactory(nullptr);
  TokenizerConfig c = HfConfig();
  auto tok = Tokenizer::Make(c);
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status().message(), HasSubstr("tokenizer.type"));
  EXPECT_THAT(tok.status().message(), HasSubstr("Python extension"));

  SetHfEncoderFactory([](const TokenizerConfig&) -> Result<std::shared_ptr<const HfEncoder>> {
    return std::make_shared<FakeEncoder>();
  });
  c.key = "sources[0].tokenizer";
  tok = Tokenizer::Make(c);
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status().message(), HasSubstr("sources[0].tokenizer.file"));
  EXPECT_THAT(tok.status().message(), HasSubstr("/unused/tokenizer.json"));
  SetHfEncoderFactory(nullptr);
}

// Through the loader: a per-source Hugging Face tokenizer over text and chat files.
class HfLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<testing::ScopedTempDir>("braid-hftok");
    { std::ofstream(dir_->Sub("tokenizer.json")) << "{}"; }  // the fake never reads it
    encoder_ = std::make_shared<FakeEncoder>();
    SetHfEncoderFactory(
        [enc = encoder_](const TokenizerConfig&) -> Result<std::shared_ptr<const HfEncoder>> {
          return enc;
        });
    const auto sentences = testing::RandomSentences(300, /*seed=*/5);
    texts_.assign(sentences.begin(), sentences.end());
    texts_[17] = std::nullopt;
    texts_[40] = "";
    ASSERT_TRUE(testing::WriteTextFile(dir_->Sub("t.parquet"), "text", texts_, 50).ok());
  }
  void TearDown() override { SetHfEncoderFactory(nullptr); }

  Config TextConfig(int64_t workers) const {
    Config c;
    c.seed = 3;
    c.batch.seq_len = 128;
    c.batch.global_tokens = 128;
    SourceConfig s;
    s.name = "text";
    s.path = dir_->Sub("t.parquet");
    s.text_column = "text";
    s.shuffle_window_rows = 120;
    s.workers = workers;
    s.on_error = OnError::kSkip;
    s.tokenizer = HfConfig(dir_->Sub("tokenizer.json"));
    s.tokenizer.key = "sources[0].tokenizer";
    c.sources.push_back(s);
    return c;
  }

  std::vector<Sample> Read(const Config& c, int64_t n, Status* st) {
    auto loader = SourceLoader::Make(c, 0, StreamPos{}, {.read_ahead_bytes = 4096});
    EXPECT_TRUE(loader.ok()) << loader.status().ToString();
    if (!loader.ok()) return {};
    return testing::ReadSamples(loader->get(), n, st);
  }

  std::unique_ptr<testing::ScopedTempDir> dir_;
  std::shared_ptr<FakeEncoder> encoder_;
  std::vector<std::optional<std::string>> texts_;
};

TEST_F(HfLoaderTest, BatchesGiveEachRowItsIdsAndTheSameStreamForAnyWorkers) {
  const int64_t n = 2 * 300 + 31;  // over an epoch boundary
  Status st;
  const auto one = Read(TextConfig(1), n, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(one.size(), size_t(n));
  EXPECT_GT(encoder_->max_batch.load(), 1);  // rows were encoded together
  EXPECT_LT(encoder_->calls.load(), n / 4);
  std::set<int64_t> skipped;
  for (const auto& s : one) {
    const auto& text = texts_[size_t(s.meta.row)];
    if (!text || text->empty()) {
      EXPECT_NE(s.meta.skip, SkipReason::kNone);
      skipped.insert(s.meta.row);
      continue;
    }
    ASSERT_TRUE(s.payload);
    EXPECT_EQ(s.payload->tokens, FakeEncoder::Ids(*text, true));
    EXPECT_EQ(s.meta.tokens, int64_t(text->size()) + 2);
  }
  EXPECT_EQ(skipped, (std::set<int64_t>{17, 40}));
  for (int64_t workers : {2, 3}) {
    const auto par = Read(TextConfig(workers), n, &st);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(par.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_EQ(par[i].meta.pos, one[i].meta.pos);
      EXPECT_EQ(par[i].meta.row, one[i].meta.row);
      EXPECT_EQ(par[i].meta.skip, one[i].meta.skip);
      if (one[i].payload) {
        EXPECT_EQ(par[i].payload->tokens, one[i].payload->tokens);
      }
    }
  }
}

TEST_F(HfLoaderTest, AnEncodeErrorNamesItsRow) {
  texts_[123] = "a BAD row";
  ASSERT_TRUE(testing::WriteTextFile(dir_->Sub("t.parquet"), "text", texts_, 50).ok());
  Status st;
  const auto got = Read(TextConfig(2), 300, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_LT(got.size(), 300u);
  EXPECT_THAT(st.message(), HasSubstr("t.parquet"));
  EXPECT_THAT(st.message(), HasSubstr("row 123"));
  EXPECT_THAT(st.message(), HasSubstr("cannot encode this"));
}

TEST_F(HfLoaderTest, ChatTurnsAreFramedByThePostProcessor) {
  Config c = TextConfig(2);
  c.sources[0].text_column.clear();
  c.sources[0].chat.prompt_column = "text";
  c.sources[0].chat.response_column = "text";
  Status st;
  const auto got = Read(c, 300, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  int64_t checked = 0;
  for (const auto& s : got) {
    const auto& text = texts_[size_t(s.meta.row)];
    if (!text || text->empty()) continue;
    // [1] "user:" text "assistant:" text [2]; loss on the response and its suffix.
    std::vector<int32_t> ids = {1};
    std::vector<uint8_t> mask = {0};
    auto add = [&](std::string_view piece, uint8_t m) {
      for (int32_t id : FakeEncoder::Ids(piece, false)) {
        ids.push_back(id);
        mask.push_back(m);
      }
    };
    add("user:", 0);
    add(*text, 0);
    add("assistant:", 0);
    add(*text, 1);
    ids.push_back(2);
    mask.push_back(1);
    ASSERT_TRUE(s.payload);
    EXPECT_EQ(s.payload->tokens, ids);
    EXPECT_EQ(s.payload->loss_mask, mask);
    ++checked;
  }
  EXPECT_EQ(checked, 298);
}

}  // namespace
}  // namespace braid
