// The length cache: a planning pass over a tokenized source keeps its counts, the next
// one reads them instead of the columns, and anything that could change a count (the
// tokenizer, its options, the row group's bytes) is a miss.
#include "braid/io/length_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "braid/source/source_loader.h"
#include "braid/testing/memory_stream.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/sentencepiece_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

namespace stdfs = std::filesystem;

class LengthCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<testing::ScopedTempDir>("braid-length-cache");
    ASSERT_TRUE(testing::TrainTinySentencePiece(testing::RandomSentences(400, 3),
                                                dir_->Sub("tok"), 120)
                    .ok());
    for (int f = 0; f < 2; ++f) {
      const auto sentences = testing::RandomSentences(70 - 20 * f, 10 + uint64_t(f));
      ASSERT_TRUE(Write(f, {sentences.begin(), sentences.end()}).ok());
    }
  }

  Status Write(int f, const std::vector<std::optional<std::string>>& rows) {
    return testing::WriteTextFile(dir_->Sub("text/part-" + std::to_string(f) + ".parquet"),
                                  "text", rows, /*row_group_rows=*/16);
  }

  Config TextConfig(OnError on_error = OnError::kFail) const {
    Config c;
    c.seed = 11;
    c.batch.seq_len = 128;
    c.batch.global_tokens = 128;
    c.tokenizer.model = dir_->Sub("tok.model");
    SourceConfig s;
    s.name = "text";
    s.path = dir_->Sub("text");
    s.text_column = "text";
    s.shuffle_window_rows = 32;
    s.on_error = on_error;
    s.length_cache_dir = dir_->Sub("lens");
    c.sources.push_back(s);
    return c;
  }

  // The first n samples' metadata of a planning pass (or a run's, with payloads) and the
  // entries it found in the cache.
  std::vector<SampleMeta> Plan(const Config& config, int64_t n, int64_t* hits = nullptr,
                               bool payloads = false) const {
    SourceLoader::Options options;
    options.read_payloads = payloads;
    auto loader = SourceLoader::Make(config, 0, StreamPos{}, options);
    EXPECT_TRUE(loader.ok()) << loader.status().ToString();
    if (!loader.ok()) return {};
    Status st;
    std::vector<SampleMeta> metas;
    for (const Sample& s : testing::ReadSamples(loader->get(), n, &st)) {
      metas.push_back(s.meta);
    }
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (hits != nullptr) *hits = (*loader)->length_cache_hits();
    return metas;
  }

  int64_t Entries() const {
    int64_t n = 0;
    for (const auto& e : stdfs::directory_iterator(dir_->Sub("lens"))) {
      n += e.path().extension() == ".lens";
    }
    return n;
  }

  std::unique_ptr<testing::ScopedTempDir> dir_;
};

void ExpectSameMetas(const std::vector<SampleMeta>& a, const std::vector<SampleMeta>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].file, b[i].file) << i;
    EXPECT_EQ(a[i].row, b[i].row) << i;
    EXPECT_EQ(a[i].epoch, b[i].epoch) << i;
    EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
    EXPECT_EQ(a[i].skip, b[i].skip) << i;
    EXPECT_EQ(a[i].image_tokens, b[i].image_tokens) << i;
  }
}

// The files hold 70 and 50 rows in row groups of 16: 5 + 4 entries. A pass reads ahead
// past the samples it is asked for, into later epochs, where it may already find the
// entries its first epoch kept; so hits are counted from the second pass on.
constexpr int64_t kEntries = 9;

TEST_F(LengthCacheTest, TheNextPlanningPassReadsTheCountsTheFirstKept) {
  const Config config = TextConfig();
  const auto first = Plan(config, 250);  // two epochs and more
  EXPECT_EQ(Entries(), kEntries);
  int64_t hits = -1;
  const auto second = Plan(config, 250, &hits);
  ExpectSameMetas(first, second);
  EXPECT_GE(hits, 2 * kEntries);  // every entry of both epochs, none encoded again
  EXPECT_EQ(Entries(), kEntries);
  // And the counts are what a run's encode gives.
  ExpectSameMetas(first, Plan(config, 250, nullptr, /*payloads=*/true));
}

TEST_F(LengthCacheTest, ATokenizerOptionOrARewrittenRowGroupIsAMiss) {
  Config config = TextConfig();
  Plan(config, 120);
  ASSERT_EQ(Entries(), kEntries);
  config.tokenizer.eos = false;  // another count for every row: every entry is new
  const auto no_eos = Plan(config, 120);
  EXPECT_EQ(Entries(), 2 * kEntries);
  ExpectSameMetas(no_eos, Plan(config, 120, nullptr, /*payloads=*/true));
  // Rewrite file 1 with other texts under the same name: its 4 entries are stale.
  const auto other = testing::RandomSentences(50, /*seed=*/99);
  ASSERT_TRUE(Write(1, {other.begin(), other.end()}).ok());
  const auto rewritten = Plan(config, 120);
  EXPECT_EQ(Entries(), 2 * kEntries + 4);
  ExpectSameMetas(rewritten, Plan(config, 120, nullptr, /*payloads=*/true));
}

TEST_F(LengthCacheTest, ARowGroupWithANullIsNeverKeptAndADamagedEntryIsAMiss) {
  std::vector<std::optional<std::string>> rows;
  for (const auto& t : testing::RandomSentences(50, /*seed=*/11)) rows.push_back(t);
  rows[20] = std::nullopt;  // row group 1 of file 1
  ASSERT_TRUE(Write(1, rows).ok());
  const Config config = TextConfig(OnError::kSkip);
  const auto first = Plan(config, 250);
  ASSERT_EQ(Entries(), kEntries - 1);
  std::map<std::string, uintmax_t> sizes;
  for (const auto& e : stdfs::directory_iterator(dir_->Sub("lens"))) {
    sizes[e.path().string()] = stdfs::file_size(e.path());
    stdfs::resize_file(e.path(), sizes[e.path().string()] - 3);  // damage every entry
  }
  const auto damaged = Plan(config, 250);
  ExpectSameMetas(first, damaged);
  for (const auto& [path, size] : sizes) {  // each was found damaged and kept again
    EXPECT_EQ(stdfs::file_size(path), size) << path;
  }
  int64_t hits = -1;
  const auto again = Plan(config, 250, &hits);
  EXPECT_GE(hits, 2 * (kEntries - 1));
  ExpectSameMetas(first, again);
  EXPECT_EQ(Entries(), kEntries - 1);
}

TEST_F(LengthCacheTest, BlocksOfLargeRowGroupsAreEntriesOfTheirOwn) {
  Config config = TextConfig();
  config.sources[0].shuffle_window_bytes = 600;  // row groups cut into blocks
  const auto first = Plan(config, 250);
  const int64_t entries = Entries();
  EXPECT_GT(entries, kEntries);
  int64_t hits = -1;
  const auto second = Plan(config, 250, &hits);
  EXPECT_GE(hits, 2 * entries);
  EXPECT_EQ(Entries(), entries);
  ExpectSameMetas(first, second);
  ExpectSameMetas(first, Plan(config, 250, nullptr, /*payloads=*/true));
}

TEST_F(LengthCacheTest, SourcesWithCheapCountsOrUncacheableTransformsHaveNone) {
  Config config = TextConfig();
  config.sources[0].text_column.clear();
  config.sources[0].tokens_column = "input_ids";
  auto none = LengthCache::Make(config, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  config = TextConfig();
  config.sources[0].user_transform.python = "pkg:fn";
  config.sources[0].user_transform.columns = {"text"};
  none = LengthCache::Make(config, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  config = TextConfig();
  config.tokenizer.model = dir_->Sub("missing.model");
  auto missing = LengthCache::Make(config, 0);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), ::testing::HasSubstr("missing.model"));
}

}  // namespace
}  // namespace braid
