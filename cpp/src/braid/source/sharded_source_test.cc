#include "braid/source/sharded_source.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "braid/testing/memory_stream.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

// A source of three files with 90, 100 and 110 rows in row groups of 7 (300 rows), read
// in windows of at least 20 rows: 11 to 15 windows per epoch.
class ShardedSourceTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    testing::LengthSpec spec;
    spec.median_tokens = 30;
    spec.max_tokens = 200;
    for (int f = 0; f < 3; ++f) {
      testing::TokenFileOptions opts;
      opts.row_group_rows = 7;
      opts.null_rows = {int64_t{5} + f};  // one null row per file: skips keep their place
      ASSERT_TRUE(testing::WriteTokenFile(
                      dir_.Sub("src/part-" + std::to_string(f) + ".parquet"),
                      testing::RandomDocs(90 + 10 * f, spec, uint64_t(f + 11)), opts)
                      .ok());
    }
    config_.seed = 9;
    config_.batch.seq_len = 128;
    config_.batch.global_tokens = 128;
    SourceConfig s;
    s.name = "src";
    s.path = dir_.Sub("src");
    s.tokens_column = "input_ids";
    s.shuffle_window_rows = 20;
    s.on_error = OnError::kSkip;
    config_.sources.push_back(s);
  }

  std::unique_ptr<ShardedSource> Make(int64_t shards, StreamPos start = {},
                                      SourceLoader::Options options = {}) {
    auto source = ShardedSource::Make(config_, 0, start, std::move(options), shards);
    EXPECT_TRUE(source.ok()) << source.status().ToString();
    return source.ok() ? std::move(*source) : nullptr;
  }

  // Which shard read each (epoch, window) (Options::on_read_window).
  struct Readers {
    std::mutex mu;
    std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> by_window;  // GUARDED_BY(mu)
  };
  static SourceLoader::Options Recording(Readers* r) {
    SourceLoader::Options o;
    o.on_read_window = [r](int64_t shard, int64_t epoch, int64_t window) {
      std::lock_guard<std::mutex> lock(r->mu);
      r->by_window[{epoch, window}].push_back(shard);
    };
    return o;
  }

  // Metadata and payload tokens of the next n samples.
  using Item = std::tuple<int32_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                          SkipReason, std::vector<int32_t>>;
  std::vector<Item> Read(SampleStream* stream, int64_t n) {
    std::vector<Item> items;
    for (int64_t i = 0; i < n; ++i) {
      auto s = stream->Next();
      EXPECT_TRUE(s.ok()) << s.status().ToString();
      if (!s.ok()) break;
      std::vector<int32_t> tokens;
      if (s->payload) {
        auto p = s->payload.Get();
        EXPECT_TRUE(p.ok());
        if (p.ok()) tokens.assign((*p)->tokens.begin(), (*p)->tokens.end());
      }
      const SampleMeta& m = s->meta;
      items.emplace_back(m.file, m.row, m.epoch, m.pos.window, m.pos.offset, m.tokens,
                         m.skip, std::move(tokens));
    }
    return items;
  }

  testing::ScopedTempDir dir_{"braid-sharded"};
  Config config_;
};

TEST_P(ShardedSourceTest, SameStreamAsOneLoaderAcrossEpochs) {
  const int64_t n = GetParam();
  auto one = Make(1);
  auto many = Make(n);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(many, nullptr);
  EXPECT_EQ(many->shards(), n);
  // Two and a half epochs: the epoch boundaries fall inside the stream.
  const auto expected = Read(one.get(), 750);
  const auto got = Read(many.get(), 750);
  ASSERT_EQ(expected.size(), 750u);
  EXPECT_EQ(got, expected);
  int64_t skipped = 0;
  for (const auto& item : got) skipped += std::get<6>(item) != SkipReason::kNone;
  EXPECT_GE(skipped, 6);  // the null rows of two epochs are in the stream, in place
}

TEST_P(ShardedSourceTest, ResumesMidWindowLikeOneLoader) {
  const int64_t n = GetParam();
  auto reference = Make(1);
  ASSERT_NE(reference, nullptr);
  const auto all = Read(reference.get(), 400);
  // Start inside a window of epoch 0, at a window's first row, and in epoch 1.
  for (int64_t at : {int64_t{37}, int64_t{0}, int64_t{333}}) {
    SCOPED_TRACE("start at sample " + std::to_string(at));
    auto pos_of = [&](int64_t i) {
      return StreamPos{std::get<2>(all[size_t(i)]), std::get<3>(all[size_t(i)]),
                       std::get<4>(all[size_t(i)])};
    };
    auto many = Make(n, pos_of(at));
    ASSERT_NE(many, nullptr);
    const auto got = Read(many.get(), 400 - at);
    EXPECT_EQ(got, std::vector<Item>(all.begin() + at, all.end()));
  }
}

TEST_P(ShardedSourceTest, LoadersReadOnlyTheirOwnWindows) {
  const int64_t n = GetParam();
  Readers r;
  SourceLoader::Options o = Recording(&r);
  auto source = Make(n, {}, o);
  ASSERT_NE(source, nullptr);
  Read(source.get(), 300);  // epoch 0
  source->Stop();
  const auto windows = EpochWindows(source->loader(0).file_list(), config_.seed, 0,
                                    /*epoch=*/0, /*window_rows=*/20);
  std::lock_guard<std::mutex> lock(r.mu);
  auto& readers = r.by_window;
  for (int64_t w = 0; w < int64_t(windows.size()); ++w) {
    // Each window of the epoch was read once, by its owner.
    const std::vector<int64_t> owner = {w % n};
    EXPECT_EQ(readers[std::make_pair(int64_t{0}, w)], owner) << "window " << w;
  }
  for (const auto& [at, shards] : readers) {
    for (int64_t k : shards) EXPECT_EQ(at.second % n, k) << "window " << at.second;
  }
}

// Unreadable files under on_error: skip: a truncated file (no footer) and a corrupt row
// group give the same stream, skips and skipped files for every loader count, and the
// truncated file is logged once, not once per loader.
TEST_P(ShardedSourceTest, UnreadableFilesSkipTheSameForAnyLoaderCount) {
  const int64_t n = GetParam();
  const std::string truncated = dir_.Sub("src/part-0.parquet");
  ASSERT_TRUE(testing::TruncateFile(truncated).ok());
  ASSERT_TRUE(testing::CorruptRowGroup(dir_.Sub("src/part-2.parquet"), 3).ok());
  auto one = Make(1);
  ASSERT_NE(one, nullptr);
  const auto expected = Read(one.get(), 500);  // two epochs of 210 rows and more
  ::testing::internal::CaptureStderr();
  auto many = Make(n);
  ASSERT_NE(many, nullptr);
  const auto got = Read(many.get(), 500);
  const auto skipped_files = many->skipped_files();
  many->Stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(expected.size(), 500u);
  EXPECT_EQ(got, expected);
  int64_t corrupt_rows = 0;
  for (const auto& item : got) {
    EXPECT_NE(std::get<0>(item), 0);  // the truncated file yields nothing
    const int64_t row = std::get<1>(item);
    if (std::get<0>(item) == 2 && row >= 21 && row < 28) {
      EXPECT_EQ(std::get<6>(item), SkipReason::kError);
      ++corrupt_rows;
    }
  }
  EXPECT_GE(corrupt_rows, 14);  // the row group's 7 rows in each of two epochs
  EXPECT_EQ(skipped_files, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(many->unreadable_files(), 1);
  const std::string line = "skipped file " + truncated + ":";
  const size_t first = log.find(line);
  EXPECT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find(line, first + 1), std::string::npos) << "logged twice: " << log;
}

// Row groups larger than a window are read in blocks. Each unit's blocks go to one
// loader (the owner of the unit), which so reads the unit's stream once: every window
// that begins with a unit's block is read by that unit's owner, the same stream comes out
// as from one loader, and every loader owns units.
TEST_P(ShardedSourceTest, OneLoaderReadsEveryBlockOfAUnit) {
  const int64_t n = GetParam();
  config_.sources[0].shuffle_window_bytes = 256;  // every row group cut into blocks
  Readers r;
  SourceLoader::Options o = Recording(&r);
  auto one = Make(1);
  auto many = Make(n, {}, o);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(many, nullptr);
  EXPECT_EQ(many->shards(), n);
  EXPECT_EQ(Read(many.get(), 450), Read(one.get(), 450));  // past two epochs
  many->Stop();
  const auto& files = many->loader(0).file_list();
  const auto owners = UnitOwners(files, 256, n);
  ASSERT_EQ(owners.size(), files.size());
  std::set<int64_t> owning;
  for (const auto& f : owners) owning.insert(f.begin(), f.end());
  EXPECT_EQ(int64_t(owning.size()), n);
  const auto windows = EpochWindows(files, config_.seed, 0, /*epoch=*/0, 20, 256);
  std::lock_guard<std::mutex> lock(r.mu);
  auto& readers = r.by_window;
  int64_t continued = 0;
  for (int64_t w = 0; w < int64_t(windows.size()); ++w) {
    const auto [file, rg] = windows[size_t(w)].row_groups.front();
    const std::vector<int64_t> owner = {owners[size_t(file)][size_t(rg)]};
    EXPECT_EQ(readers[std::make_pair(int64_t{0}, w)], owner) << "window " << w;
    continued += windows[size_t(w)].blocks.front() > 0;
  }
  EXPECT_GT(continued, 20);  // windows that begin with a unit's later block
}

INSTANTIATE_TEST_SUITE_P(Shards, ShardedSourceTest, ::testing::Values(1, 2, 3));

TEST_F(ShardedSourceTest, ShardsAreLoweredToTheFewestWindowsOfAnEpoch) {
  // 300 rows in windows of 20..26 rows: at least 12 windows in any epoch.
  const int64_t fewest = MinWindowsPerEpoch(Make(1)->loader(0).file_list(), 20);
  EXPECT_EQ(fewest, 12);
  for (int64_t epoch = 0; epoch < 20; ++epoch) {
    EXPECT_GE(int64_t(EpochWindows(Make(1)->loader(0).file_list(), config_.seed, 0, epoch,
                                   20)
                          .size()),
              fewest);
  }
  auto many = Make(40);
  ASSERT_NE(many, nullptr);
  EXPECT_EQ(many->shards(), fewest);
  const auto expected = Read(Make(1).get(), 320);
  EXPECT_EQ(Read(many.get(), 320), expected);
}

TEST_F(ShardedSourceTest, BadShardCountIsAConfigError) {
  auto source = ShardedSource::Make(config_, 0, {}, {}, 0);
  ASSERT_FALSE(source.ok());
  EXPECT_NE(source.status().message().find("sources[0].loaders"), std::string::npos);
  SourceLoader::Options o;
  o.shard_index = 2;
  o.shard_count = 2;
  EXPECT_FALSE(SourceLoader::Make(config_, 0, {}, o).ok());
}

}  // namespace
}  // namespace braid
