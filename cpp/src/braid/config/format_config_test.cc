// sources[].format and the sources that need no transform key (Megatron datasets).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "braid/config/config.h"

namespace braid {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

Result<Config> Parse(const std::string& source) {
  return ParseConfig("batch: {global_tokens: 4096, seq_len: 1024}\nsources:\n  - " +
                         source + "\n",
                     "/base");
}

void ExpectError(const std::string& source, const std::string& key,
                 const std::string& what) {
  auto c = Parse(source);
  ASSERT_FALSE(c.ok()) << source;
  EXPECT_TRUE(c.status().IsInvalid());
  EXPECT_THAT(c.status().message(), StartsWith(key + ":")) << source;
  EXPECT_THAT(c.status().message(), HasSubstr(what)) << source;
}

TEST(FormatConfigTest, TheFormatIsParsedAndAutoByDefault) {
  auto c = Parse("{name: a, path: a.parquet, tokens_column: t}");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->sources[0].format, SourceFormat::kAuto);
  for (const auto& [name, format] :
       std::vector<std::pair<std::string, SourceFormat>>{
           {"parquet", SourceFormat::kParquet}, {"jsonl", SourceFormat::kJsonl},
           {"megatron", SourceFormat::kMegatron}, {"hf_arrow", SourceFormat::kHfArrow},
           {"webdataset", SourceFormat::kWebDataset}, {"auto", SourceFormat::kAuto}}) {
    auto f = Parse("{name: a, path: a, tokens_column: t, format: " + name + "}");
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(f->sources[0].format, format);
    EXPECT_EQ(ToString(format), name);
  }
  ExpectError("{name: a, path: a, tokens_column: t, format: csv}", "sources[0].format",
              "csv");
}

TEST(FormatConfigTest, AMegatronDatasetNeedsNoTransformAndTakesNoOther) {
  for (const std::string path : {"corpus_text_document.idx", "corpus_text_document.bin",
                                 "s3://b/corpus.idx"}) {
    auto c = Parse("{name: a, path: " + path + "}");
    ASSERT_TRUE(c.ok()) << path << ": " << c.status().ToString();
    EXPECT_TRUE(c->sources[0].tokens_column.empty());
  }
  auto named = Parse("{name: a, path: corpus, format: megatron}");
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  ExpectError("{name: a, path: c.idx, text_column: text}", "sources[0].text_column",
              "Megatron");
  ExpectError("{name: a, path: c, format: megatron, chat: {messages_column: m}}",
              "sources[0].chat", "Megatron");
  ExpectError("{name: a, path: c.bin, length_column: n}", "sources[0].length_column",
              "Megatron");
  // Names of another format still need one.
  ExpectError("{name: a, path: c.jsonl}", "sources[0].tokens_column", "required");
  ExpectError("{name: a, path: c.parquet}", "sources[0].tokens_column", "required");
}

TEST(FormatConfigTest, AnImageColumnMayListAlternativeMemberExtensions) {
  const std::string image = ", image: {image_token_id: 7}, tokenizer: {model: t.model}}";
  auto c = Parse(
      "{name: a, path: s.tar, text_column: txt, image_column: [jpg, png, webp]" + image);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->sources[0].image_column, "jpg;png;webp");  // webdataset's own spelling
  auto one = Parse("{name: a, path: s.tar, text_column: txt, image_column: jpg" + image);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->sources[0].image_column, "jpg");
  ExpectError("{name: a, path: s.tar, text_column: txt, image_column: []" + image,
              "sources[0].image_column", "empty");
  ExpectError("{name: a, path: s.tar, text_column: txt, image_column: [jpg, '']" + image,
              "sources[0].image_column[1]", "empty");
  ExpectError("{name: a, path: s.tar, text_column: txt, image_column: [{x: 1}]" + image,
              "sources[0].image_column[0]", "string");
}

// image.folder: where a JSON Lines image field's relative paths are found, resolved
// against the config's folder like `path`; an empty one is an error naming it.
TEST(FormatConfigTest, AnImageFolderResolvesLikeAPath) {
  const std::string head = "{name: a, path: d.jsonl, text_column: c, image_column: i, ";
  auto c =
      Parse(head + "image: {image_token_id: 7, folder: imgs}, tokenizer: {model: m}}");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->sources[0].image_folder, "/base/imgs");
  auto remote = Parse(head + "image: {image_token_id: 7, folder: 's3://b/imgs'}, "
                             "tokenizer: {model: m}}");
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  EXPECT_EQ(remote->sources[0].image_folder, "s3://b/imgs");
  ExpectError(head + "image: {image_token_id: 7, folder: ''}, tokenizer: {model: m}}",
              "sources[0].image.folder", "empty");
}

}  // namespace
}  // namespace braid
