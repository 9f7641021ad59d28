// The length cache: a planning pass over a tokenized source keeps its counts, the next
// one reads them instead of the columns, and anything that could change a count (the
// tokenizer, its options, the row group's bytes) is a miss.
#include "braid/io/length_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <thread>

#include "braid/source/source_loader.h"
#include "braid/testing/memory_stream.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/sentencepiece_fixture.h"
#include "braid/testing/temp_dir.h"
#include "braid/transform/transform.h"

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
    std::vector<SampleMeta> metas;
    for (const Sample& s : Read(config, n, hits, payloads)) metas.push_back(s.meta);
    return metas;
  }

  // The first n samples of a loader (payloads as they come: on demand or ready).
  std::vector<Sample> Read(const Config& config, int64_t n, int64_t* hits = nullptr,
                           bool payloads = false, bool own_payloads = false,
                           SourceProfile* profile = nullptr) const {
    SourceLoader::Options options;
    options.read_payloads = payloads;
    options.own_payloads = own_payloads;
    auto loader = SourceLoader::Make(config, 0, StreamPos{}, options);
    EXPECT_TRUE(loader.ok()) << loader.status().ToString();
    if (!loader.ok()) return {};
    Status st;
    auto samples = testing::ReadSamples(loader->get(), n, &st);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (hits != nullptr) *hits = (*loader)->length_cache_hits();
    if (profile != nullptr) {
      // Every payload made (a loader stops its payloads' producers when it goes).
      for (const Sample& s : samples) {
        if (s.payload) {
          EXPECT_TRUE(s.payload.Get().ok()) << s.meta.row;
        }
      }
      *profile = (*loader)->profile();
    }
    return samples;
  }

  // Every entry of the two files (row groups of 16, not cut), as the cache keys them.
  std::vector<LengthCacheEntry> AllEntries(const Config& config) const {
    std::vector<LengthCacheEntry> out;
    auto transform = MakeTransform(config, 0);
    EXPECT_TRUE(transform.ok()) << transform.status().ToString();
    if (!transform.ok()) return out;
    auto files =
        SourceFiles::Open(config.sources[0], "sources[0]", (*transform)->columns());
    EXPECT_TRUE(files.ok()) << files.status().ToString();
    if (!files.ok()) return out;
    for (const auto& f : (*files)->files()) {
      for (size_t rg = 0; rg < f.row_group_rows.size(); ++rg) {
        out.push_back(
            LengthCacheEntry{f.path, f.row_group_digest[rg], int32_t(rg), 0, 0});
      }
    }
    return out;
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

// Processes that read a source at once (a node's embedded ranks) count each entry once
// between them: whoever holds an entry's lock counts it, the others wait for it.
TEST_F(LengthCacheTest, AnEntrysLockIsHeldByOneAtATimeAndAWaitEndsWhenAskedTo) {
  const Config config = TextConfig();
  auto cache = LengthCache::Make(config, 0);
  ASSERT_TRUE(cache.ok() && *cache != nullptr);
  const LengthCacheEntry entry = AllEntries(config).at(0);
  std::atomic<bool> stop{false};
  internal::LockFile held = (*cache)->Lock(entry, stop);
  ASSERT_TRUE(held.held());
  auto wait = [&] { return (*cache)->Lock(entry, stop); };
  auto waiter = std::async(std::launch::async, wait);
  EXPECT_EQ(waiter.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  stop = true;  // a loader that stops waits no more, and holds nothing
  EXPECT_FALSE(waiter.get().held());
  stop = false;
  waiter = std::async(std::launch::async, wait);
  EXPECT_EQ(waiter.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  held.reset();
  EXPECT_TRUE(waiter.get().held());
  // Another entry's lock is another lock.
  EXPECT_TRUE((*cache)->Lock(AllEntries(config).at(1), stop).held());
}

TEST_F(LengthCacheTest, ALoaderThatOwnsPayloadsWaitsForAnEntryCountedElsewhere) {
  const Config config = TextConfig();
  auto cache = LengthCache::Make(config, 0);
  ASSERT_TRUE(cache.ok() && *cache != nullptr);
  std::atomic<bool> stop{false};
  std::vector<internal::LockFile> held;  // another process counts every entry
  for (const LengthCacheEntry& e : AllEntries(config)) {
    held.push_back((*cache)->Lock(e, stop));
    ASSERT_TRUE(held.back().held());
  }
  auto first = std::async(std::launch::async, [&] {
    return Read(config, 1, nullptr, /*payloads=*/true, /*own_payloads=*/true);
  });
  EXPECT_EQ(first.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  held.clear();  // it went away without keeping counts: the loader counts them itself
  ASSERT_EQ(first.get().size(), 1u);
  EXPECT_GE(Entries(), 1);
}

TEST_F(LengthCacheTest, RowsCountedElsewhereAreTokenizedOnlyWhenTheirPayloadIsWanted) {
  const Config config = TextConfig();
  const auto plain = Read(config, 250, nullptr, /*payloads=*/true);
  ASSERT_EQ(plain.size(), 250u);
  // A loader that builds everything keeps no counts.
  ASSERT_FALSE(stdfs::exists(dir_->Sub("lens")));
  // The first process counts (and tokenizes) every entry and keeps the counts.
  SourceProfile counted;
  const auto first =
      Read(config, 250, nullptr, /*payloads=*/true, /*own_payloads=*/true, &counted);
  EXPECT_EQ(Entries(), kEntries);
  // The next finds them all and tokenizes nothing until a payload is wanted.
  int64_t hits = -1;
  SourceProfile later;
  const auto second =
      Read(config, 250, &hits, /*payloads=*/true, /*own_payloads=*/true, &later);
  EXPECT_GE(hits, 2 * kEntries);
  ASSERT_EQ(first.size(), plain.size());
  ASSERT_EQ(second.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    const Sample* both[] = {&first[i], &second[i]};
    for (const Sample* s : both) {
      EXPECT_EQ(s->meta.file, plain[i].meta.file) << i;
      EXPECT_EQ(s->meta.row, plain[i].meta.row) << i;
      EXPECT_EQ(s->meta.tokens, plain[i].meta.tokens) << i;
      ASSERT_TRUE(s->payload) << i;
      auto a = s->payload.Get();
      auto b = plain[i].payload.Get();
      ASSERT_TRUE(a.ok() && b.ok()) << i;
      EXPECT_EQ((*a)->tokens, (*b)->tokens) << i;
    }
  }
  // Every payload of the second was made on demand; of the first, only those of rows
  // past its first epoch (the files hold 120 rows), whose counts it had kept itself.
  EXPECT_EQ(counted.payloads_finished, 250 - 120);
  EXPECT_EQ(later.payloads_finished, 250);
}

TEST_F(LengthCacheTest, LoadersThatOwnPayloadsAtOnceGiveTheStreamOfOneAlone) {
  const Config config = TextConfig();
  const auto plain = Read(config, 250, nullptr, /*payloads=*/true);
  std::vector<std::future<std::vector<Sample>>> ranks;
  for (int k = 0; k < 3; ++k) {
    ranks.push_back(std::async(std::launch::async, [&] {
      SourceProfile made;  // (its payloads made before the loader goes)
      return Read(config, 250, nullptr, /*payloads=*/true, /*own_payloads=*/true, &made);
    }));
  }
  for (auto& rank : ranks) {
    const auto samples = rank.get();
    ASSERT_EQ(samples.size(), plain.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(samples[i].meta.row, plain[i].meta.row) << i;
      EXPECT_EQ(samples[i].meta.tokens, plain[i].meta.tokens) << i;
      auto a = samples[i].payload.Get();
      auto b = plain[i].payload.Get();
      ASSERT_TRUE(a.ok() && b.ok()) << i;
      EXPECT_EQ((*a)->tokens, (*b)->tokens) << i;
    }
  }
  EXPECT_EQ(Entries(), kEntries);
}

}  // namespace
}  // namespace braid
