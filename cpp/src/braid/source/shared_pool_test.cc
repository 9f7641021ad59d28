// Source loaders on one shared ReadPool: the stream does not depend on the pool's thread
// count, the memory budget or how consumers interleave, and threads do not grow with
// the number of sources.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "braid/exec/read_pool.h"
#include "braid/source/source_loader.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"
#include "braid/testing/process_stats.h"

namespace braid {
namespace {

// Threads of this process (/proc/self/status).
using ::braid::testing::ProcessThreads;

struct Got {
  StreamPos pos;
  int32_t file = 0;
  int64_t row = 0;
  int64_t tokens = 0;
  std::vector<int32_t> ids;
  bool operator==(const Got&) const = default;
};

class SharedPoolTest : public ::testing::Test {
 protected:
  static constexpr int kSources = 9;

  void SetUp() override {
    testing::LengthSpec spec;
    spec.median_tokens = 30;
    spec.max_tokens = 300;
    config_.seed = 11;
    config_.batch.seq_len = 128;
    config_.batch.global_tokens = 128;
    for (int s = 0; s < kSources; ++s) {
      for (int f = 0; f < 2; ++f) {
        testing::TokenFileOptions o;
        o.row_group_rows = 7 + s;
        ASSERT_TRUE(testing::WriteTokenFile(
                        dir_.Sub("s" + std::to_string(s) + "/part-" + std::to_string(f) +
                                 ".parquet"),
                        testing::RandomDocs(23 + 5 * s + f, spec, 100 * s + f), o)
                        .ok());
      }
      SourceConfig sc;
      sc.name = "s" + std::to_string(s);
      sc.path = dir_.Sub("s" + std::to_string(s));
      sc.tokens_column = "input_ids";
      sc.shuffle_window_rows = 10 + s;
      sc.workers = 1 + s % 3;
      config_.sources.push_back(sc);
    }
  }

  // `rounds` rounds in which source i gives i + 1 samples, every loader on one pool.
  std::vector<std::vector<Got>> Pull(const std::shared_ptr<ReadPool>& pool,
                                     int64_t read_ahead, bool payloads, int rounds,
                                     const std::vector<StreamPos>& start = {}) {
    std::vector<std::unique_ptr<SourceLoader>> loaders;
    for (int s = 0; s < kSources; ++s) {
      SourceLoader::Options o;
      o.pool = pool;
      o.read_ahead_bytes = read_ahead;
      o.read_payloads = payloads;
      auto loader = SourceLoader::Make(config_, s, start.empty() ? StreamPos{} : start[s], o);
      EXPECT_TRUE(loader.ok()) << loader.status().ToString();
      if (!loader.ok()) return {};
      loaders.push_back(std::move(*loader));
    }
    for (auto& l : loaders) l->Start();
    std::vector<std::vector<Got>> out(kSources);
    for (int r = 0; r < rounds; ++r) {
      for (int s = 0; s < kSources; ++s) {
        for (int k = 0; k <= s; ++k) {
          auto sample = loaders[size_t(s)]->Next();
          EXPECT_TRUE(sample.ok()) << sample.status().ToString();
          if (!sample.ok()) return {};
          Got g{sample->meta.pos, sample->meta.file, sample->meta.row, sample->meta.tokens,
                {}};
          if (sample->payload) {
            auto p = sample->payload.Get();
            EXPECT_TRUE(p.ok());
            g.ids.assign((*p)->tokens.begin(), (*p)->tokens.end());
          }
          out[size_t(s)].push_back(std::move(g));
        }
      }
    }
    return out;
  }

  Config config_;
  testing::ScopedTempDir dir_;
};

TEST_F(SharedPoolTest, SameStreamForAnyThreadCountAndBudgetAcrossEpochs) {
  // 40 rounds: source 0 (46 rows) and source 8 (9 * 40 = 360 > 2 * 127 rows) run through
  // several epochs.
  const auto reference = Pull(nullptr, int64_t{64} << 20, true, 40);
  ASSERT_EQ(reference.size(), size_t(kSources));
  EXPECT_GT(reference[8].back().pos.epoch, 0);
  for (int64_t threads : {1, 2, 8}) {
    auto pool = std::make_shared<ReadPool>(threads);
    for (int64_t budget : {int64_t{1}, int64_t{300}, int64_t{64} << 20}) {
      EXPECT_EQ(Pull(pool, budget, true, 40), reference)
          << threads << " threads, budget " << budget;
    }
  }
}

TEST_F(SharedPoolTest, MetadataOnlyStreamMatchesThePayloadStream) {
  const auto full = Pull(nullptr, int64_t{64} << 20, true, 20);
  auto pool = std::make_shared<ReadPool>(2);
  const auto meta = Pull(pool, 1000, false, 20);
  ASSERT_EQ(meta.size(), full.size());
  for (size_t s = 0; s < full.size(); ++s) {
    ASSERT_EQ(meta[s].size(), full[s].size());
    for (size_t i = 0; i < full[s].size(); ++i) {
      EXPECT_EQ(meta[s][i].pos, full[s][i].pos);
      EXPECT_EQ(meta[s][i].tokens, full[s][i].tokens);
      EXPECT_TRUE(meta[s][i].ids.empty());
    }
  }
}

TEST_F(SharedPoolTest, ResumesFromMidWindowPositionsOnAnyPool) {
  const auto reference = Pull(nullptr, int64_t{64} << 20, true, 30);
  // Each source resumes at a sample inside a window of epoch 0 or 1.
  std::vector<StreamPos> start;
  std::vector<size_t> from;
  for (int s = 0; s < kSources; ++s) {
    const auto& ref = reference[size_t(s)];
    size_t i = (7 * size_t(s) + 3) % (ref.size() / 2);
    while (ref[i].pos.offset == 0) ++i;  // inside a window
    start.push_back(ref[i].pos);
    from.push_back(i);
  }
  for (int64_t threads : {1, 8}) {
    for (int64_t budget : {int64_t{1}, int64_t{64} << 20}) {
      const auto resumed = Pull(std::make_shared<ReadPool>(threads), budget, true, 10, start);
      for (int s = 0; s < kSources; ++s) {
        for (size_t k = 0; k < resumed[size_t(s)].size(); ++k) {
          ASSERT_LT(from[size_t(s)] + k, reference[size_t(s)].size());
          ASSERT_EQ(resumed[size_t(s)][k], reference[size_t(s)][from[size_t(s)] + k])
              << "source " << s << " sample " << k << ", " << threads << " threads";
        }
      }
    }
  }
}

// Windows bounded in bytes: row groups larger than the bound are read in blocks.
TEST_F(SharedPoolTest, ByteBoundedWindowsCoverEveryRowOnceAndCutLargeRowGroups) {
  for (auto& s : config_.sources) s.shuffle_window_bytes = 700;
  for (int s = 0; s < kSources; ++s) {
    auto loader = SourceLoader::Make(config_, s, StreamPos{}, {});
    ASSERT_TRUE(loader.ok()) << loader.status().ToString();
    const auto& files = (*loader)->file_list();
    for (int64_t epoch : {0, 1}) {
      const auto windows = EpochWindows(files, config_.seed, s, epoch, 10 + s, 700);
      std::map<std::pair<int32_t, int64_t>, int> seen;  // (file, row)
      bool cut = false;
      for (const auto& w : windows) {
        ASSERT_EQ(w.row_groups.size(), w.block_rows.size());
        int64_t rows = 0;
        for (size_t e = 0; e < w.row_groups.size(); ++e) {
          const auto [f, rg] = w.row_groups[e];
          const auto& file = files[size_t(f)];
          const int64_t rg_rows = file.row_group_rows[size_t(rg)];
          int64_t first = 0, n = rg_rows;
          if (w.block_rows[e] > 0) {
            cut = true;
            EXPECT_GT(file.row_group_bytes[size_t(rg)], 700);
            first = w.blocks[e] * w.block_rows[e];
            n = std::min(w.block_rows[e], rg_rows - first);
            // A row group's blocks follow each other.
            if (w.blocks[e] > 0 && e > 0) {
              EXPECT_EQ(w.row_groups[e - 1], w.row_groups[e]);
              EXPECT_EQ(w.blocks[e - 1] + 1, w.blocks[e]);
            }
          }
          for (int64_t r = first; r < first + n; ++r) {
            ++seen[{f, file.row_group_first_row[size_t(rg)] + r}];
          }
          rows += n;
        }
        EXPECT_EQ(rows, w.rows);
        if (w.row_groups.size() > 1) EXPECT_LE(w.bytes, 700);
      }
      EXPECT_EQ(int64_t(seen.size()), (*loader)->rows_per_epoch());
      for (const auto& [key, count] : seen) EXPECT_EQ(count, 1);
      EXPECT_TRUE(cut) << "source " << s << ": no row group was cut";
    }
  }
  // The loader delivers those rows, with their tokens, for any pool and budget.
  const auto reference = Pull(nullptr, int64_t{64} << 20, true, 30);
  for (int64_t threads : {1, 8}) {
    for (int64_t budget : {int64_t{1}, int64_t{64} << 20}) {
      EXPECT_EQ(Pull(std::make_shared<ReadPool>(threads), budget, true, 30), reference);
    }
  }
  // Each epoch holds every row once, with the tokens of that row.
  for (int s = 0; s < kSources; ++s) {
    std::map<std::pair<int32_t, int64_t>, std::vector<int32_t>> first_epoch;
    for (const auto& g : reference[size_t(s)]) {
      auto [it, fresh] = first_epoch.try_emplace({g.file, g.row}, g.ids);
      if (!fresh) EXPECT_EQ(it->second, g.ids) << "the same row with other tokens";
      EXPECT_EQ(int64_t(g.ids.size()), g.tokens);
    }
  }
}

// A row group larger than the streaming reader's chunk and the window bound: blocks span
// several chunks and chunks span block boundaries; shards skip blocks (reopening).
TEST(BlockReadTest, LargeRowGroupBlocksDeliverEveryRowWithItsTokens) {
  testing::ScopedTempDir dir;
  testing::LengthSpec spec;
  spec.median_tokens = 100;
  spec.sigma = 0.3;
  spec.max_tokens = 400;
  const auto docs = testing::RandomDocs(12000, spec, 9);
  testing::TokenFileOptions o;
  o.row_group_rows = 12000;  // one row group (~2.5 MB in the footer: ids are dictionary
                             // encoded)
  const std::string path = dir.Sub("big.parquet");
  ASSERT_TRUE(testing::WriteTokenFile(path, docs, o).ok());
  Config config;
  config.seed = 2;
  config.batch.seq_len = 128;
  config.batch.global_tokens = 128;
  SourceConfig sc;
  sc.name = "big";
  sc.path = path;
  sc.tokens_column = "input_ids";
  sc.shuffle_window_rows = 4096;
  sc.shuffle_window_bytes = 600 << 10;  // blocks of several chunks
  config.sources.push_back(sc);
  for (int64_t shards : {1, 3}) {
    std::vector<std::unique_ptr<SourceLoader>> loaders;
    for (int64_t k = 0; k < shards; ++k) {
      SourceLoader::Options opt;
      opt.shard_index = k;
      opt.shard_count = shards;
      auto loader = SourceLoader::Make(config, 0, StreamPos{}, opt);
      ASSERT_TRUE(loader.ok()) << loader.status().ToString();
      loaders.push_back(std::move(*loader));
    }
    const auto& file = loaders[0]->file_list()[0];
    // Blocks span several chunks of the streaming reader, which do not divide them.
    ASSERT_GT(file.row_group_bytes[0], 4 * (600 << 10));
    ASSERT_LT(SourceFiles::kBlockChunkBytes, (600 << 10) / 2);
    const auto windows = EpochWindows(loaders[0]->file_list(), 2, 0, 0, 4096, 600 << 10);
    ASSERT_GE(windows.size(), 4u);
    // One row group cut into blocks: its owner reads every block (the others own none
    // and are never started).
    const auto owners = WindowOwners(
        windows, UnitOwners(loaders[0]->file_list(), 600 << 10, shards), shards);
    std::vector<int> seen(docs.size(), 0);
    for (size_t w = 0; w < windows.size(); ++w) {
      EXPECT_EQ(owners[w], 0);
      for (int64_t i = 0; i < windows[w].rows; ++i) {
        auto s = loaders[size_t(owners[w])]->Next();
        ASSERT_TRUE(s.ok()) << s.status().ToString();
        ASSERT_EQ(s->meta.pos, (StreamPos{0, int64_t(w), i}));
        const auto& doc = docs[size_t(s->meta.row)];
        auto p = s->payload.Get();
        ASSERT_TRUE(p.ok());
        ASSERT_EQ(std::vector<int32_t>((*p)->tokens.begin(), (*p)->tokens.end()), doc)
            << "row " << s->meta.row << ", " << shards << " shards";
        ++seen[size_t(s->meta.row)];
      }
    }
    for (int c : seen) ASSERT_EQ(c, 1);
  }
}

TEST_F(SharedPoolTest, ThreadsDoNotGrowWithSources) {
  auto pool = std::make_shared<ReadPool>(2);
  std::vector<std::unique_ptr<SourceLoader>> loaders;
  auto add = [&](int n) {
    for (int i = 0; i < n; ++i) {
      SourceLoader::Options o;
      o.pool = pool;
      auto loader = SourceLoader::Make(config_, i % kSources, StreamPos{}, o);
      ASSERT_TRUE(loader.ok()) << loader.status().ToString();
      ASSERT_TRUE((*loader)->Next().ok());
      loaders.push_back(std::move(*loader));
    }
  };
  add(20);
  const int64_t with_20 = ProcessThreads();
  add(300);
  const int64_t with_320 = ProcessThreads();
  EXPECT_LE(with_320, with_20 + 1) << "threads grew with the number of sources";
  EXPECT_GE(with_20, 3);  // this thread and the pool's two
}

}  // namespace
}  // namespace braid
