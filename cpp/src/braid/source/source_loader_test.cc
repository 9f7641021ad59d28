#include "braid/source/source_loader.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "braid/testing/memory_stream.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using Docs = std::vector<std::vector<int32_t>>;

// Writes one column `name` holding `array` as a Parquet file.
Status WriteArrayFile(const std::string& path, const std::string& name,
                      const std::shared_ptr<arrow::Array>& array,
                      int64_t row_group_rows = 64) {
  auto table =
      arrow::Table::Make(arrow::schema({arrow::field(name, array->type())}), {array});
  ARROW_ASSIGN_OR_RAISE(auto out, arrow::io::FileOutputStream::Open(path));
  ARROW_RETURN_NOT_OK(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(),
                                                 out, row_group_rows));
  return out->Close();
}

Config OneSourceConfig(const std::string& path, uint64_t seed = 5,
                       int64_t window_rows = 40, OnError on_error = OnError::kFail,
                       const std::string& column = "input_ids") {
  Config c;
  c.seed = seed;
  c.batch.seq_len = 128;
  c.batch.global_tokens = 128;
  SourceConfig s;
  s.name = "src";
  s.path = path;
  s.tokens_column = column;
  s.shuffle_window_rows = window_rows;
  s.on_error = on_error;
  c.sources.push_back(s);
  return c;
}

using Read = Sample;

// The next n samples; a read error fails the test.
std::vector<Sample> ReadN(SampleStream* stream, int64_t n) {
  Status st;
  auto out = braid::testing::ReadSamples(stream, n, &st);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

std::unique_ptr<SourceLoader> MakeLoader(const Config& config, StreamPos start = {},
                                         SourceLoader::Options options = {}) {
  auto loader = SourceLoader::Make(config, 0, start, options);
  EXPECT_TRUE(loader.ok()) << loader.status().ToString();
  return loader.ok() ? std::move(*loader) : nullptr;
}

// A source of three files with 90, 100 and 110 rows in row groups of 17: 300 rows.
class SourceLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::LengthSpec spec;
    spec.median_tokens = 40;
    spec.max_tokens = 400;
    for (int f = 0; f < 3; ++f) {
      docs_.push_back(testing::RandomDocs(90 + 10 * f, spec, uint64_t(f + 1)));
      testing::TokenFileOptions opts;
      opts.row_group_rows = 17;
      ASSERT_TRUE(
          testing::WriteTokenFile(dir_.Sub("src/part-" + std::to_string(f) + ".parquet"),
                                  docs_.back(), opts)
              .ok());
    }
  }
  int64_t total_rows() const { return 300; }
  std::string src() const { return dir_.Sub("src"); }

  testing::ScopedTempDir dir_{"braid-loader"};
  std::vector<Docs> docs_;
};

TEST_F(SourceLoaderTest, EveryRowOncePerEpoch) {
  const Config config = OneSourceConfig(src(), /*seed=*/5, /*window_rows=*/40);
  auto loader = MakeLoader(config);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->rows_per_epoch(), total_rows());
  ASSERT_EQ(loader->files().files().size(), 3u);
  const auto reads = ReadN(loader.get(), 2 * total_rows());
  ASSERT_EQ(int64_t(reads.size()), 2 * total_rows());
  std::map<int64_t, std::set<std::pair<int32_t, int64_t>>> by_epoch;
  StreamPos prev{-1, 0, 0};
  for (int64_t i = 0; i < int64_t(reads.size()); ++i) {
    const auto& m = reads[size_t(i)].meta;
    EXPECT_EQ(m.epoch, i / total_rows());
    EXPECT_EQ(m.pos.epoch, m.epoch);
    EXPECT_EQ(m.source, 0);
    EXPECT_EQ(m.skip, SkipReason::kNone);
    EXPECT_TRUE(by_epoch[m.epoch].emplace(m.file, m.row).second)
        << "row delivered twice: file " << m.file << " row " << m.row;
    // Positions advance by one within a window, or start the next window at 0.
    if (prev.epoch == m.pos.epoch && prev.window == m.pos.window) {
      EXPECT_EQ(m.pos.offset, prev.offset + 1);
    } else {
      EXPECT_EQ(m.pos.offset, 0);
    }
    prev = m.pos;
    const auto& doc = docs_[size_t(m.file)][size_t(m.row)];
    EXPECT_EQ(m.tokens, int64_t(doc.size()));
    ASSERT_NE(reads[size_t(i)].payload, nullptr);
    EXPECT_EQ(reads[size_t(i)].payload->tokens, doc);
  }
  ASSERT_EQ(by_epoch.size(), 2u);
  for (const auto& [epoch, rows] : by_epoch)
    EXPECT_EQ(int64_t(rows.size()), total_rows());
}

TEST_F(SourceLoaderTest, EpochWindowsCoverEveryRowGroupOnce) {
  auto files = SourceFiles::Open(OneSourceConfig(src()).sources[0], "sources[0]");
  ASSERT_TRUE(files.ok());
  for (int64_t window_rows : {1, 17, 40, 1000}) {
    const auto windows = EpochWindows(**files, 5, 0, 0, window_rows);
    std::set<std::pair<int32_t, int32_t>> seen;
    int64_t rows = 0;
    for (size_t w = 0; w < windows.size(); ++w) {
      int64_t sum = 0;
      for (const auto& [f, rg] : windows[w].row_groups) {
        EXPECT_TRUE(seen.emplace(f, rg).second);
        sum += (*files)->files()[size_t(f)].row_group_rows[size_t(rg)];
      }
      EXPECT_EQ(sum, windows[w].rows);
      if (w + 1 < windows.size()) {
        EXPECT_GE(windows[w].rows, window_rows);
      }
      rows += sum;
    }
    EXPECT_EQ(rows, total_rows());
    size_t groups = 0;
    for (const auto& f : (*files)->files()) groups += f.row_group_rows.size();
    EXPECT_EQ(seen.size(), groups);
  }
}

std::vector<std::pair<int32_t, int64_t>> Order(const std::vector<Read>& reads,
                                               int64_t begin, int64_t end) {
  std::vector<std::pair<int32_t, int64_t>> out;
  for (int64_t i = begin; i < end; ++i) {
    out.emplace_back(reads[size_t(i)].meta.file, reads[size_t(i)].meta.row);
  }
  return out;
}

TEST_F(SourceLoaderTest, OrderDependsOnSeedAndEpochOnly) {
  const int64_t n = total_rows();
  auto a = MakeLoader(OneSourceConfig(src(), 5));
  auto b = MakeLoader(OneSourceConfig(src(), 5));
  auto c = MakeLoader(OneSourceConfig(src(), 6));
  ASSERT_TRUE(a && b && c);
  const auto ra = ReadN(a.get(), 2 * n), rb = ReadN(b.get(), 2 * n),
             rc = ReadN(c.get(), 2 * n);
  ASSERT_EQ(int64_t(ra.size()), 2 * n);
  ASSERT_EQ(int64_t(rc.size()), 2 * n);
  EXPECT_EQ(Order(ra, 0, 2 * n), Order(rb, 0, 2 * n));
  EXPECT_NE(Order(ra, 0, n), Order(ra, n, 2 * n)) << "epochs should differ";
  EXPECT_NE(Order(ra, 0, n), Order(rc, 0, n)) << "seeds should differ";
  // Not merely rotated: the first window's rows differ between the epochs.
  auto first = Order(ra, 0, 40), second = Order(ra, n, n + 40);
  std::sort(first.begin(), first.end());
  std::sort(second.begin(), second.end());
  EXPECT_NE(first, second);
}

TEST_F(SourceLoaderTest, WindowOfOneRowReadsFilesInRowGroupOrder) {
  auto loader = MakeLoader(OneSourceConfig(src(), 5, /*window_rows=*/1));
  ASSERT_NE(loader, nullptr);
  const auto reads = ReadN(loader.get(), total_rows());
  // Within a row group rows come in order (no row shuffle).
  for (size_t i = 1; i < reads.size(); ++i) {
    const auto& p = reads[i - 1].meta;
    const auto& m = reads[i].meta;
    if (p.file == m.file && m.row % 17 != 0) {
      EXPECT_EQ(m.row, p.row + 1);
    }
  }
}

TEST_F(SourceLoaderTest, RestartAtAPositionContinuesIdentically) {
  const Config config = OneSourceConfig(src(), 5, 40);
  auto loader = MakeLoader(config);
  ASSERT_NE(loader, nullptr);
  const auto reads = ReadN(loader.get(), 850);
  ASSERT_EQ(reads.size(), 850u);
  // Mid-window, at a window start, and in the second epoch.
  for (int64_t at : {int64_t{137}, int64_t{0}, int64_t{340}}) {
    const StreamPos pos = reads[size_t(at)].meta.pos;
    auto resumed = MakeLoader(config, pos);
    ASSERT_NE(resumed, nullptr);
    const auto more = ReadN(resumed.get(), 500);
    ASSERT_EQ(more.size(), 500u);
    for (size_t k = 0; k < more.size(); ++k) {
      const auto& want = reads[size_t(at) + k];
      const auto& got = more[k];
      ASSERT_EQ(std::tie(got.meta.file, got.meta.row, got.meta.epoch),
                std::tie(want.meta.file, want.meta.row, want.meta.epoch))
          << "from " << at << " sample " << k;
      EXPECT_EQ(got.meta.pos, want.meta.pos);
      EXPECT_EQ(got.payload->tokens, want.payload->tokens);
    }
  }
}

TEST_F(SourceLoaderTest, PositionOnePastAWindowMeansTheNextWindow) {
  const Config config = OneSourceConfig(src(), 5, 40);
  auto loader = MakeLoader(config);
  const auto reads = ReadN(loader.get(), total_rows() + 5);
  ASSERT_EQ(int64_t(reads.size()), total_rows() + 5);
  // The last sample of window 0, and the last of the epoch.
  for (int64_t i : {int64_t{0}, total_rows() - 1}) {
    size_t last = size_t(i);
    while (last + 1 < reads.size() &&
           reads[last + 1].meta.pos.window == reads[last].meta.pos.window &&
           reads[last + 1].meta.epoch == reads[last].meta.epoch) {
      ++last;
    }
    StreamPos past = reads[last].meta.pos;
    ++past.offset;
    auto resumed = MakeLoader(config, past);
    ASSERT_NE(resumed, nullptr);
    auto next = resumed->Next();
    ASSERT_TRUE(next.ok());
    EXPECT_EQ(next->meta.pos, reads[last + 1].meta.pos);
    EXPECT_EQ(next->meta.row, reads[last + 1].meta.row);
  }
  // Beyond that, a position outside the order is an error.
  auto bad = SourceLoader::Make(config, 0, StreamPos{0, 1000, 0}, {});
  EXPECT_TRUE(bad.status().IsInvalid());
  EXPECT_THAT(bad.status().message(), HasSubstr("outside the source"));
  bad = SourceLoader::Make(config, 0, StreamPos{0, 0, -1}, {});
  EXPECT_TRUE(bad.status().IsInvalid());
}

TEST_F(SourceLoaderTest, MetadataOnlyGivesCountsWithoutPayloads) {
  SourceLoader::Options options;
  options.read_payloads = false;
  const Config config = OneSourceConfig(src());
  auto meta = MakeLoader(config, {}, options);
  auto full = MakeLoader(config);
  const auto a = ReadN(meta.get(), total_rows()), b = ReadN(full.get(), total_rows());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].payload, nullptr);
    EXPECT_EQ(a[i].meta.tokens, b[i].meta.tokens);
    EXPECT_EQ(a[i].meta.row, b[i].meta.row);
    EXPECT_GT(a[i].meta.tokens, 0);
  }
}

// Planning reads token counts only (SourceFiles::ReadLengths), with large row groups cut
// into blocks too: every sample's metadata is the run's.
TEST_F(SourceLoaderTest, PlanningFromCountsMatchesTheRunInBlocksAndAcrossEpochs) {
  Config config = OneSourceConfig(src());
  config.sources[0].shuffle_window_bytes = 3000;  // row groups of ~2.5K tokens: blocks
  SourceLoader::Options plan;
  plan.read_payloads = false;
  auto meta = MakeLoader(config, {}, plan);
  auto full = MakeLoader(config);
  const auto a = ReadN(meta.get(), 2 * total_rows() + 7);
  const auto b = ReadN(full.get(), 2 * total_rows() + 7);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].payload, nullptr);
    EXPECT_EQ(a[i].meta.pos, b[i].meta.pos) << i;
    EXPECT_EQ(a[i].meta.file, b[i].meta.file) << i;
    EXPECT_EQ(a[i].meta.row, b[i].meta.row) << i;
    EXPECT_EQ(a[i].meta.tokens, b[i].meta.tokens) << i;
    EXPECT_EQ(a[i].meta.tokens, int64_t(b[i].payload->tokens.size())) << i;
  }
}

TEST_F(SourceLoaderTest, TinyReadAheadStillDeliversTheSameStream) {
  const Config config = OneSourceConfig(src());
  SourceLoader::Options tiny;
  tiny.read_ahead_bytes = 1;  // every sample waits for the previous one to be taken
  auto slow = MakeLoader(config, {}, tiny);
  auto fast = MakeLoader(config);
  const auto a = ReadN(slow.get(), total_rows() + 50);
  const auto b = ReadN(fast.get(), total_rows() + 50);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].meta.pos, b[i].meta.pos);
    EXPECT_EQ(a[i].payload->tokens, b[i].payload->tokens);
  }
}

// The profile counts a read step before its samples reach the queue: a consumer (the
// planner, a run's summary) never holds a sample the profile has not counted yet.
TEST_F(SourceLoaderTest, EverySampleTakenIsAlreadyInTheProfile) {
  const Config config = OneSourceConfig(src());
  SourceLoader::Options tiny;
  tiny.read_ahead_bytes = 1;  // a read step per sample or two: many steps to race
  auto loader = MakeLoader(config, {}, tiny);
  ASSERT_NE(loader, nullptr);
  int64_t tokens = 0;
  for (int64_t taken = 1; taken <= 2 * total_rows(); ++taken) {
    auto s = loader->Next();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    tokens += s->meta.tokens;
    const SourceProfile p = loader->profile();
    ASSERT_GE(p.samples, taken);
    ASSERT_GE(p.rows_read, taken);
    ASSERT_GE(p.tokens, tokens);
  }
}

// The profile's held bytes follow the queue: something is held once reading starts,
// never more than the read-ahead and one batch past it, and never more than the peak.
TEST_F(SourceLoaderTest, TheProfileHoldsWhatTheQueueHolds) {
  const Config config = OneSourceConfig(src());
  SourceLoader::Options options;
  options.read_ahead_bytes = int64_t{16} << 10;
  auto loader = MakeLoader(config, {}, options);
  ASSERT_NE(loader, nullptr);
  int64_t largest = 0;  // the largest sample's charge: 64 bytes and 4 a token
  for (int64_t i = 0; i < 2 * total_rows(); ++i) {
    auto s = loader->Next();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    largest = std::max(largest, 64 + 4 * s->meta.tokens);
    const SourceProfile p = loader->profile();
    ASSERT_LE(p.held_bytes, p.peak_held_bytes);
  }
  const SourceProfile p = loader->profile();
  EXPECT_GT(p.peak_held_bytes, 0);
  // A batch is at most 1024 rows of a token column.
  EXPECT_LE(p.peak_held_bytes, options.read_ahead_bytes + 1024 * largest);
}

TEST_F(SourceLoaderTest, DestroyWhileTheReaderIsBlockedOnAFullQueue) {
  const Config config = OneSourceConfig(src());
  SourceLoader::Options tiny;
  tiny.read_ahead_bytes = 1;
  auto loader = MakeLoader(config, {}, tiny);
  ASSERT_TRUE(loader->Next().ok());
  // Time for the reader to block in Push (the case under test); the destruction below
  // must end whether it did or not, and the watchdog fails the test if it does not.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::promise<void> destroyed;
  std::future<void> done = destroyed.get_future();
  std::thread destroyer([&] {
    loader.reset();
    destroyed.set_value();
  });
  if (done.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    // The join below would hang too: say why and end the test binary.
    std::fprintf(stderr, "FAILED: destroying the loader hung for 30 s\n");
    std::fflush(stderr);
    std::_Exit(1);
  }
  destroyer.join();
  EXPECT_EQ(loader, nullptr);
}

TEST_F(SourceLoaderTest, NextAfterStopIsCancelled) {
  auto loader = MakeLoader(OneSourceConfig(src()));
  ASSERT_TRUE(loader->Next().ok());
  loader->Stop();
  // Whatever was queued may still come out; then Cancelled, never a hang.
  Status st;
  for (int i = 0; i < 10000 && st.ok(); ++i) st = loader->Next().status();
  EXPECT_TRUE(st.IsCancelled()) << st.ToString();
}

TEST_F(SourceLoaderTest, StopBeforeFirstNextStartsNoReader) {
  auto loader = MakeLoader(OneSourceConfig(src()));
  loader->Stop();
  auto s = loader->Next();
  EXPECT_TRUE(s.status().IsCancelled()) << s.status().ToString();
}

// Regression: Next() used to start the reader thread even after Stop(), writing reader_
// while Stop() read it unlocked (a data race ThreadSanitizer reports), as when an Engine
// is destroyed while its planner makes the first Next() call to a source.
TEST_F(SourceLoaderTest, StopRacingTheFirstNextNeverStartsAReaderAfterStop) {
  const Config config = OneSourceConfig(src());
  for (int round = 0; round < 30; ++round) {
    auto loader = MakeLoader(config);
    ASSERT_NE(loader, nullptr);
    std::thread consumer([&] {
      auto s = loader->Next();
      EXPECT_TRUE(s.ok() || s.status().IsCancelled()) << s.status().ToString();
    });
    loader->Stop();
    consumer.join();
    // Whatever was queued before Stop may still come out; then Cancelled, never a hang.
    Status st;
    for (int i = 0; i < 10000 && st.ok(); ++i) st = loader->Next().status();
    EXPECT_TRUE(st.IsCancelled()) << st.ToString();
  }
}

// ---------------------------------------------------------------------------
// Column types and layouts.

TEST(SourceLoaderFormatTest, Int64TokensReadBackExactly) {
  testing::ScopedTempDir dir("braid-loader-int64");
  Docs docs{{1, 2, 3}, {2147483647, 0}, {7}};
  testing::TokenFileOptions opts;
  opts.int64_values = true;
  ASSERT_TRUE(testing::WriteTokenFile(dir.Sub("a.parquet"), docs, opts).ok());
  auto loader = MakeLoader(OneSourceConfig(dir.Sub("a.parquet"), 1, 1));
  ASSERT_NE(loader, nullptr);
  const auto reads = ReadN(loader.get(), 3);
  ASSERT_EQ(reads.size(), 3u);
  for (const auto& r : reads) EXPECT_EQ(r.payload->tokens, docs[size_t(r.meta.row)]);
}

TEST_F(SourceLoaderTest, Int32TokensAreViewsThatOutliveTheLoader) {
  // list<int32> ids are not copied: the payload views the row group's values buffer,
  // charges its own slice, and keeps the buffer alive after the loader is gone.
  std::vector<Sample> reads;
  {
    auto loader = MakeLoader(OneSourceConfig(src()));
    ASSERT_NE(loader, nullptr);
    reads = ReadN(loader.get(), total_rows());
  }
  for (const auto& r : reads) {
    const Payload& p = *r.payload.Get().ValueOrDie();
    EXPECT_TRUE(p.tokens.is_view());
    EXPECT_EQ(p.bytes(), r.meta.tokens * int64_t{sizeof(int32_t)});
    EXPECT_EQ(p.tokens, docs_[size_t(r.meta.file)][size_t(r.meta.row)]);
  }
}

TEST(SourceLoaderFormatTest, Int64TokensAreCopiedIntoOwnedIds) {
  testing::ScopedTempDir dir("braid-loader-int64-owned");
  testing::TokenFileOptions opts;
  opts.int64_values = true;
  ASSERT_TRUE(testing::WriteTokenFile(dir.Sub("a.parquet"), {{5, 6}}, opts).ok());
  auto loader = MakeLoader(OneSourceConfig(dir.Sub("a.parquet"), 1, 1));
  ASSERT_NE(loader, nullptr);
  const auto reads = ReadN(loader.get(), 1);
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_FALSE(reads[0].payload->tokens.is_view());
  EXPECT_EQ(reads[0].payload->tokens, (std::vector<int32_t>{5, 6}));
}

TEST(TokenSpanTest, OwnedAndViewedIdsCopyAndMove) {
  TokenSpan owned(std::vector<int32_t>{1, 2, 3});
  TokenSpan copy = owned;
  EXPECT_EQ(copy, owned);
  EXPECT_NE(copy.data(), owned.data());  // an owned copy has its own ids
  TokenSpan moved = std::move(copy);
  EXPECT_EQ(moved, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(copy.empty());  // NOLINT: a moved-from span is empty
  auto buffer = std::make_shared<std::vector<int32_t>>(std::vector<int32_t>{9, 8, 7, 6});
  TokenSpan view = TokenSpan::View(buffer->data() + 1, 2, buffer);
  buffer.reset();  // the view keeps it alive
  TokenSpan view_copy = view;
  EXPECT_TRUE(view_copy.is_view());
  EXPECT_EQ(view_copy.data(), view.data());  // a viewed copy shares the buffer
  EXPECT_EQ(view_copy, (std::vector<int32_t>{8, 7}));
  EXPECT_EQ(view[1], 7);
  EXPECT_EQ(std::vector<int32_t>(view.begin(), view.end()), (std::vector<int32_t>{8, 7}));
}

TEST(SourceLoaderFormatTest, Int64TokenOutOfInt32RangeIsADataError) {
  testing::ScopedTempDir dir("braid-loader-int64-range");
  auto values = std::make_shared<arrow::Int64Builder>();
  arrow::ListBuilder list(arrow::default_memory_pool(), values);
  ASSERT_TRUE(list.Append().ok());
  ASSERT_TRUE(values->Append(int64_t{1} << 40).ok());
  auto array = list.Finish();
  ASSERT_TRUE(array.ok());
  const std::string path = dir.Sub("big.parquet");
  ASSERT_TRUE(WriteArrayFile(path, "input_ids", *array).ok());
  auto loader = MakeLoader(OneSourceConfig(path, 1, 1));
  auto s = loader->Next();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(),
              AllOf(HasSubstr(path), HasSubstr("does not fit int32")));
}

TEST(SourceLoaderFormatTest, GlobAndPublishedDatasetLayout) {
  testing::ScopedTempDir dir("braid-loader-layout");
  const auto docs0 = testing::RandomDocs(30, {}, 1),
             docs1 = testing::RandomDocs(20, {}, 2);
  ASSERT_TRUE(
      testing::WriteTokenFile(dir.Sub("ds/data/train-00001-of-00002.parquet"), docs1)
          .ok());
  ASSERT_TRUE(
      testing::WriteTokenFile(dir.Sub("ds/data/train-00000-of-00002.parquet"), docs0)
          .ok());
  {
    std::ofstream readme(dir.Sub("ds/README.md"));
    readme << "not parquet\n";
  }
  for (const std::string& path :
       {dir.Sub("ds"), dir.Sub("ds/data/*.parquet"), dir.Sub("ds/*/train-*.parquet")}) {
    SCOPED_TRACE(path);
    auto loader = MakeLoader(OneSourceConfig(path, 3, 8));
    ASSERT_NE(loader, nullptr);
    const auto& files = loader->files().files();
    ASSERT_EQ(files.size(), 2u);
    EXPECT_THAT(files[0].path, HasSubstr("train-00000-of-00002.parquet"));
    EXPECT_THAT(files[1].path, HasSubstr("train-00001-of-00002.parquet"));
    EXPECT_EQ(loader->rows_per_epoch(), 50);
    for (const auto& r : ReadN(loader.get(), 50)) {
      EXPECT_EQ(r.payload->tokens, (r.meta.file == 0 ? docs0 : docs1)[size_t(r.meta.row)]);
    }
  }
}

TEST(SourceLoaderFormatTest, EmptyAndNullRows) {
  testing::ScopedTempDir dir("braid-loader-nulls");
  Docs docs(40, std::vector<int32_t>{4, 5});
  docs[3].clear();  // empty document
  testing::TokenFileOptions opts;
  opts.row_group_rows = 10;
  opts.null_rows = {23};
  const std::string path = dir.Sub("n.parquet");
  ASSERT_TRUE(testing::WriteTokenFile(path, docs, opts).ok());

  // on_error: fail -> the error names the file, the row group and the row, in stream
  // order.
  auto failing = MakeLoader(OneSourceConfig(path, 1, 1, OnError::kFail));
  int64_t before = 0;
  Status st;
  while (true) {
    auto s = failing->Next();
    if (!s.ok()) {
      st = s.status();
      break;
    }
    ++before;
    ASSERT_LT(before, 40);
  }
  EXPECT_TRUE(st.IsInvalid());
  EXPECT_THAT(st.message(), AllOf(HasSubstr(path), HasSubstr("row group 2"),
                                  HasSubstr("row 23"), HasSubstr("null")));
  const auto* detail = GetErrorDetail(st);
  ASSERT_NE(detail, nullptr);
  EXPECT_EQ(detail->kind(), ErrorKind::kData);
  // With window_rows = 1 the row groups come whole: the null row's group holds rows
  // 20-29.
  EXPECT_GE(before, 3);
  // The error is sticky.
  EXPECT_EQ(failing->Next().status().message(), st.message());

  // on_error: skip -> flagged, no tokens, no payload; everything else intact.
  auto skipping = MakeLoader(OneSourceConfig(path, 1, 1, OnError::kSkip));
  int nulls = 0, empties = 0;
  for (const auto& r : ReadN(skipping.get(), 80)) {
    if (r.meta.row == 23) {
      EXPECT_EQ(r.meta.skip, SkipReason::kNull);
      ++nulls;
    } else if (r.meta.row == 3) {
      EXPECT_EQ(r.meta.skip, SkipReason::kEmpty);
      ++empties;
    } else {
      EXPECT_EQ(r.meta.skip, SkipReason::kNone);
      ASSERT_NE(r.payload, nullptr);
      EXPECT_EQ(r.payload->tokens, docs[size_t(r.meta.row)]);
      continue;
    }
    EXPECT_EQ(r.meta.tokens, 0);
    EXPECT_EQ(r.payload, nullptr);
  }
  EXPECT_EQ(nulls, 2);  // once per epoch
  EXPECT_EQ(empties, 2);
  // Planning from the counts alone skips the same rows for the same reasons.
  SourceLoader::Options plan;
  plan.read_payloads = false;
  auto planning = MakeLoader(OneSourceConfig(path, 1, 1, OnError::kSkip), {}, plan);
  auto again = MakeLoader(OneSourceConfig(path, 1, 1, OnError::kSkip));
  const auto p = ReadN(planning.get(), 80), r = ReadN(again.get(), 80);
  ASSERT_EQ(p.size(), r.size());
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].meta.row, r[i].meta.row);
    EXPECT_EQ(p[i].meta.skip, r[i].meta.skip);
    EXPECT_EQ(p[i].meta.tokens, r[i].meta.tokens);
  }
}

TEST(SourceLoaderFormatTest, NullTokenInsideAListIsABadSample) {
  testing::ScopedTempDir dir("braid-loader-null-token");
  auto values = std::make_shared<arrow::Int32Builder>();
  arrow::ListBuilder list(arrow::default_memory_pool(), values);
  for (int row = 0; row < 5; ++row) {
    ASSERT_TRUE(list.Append().ok());
    ASSERT_TRUE(values->Append(row).ok());
    if (row == 2) {
      ASSERT_TRUE(values->AppendNull().ok());
    }
  }
  auto array = list.Finish();
  ASSERT_TRUE(array.ok());
  const std::string path = dir.Sub("t.parquet");
  ASSERT_TRUE(WriteArrayFile(path, "input_ids", *array).ok());
  auto failing = MakeLoader(OneSourceConfig(path, 1, 1, OnError::kFail));
  Status st;
  for (int i = 0; i < 10 && st.ok(); ++i) st = failing->Next().status();
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr(path), HasSubstr("row 2"), HasSubstr("null token")));
  auto skipping = MakeLoader(OneSourceConfig(path, 1, 1, OnError::kSkip));
  for (const auto& r : ReadN(skipping.get(), 5)) {
    EXPECT_EQ(r.meta.skip, r.meta.row == 2 ? SkipReason::kNull : SkipReason::kNone);
  }
  // Planning sees the null id in the levels, without the ids.
  SourceLoader::Options plan;
  plan.read_payloads = false;
  auto planning = MakeLoader(OneSourceConfig(path, 1, 1, OnError::kSkip), {}, plan);
  for (const auto& r : ReadN(planning.get(), 5)) {
    EXPECT_EQ(r.meta.skip, r.meta.row == 2 ? SkipReason::kNull : SkipReason::kNone);
  }
  auto plan_failing = MakeLoader(OneSourceConfig(path, 1, 1, OnError::kFail), {}, plan);
  st = Status::OK();
  for (int i = 0; i < 10 && st.ok(); ++i) st = plan_failing->Next().status();
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr(path), HasSubstr("row 2"), HasSubstr("null token")));
}

// ---------------------------------------------------------------------------
// sources[].length_column: planning reads it alone; a run checks it.

class LengthColumnTest : public ::testing::Test {
 protected:
  // Two files of 70 and 50 rows in row groups of 16, each with a length column "n";
  // `overrides` replace counts of file 0.
  void Write(std::vector<std::pair<int64_t, std::optional<int64_t>>> overrides = {},
             std::vector<int64_t> null_rows = {}, const std::string& folder = "src") {
    docs_.clear();
    testing::LengthSpec spec;
    spec.median_tokens = 40;
    spec.max_tokens = 400;
    for (int f = 0; f < 2; ++f) {
      docs_.push_back(testing::RandomDocs(70 - 20 * f, spec, uint64_t(f + 3)));
      testing::TokenFileOptions o;
      o.row_group_rows = 16;
      o.length_column = "n";
      if (f == 0) {
        o.length_overrides = overrides;
        o.null_rows = null_rows;
      }
      ASSERT_TRUE(testing::WriteTokenFile(
                      dir_.Sub(folder + "/p" + std::to_string(f) + ".parquet"),
                      docs_.back(), o)
                      .ok());
    }
  }
  Config Source(const std::string& length_column, OnError on_error = OnError::kFail,
                const std::string& folder = "src") {
    Config c = OneSourceConfig(dir_.Sub(folder), 7, 24, on_error);
    c.sources[0].length_column = length_column;
    c.sources[0].shuffle_window_bytes = 2500;  // some row groups in blocks
    return c;
  }
  std::string File0() const { return dir_.Sub("src/p0.parquet"); }
  // Reads until an error (at most `n` samples); returns it.
  static Status FirstError(SampleStream* stream, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      auto s = stream->Next();
      if (!s.ok()) return s.status();
    }
    return Status::OK();
  }

  testing::ScopedTempDir dir_{"braid-length-column"};
  std::vector<Docs> docs_;
};

TEST_F(LengthColumnTest, ItChangesNothingInTheStreamOrThePlanningMetadata) {
  Write();
  const int64_t n = 2 * 120 + 11;  // across epochs
  auto without = MakeLoader(Source(""));
  auto with = MakeLoader(Source("n"));
  SourceLoader::Options plan;
  plan.read_payloads = false;
  auto planning = MakeLoader(Source("n"), {}, plan);
  const auto a = ReadN(without.get(), n), b = ReadN(with.get(), n),
             p = ReadN(planning.get(), n);
  ASSERT_EQ(a.size(), size_t(n));
  ASSERT_EQ(b.size(), a.size());
  ASSERT_EQ(p.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].meta.pos, a[i].meta.pos) << i;
    EXPECT_EQ(b[i].payload->tokens, a[i].payload->tokens) << i;
    EXPECT_EQ(b[i].payload->tokens,
              docs_[size_t(b[i].meta.file)][size_t(b[i].meta.row)]) << i;
    EXPECT_EQ(p[i].meta.pos, a[i].meta.pos) << i;
    EXPECT_EQ(p[i].meta.row, a[i].meta.row) << i;
    EXPECT_EQ(p[i].meta.tokens, a[i].meta.tokens) << i;
    EXPECT_EQ(p[i].payload, nullptr);
  }
}

TEST_F(LengthColumnTest, PlanningReadsNoTokenColumnPage) {
  Write();
  // The token ids of file 0's second row group are junk; its lengths are intact.
  ASSERT_TRUE(testing::CorruptRowGroup(File0(), 1, /*column=*/0).ok());
  SourceLoader::Options plan;
  plan.read_payloads = false;
  auto planning = MakeLoader(Source("n"), {}, plan);
  const auto p = ReadN(planning.get(), 120);
  ASSERT_EQ(p.size(), 120u);
  for (const auto& s : p) {
    EXPECT_EQ(s.meta.skip, SkipReason::kNone);
    EXPECT_EQ(s.meta.tokens,
              int64_t(docs_[size_t(s.meta.file)][size_t(s.meta.row)].size()));
  }
  // Without it, planning reads the token column's pages, and a run reads them anyway.
  auto levels = MakeLoader(Source(""), {}, plan);
  const Status st = FirstError(levels.get(), 120);
  EXPECT_THAT(st.message(), AllOf(HasSubstr(File0()), HasSubstr("row group 1")));
  EXPECT_FALSE(FirstError(MakeLoader(Source("n")).get(), 120).ok());
}

TEST_F(LengthColumnTest, AMismatchIsADataErrorInARunWhateverOnError) {
  Write({{21, 5}});  // row 21 (row group 1) says 5 tokens
  ASSERT_NE(docs_[0][21].size(), 5u);
  for (OnError on_error : {OnError::kFail, OnError::kSkip}) {
    auto run = MakeLoader(Source("n", on_error));
    const Status st = FirstError(run.get(), 120);
    ASSERT_FALSE(st.ok());
    EXPECT_TRUE(st.IsInvalid());
    EXPECT_THAT(st.message(),
                AllOf(HasSubstr(File0()), HasSubstr("row group 1"), HasSubstr("row 21"),
                      HasSubstr("length column 'n'"),
                      HasSubstr("sources[0].length_column"), HasSubstr("says 5 tokens"),
                      HasSubstr("holds " + std::to_string(docs_[0][21].size()))));
    const auto* detail = GetErrorDetail(st);
    ASSERT_NE(detail, nullptr);
    EXPECT_EQ(detail->kind(), ErrorKind::kData);
  }
  // Planning trusts the column (it reads nothing else): row 21 counts 5 tokens.
  SourceLoader::Options plan;
  plan.read_payloads = false;
  auto planning = MakeLoader(Source("n"), {}, plan);
  int seen = 0;
  for (const auto& s : ReadN(planning.get(), 120)) {
    if (s.meta.file == 0 && s.meta.row == 21) {
      EXPECT_EQ(s.meta.tokens, 5);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 1);
}

TEST_F(LengthColumnTest, NullsMustAgreeAndANullRowIsSkippedAlike) {
  // A null length for a list, and a length for a null list: errors in a run.
  Write({{9, std::nullopt}}, {}, "a");
  Write({{30, 4}}, /*null_rows=*/{30}, "b");
  const Status a = FirstError(MakeLoader(Source("n", OnError::kSkip, "a")).get(), 200);
  EXPECT_THAT(a.message(), AllOf(HasSubstr(dir_.Sub("a/p0.parquet")), HasSubstr("row 9"),
                                 HasSubstr("length column 'n'"), HasSubstr("is null")));
  const Status b = FirstError(MakeLoader(Source("n", OnError::kSkip, "b")).get(), 200);
  EXPECT_THAT(b.message(), AllOf(HasSubstr(dir_.Sub("b/p0.parquet")), HasSubstr("row 30"),
                                 HasSubstr("says 4 tokens"), HasSubstr("is null")));
  // Both null: planning and the run skip the row as null alike.
  Write({}, /*null_rows=*/{44}, "c");
  SourceLoader::Options plan;
  plan.read_payloads = false;
  auto planning = MakeLoader(Source("n", OnError::kSkip, "c"), {}, plan);
  auto run = MakeLoader(Source("n", OnError::kSkip, "c"));
  const auto p = ReadN(planning.get(), 120), r = ReadN(run.get(), 120);
  ASSERT_EQ(p.size(), r.size());
  int nulls = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].meta.skip, r[i].meta.skip);
    EXPECT_EQ(p[i].meta.tokens, r[i].meta.tokens);
    if (r[i].meta.file == 0 && r[i].meta.row == 44) {
      EXPECT_EQ(p[i].meta.skip, SkipReason::kNull);
      ++nulls;
    }
  }
  EXPECT_EQ(nulls, 1);
}

TEST_F(LengthColumnTest, AMissingColumnIsAConfigErrorNamingTheKeyAndTheFile) {
  Write();
  const auto made = SourceLoader::Make(Source("n_tokens"), 0, {}, {});
  ASSERT_FALSE(made.ok());
  EXPECT_THAT(made.status().message(),
              AllOf(HasSubstr("sources[0].length_column"), HasSubstr(File0()),
                    HasSubstr("no column 'n_tokens'")));
  const auto* detail = GetErrorDetail(made.status());
  ASSERT_NE(detail, nullptr);
  EXPECT_EQ(detail->kind(), ErrorKind::kConfig);
}

// ---------------------------------------------------------------------------
// Bad input: every failure is a Status naming the file (or the path as configured).

Status OpenStatus(const std::string& path, const std::string& column = "input_ids") {
  auto loader =
      SourceLoader::Make(OneSourceConfig(path, 1, 4, OnError::kFail, column), 0, {}, {});
  return loader.status();
}

void ExpectDataError(const Status& st, const std::string& names) {
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr(names)) << st.ToString();
  const auto* detail = GetErrorDetail(st);
  ASSERT_NE(detail, nullptr) << st.ToString();
  EXPECT_EQ(detail->kind(), ErrorKind::kData);
  EXPECT_THAT(detail->where(), HasSubstr(names));
}

class SourceLoaderBadInputTest : public ::testing::Test {
 protected:
  std::string WriteGood(const std::string& name) {
    const std::string path = dir_.Sub(name);
    EXPECT_TRUE(testing::WriteTokenFile(path, testing::RandomDocs(50, {}, 9)).ok());
    return path;
  }
  testing::ScopedTempDir dir_{"braid-loader-bad"};
};

TEST_F(SourceLoaderBadInputTest, MissingPath) {
  const std::string path = dir_.Sub("nope.parquet");
  const Status st = OpenStatus(path);
  ExpectDataError(st, path);
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr("sources[0].path"), HasSubstr("no such file")));
}

TEST_F(SourceLoaderBadInputTest, GlobMatchingNothing) {
  WriteGood("a.parquet");
  const std::string pattern = dir_.Sub("*.arrow");
  const Status st = OpenStatus(pattern);
  ExpectDataError(st, pattern);
  EXPECT_THAT(st.message(), HasSubstr("matches no files"));
  // A glob below a folder that does not exist.
  ExpectDataError(OpenStatus(dir_.Sub("missing/*.parquet")),
                  dir_.Sub("missing/*.parquet"));
}

TEST_F(SourceLoaderBadInputTest, DirectoryWithoutParquetFiles) {
  std::filesystem::create_directories(dir_.Sub("empty/sub"));
  std::ofstream(dir_.Sub("empty/sub/notes.txt")) << "hello";
  const Status st = OpenStatus(dir_.Sub("empty"));
  ExpectDataError(st, dir_.Sub("empty"));
  EXPECT_THAT(st.message(), HasSubstr("no .parquet files"));
}

TEST_F(SourceLoaderBadInputTest, MissingColumn) {
  const std::string path = WriteGood("a.parquet");
  const Status st = OpenStatus(path, "tokens");
  ExpectDataError(st, path);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("no column 'tokens'"), HasSubstr("input_ids"),
                                  HasSubstr("sources[0].tokens_column")));
}

TEST_F(SourceLoaderBadInputTest, WrongColumnTypes) {
  {
    auto values = std::make_shared<arrow::StringBuilder>();
    arrow::ListBuilder list(arrow::default_memory_pool(), values);
    ASSERT_TRUE(list.Append().ok());
    ASSERT_TRUE(values->Append("hello").ok());
    auto array = list.Finish();
    ASSERT_TRUE(array.ok());
    const std::string path = dir_.Sub("strings.parquet");
    ASSERT_TRUE(WriteArrayFile(path, "input_ids", *array).ok());
    const Status st = OpenStatus(path);
    ExpectDataError(st, path);
    EXPECT_THAT(st.message(), AllOf(HasSubstr("string>"),
                                    HasSubstr("expected list<int32> or list<int64>")));
  }
  {
    arrow::Int32Builder scalar;
    ASSERT_TRUE(scalar.AppendValues({1, 2, 3}).ok());
    auto array = scalar.Finish();
    ASSERT_TRUE(array.ok());
    const std::string path = dir_.Sub("scalar.parquet");
    ASSERT_TRUE(WriteArrayFile(path, "input_ids", *array).ok());
    const Status st = OpenStatus(path);
    ExpectDataError(st, path);
    EXPECT_THAT(st.message(), HasSubstr("has type int32"));
  }
  {
    auto values = std::make_shared<arrow::FloatBuilder>();
    arrow::ListBuilder list(arrow::default_memory_pool(), values);
    ASSERT_TRUE(list.Append().ok());
    ASSERT_TRUE(values->Append(1.5f).ok());
    auto array = list.Finish();
    ASSERT_TRUE(array.ok());
    const std::string path = dir_.Sub("floats.parquet");
    ASSERT_TRUE(WriteArrayFile(path, "input_ids", *array).ok());
    ExpectDataError(OpenStatus(path), path);
  }
}

TEST_F(SourceLoaderBadInputTest, OneBadFileAmongGoodOnesIsNamed) {
  WriteGood("dir/a.parquet");
  WriteGood("dir/c.parquet");
  const std::string bad = dir_.Sub("dir/b.parquet");
  std::ofstream(bad) << "this is not parquet at all";
  const Status st = OpenStatus(dir_.Sub("dir"));
  ExpectDataError(st, bad);
  EXPECT_THAT(st.message(), HasSubstr("not a readable Parquet file"));
}

TEST_F(SourceLoaderBadInputTest, TruncatedFile) {
  const std::string path = WriteGood("t.parquet");
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size / 2);
  ExpectDataError(OpenStatus(path), path);
}

TEST_F(SourceLoaderBadInputTest, OverwrittenMagicBytes) {
  const std::string path = WriteGood("m.parquet");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-4, std::ios::end);
    f.write("XXXX", 4);  // the trailing "PAR1"
  }
  ExpectDataError(OpenStatus(path), path);
}

TEST_F(SourceLoaderBadInputTest, CorruptDataPagesFailOnReadNamingTheRowGroup) {
  // A valid footer over garbage column chunks: opening succeeds, reading fails.
  const std::string path = dir_.Sub("pages.parquet");
  testing::TokenFileOptions opts;
  opts.row_group_rows = 10;
  ASSERT_TRUE(testing::WriteTokenFile(path, testing::RandomDocs(40, {}, 4), opts).ok());
  const auto size = std::filesystem::file_size(path);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4);
    const std::string junk(std::min<size_t>(size / 3, 4096), '\x5a');
    f.write(junk.data(), std::streamsize(junk.size()));
  }
  auto loader = SourceLoader::Make(OneSourceConfig(path, 1, 1), 0, {}, {});
  if (!loader.ok()) {  // Arrow may also reject it up front
    std::printf("[ corrupt pages ] rejected when opened\n");
    ExpectDataError(loader.status(), path);
    return;
  }
  std::printf("[ corrupt pages ] rejected when read\n");
  Status st;
  for (int i = 0; i < 100 && st.ok(); ++i) st = (*loader)->Next().status();
  ExpectDataError(st, path);
  EXPECT_THAT(st.message(), HasSubstr("row group"));
}

// Skips are logged on stderr, rate-limited: the first 10 of a source, then every 1000th.
TEST(SourceLoaderSkipLogTest, SkipsAreLoggedWithLocationAndReasonRateLimited) {
  testing::ScopedTempDir dir("braid-skiplog");
  const std::string path = dir.Sub("nulls.parquet");
  testing::TokenFileOptions opts;
  opts.row_group_rows = 2100;  // one row group, read in file order
  Docs docs(2100, std::vector<int32_t>{7, 8});
  for (int64_t r = 0; r < 2100; ++r) {
    if (r % 2 == 0 || r >= 40) opts.null_rows.push_back(r);  // 2080 null rows
  }
  ASSERT_TRUE(testing::WriteTokenFile(path, docs, opts).ok());
  auto loader = MakeLoader(OneSourceConfig(path, /*seed=*/1, /*window_rows=*/1,
                                           OnError::kSkip));
  ASSERT_NE(loader, nullptr);
  ::testing::internal::CaptureStderr();
  const auto reads = ReadN(loader.get(), 2100);
  loader->Stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  int64_t skipped = 0;
  for (const auto& r : reads) skipped += r.meta.skip != SkipReason::kNone;
  EXPECT_EQ(skipped, 2080);
  EXPECT_THAT(log, HasSubstr("braid: source 'src' skipped " + path +
                             " (row group 0, row 0): null column 'input_ids' (skip 1)"));
  EXPECT_THAT(log, HasSubstr("(row group 0, row 18): null column 'input_ids' (skip 10; "
                             "further skips of this source are logged every 1000th)"));
  EXPECT_THAT(log, HasSubstr("(skip 1000)"));
  EXPECT_THAT(log, HasSubstr("(skip 2000)"));
  // The reader may run ahead into the next epoch: every logged count must be one the
  // rate limit allows, and within the first epoch's 2080 skips exactly 12 are logged.
  std::vector<int64_t> logged;
  for (size_t at = log.find("(skip "); at != std::string::npos;
       at = log.find("(skip ", at + 1)) {
    logged.push_back(std::stoll(log.substr(at + 6)));
  }
  std::vector<int64_t> first_epoch;
  for (int64_t n : logged) {
    EXPECT_TRUE(n <= 10 || n % 1000 == 0) << n;
    if (n <= 2080) first_epoch.push_back(n);
  }
  EXPECT_EQ(first_epoch,
            (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1000, 2000}))
      << log;
}

TEST_F(SourceLoaderBadInputTest, SourceWithNoRows) {
  const std::string path = dir_.Sub("empty.parquet");
  ASSERT_TRUE(testing::WriteTokenFile(path, {}).ok());
  const Status st = OpenStatus(path);
  ExpectDataError(st, path);
  EXPECT_THAT(st.message(), HasSubstr("no rows"));
}


// ---------------------------------------------------------------------------
// Unreadable files (source_files.h and source_loader.h, "Unreadable files").

// dir/part-{0,1,2}.parquet with 30, 40 and 50 rows in row groups of 10 (120 rows).
class UnreadableFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::LengthSpec spec;
    spec.median_tokens = 20;
    spec.max_tokens = 100;
    for (int f = 0; f < 3; ++f) {
      docs_.push_back(testing::RandomDocs(30 + 10 * f, spec, uint64_t(f + 21)));
      testing::TokenFileOptions opts;
      opts.row_group_rows = 10;
      ASSERT_TRUE(testing::WriteTokenFile(Part(f), docs_.back(), opts).ok());
    }
  }
  std::string Part(int f) const {
    return dir_.Sub("src/part-" + std::to_string(f) + ".parquet");
  }
  Config JobConfig(OnError on_error, const std::string& path = "") const {
    return OneSourceConfig(path.empty() ? dir_.Sub("src/*.parquet") : path, /*seed=*/3,
                           /*window_rows=*/15, on_error);
  }
  // The next n samples, with the payload's tokens checked against the files.
  std::vector<Sample> ReadChecked(SampleStream* stream, int64_t n) {
    auto reads = ReadN(stream, n);
    for (const auto& r : reads) {
      if (r.meta.skip != SkipReason::kNone) continue;
      auto p = r.payload.Get();
      EXPECT_TRUE(p.ok());
      if (!p.ok()) continue;
      const auto& doc = docs_[size_t(r.meta.file)][size_t(r.meta.row)];
      EXPECT_EQ(std::vector<int32_t>((*p)->tokens.begin(), (*p)->tokens.end()), doc);
    }
    return reads;
  }

  testing::ScopedTempDir dir_{"braid-unreadable"};
  std::vector<Docs> docs_;
};

using Id = std::tuple<int32_t, int64_t, int64_t, int64_t, int64_t, SkipReason>;
std::vector<Id> Ids(const std::vector<Sample>& samples) {
  std::vector<Id> out;
  for (const auto& s : samples) {
    out.emplace_back(s.meta.file, s.meta.row, s.meta.pos.epoch, s.meta.pos.window,
                     s.meta.pos.offset, s.meta.skip);
  }
  return out;
}

TEST_F(UnreadableFileTest, TruncatedFileUnderSkipYieldsNothingAndKeepsFileIndexes) {
  ASSERT_TRUE(testing::TruncateFile(Part(1)).ok());
  auto loader = MakeLoader(JobConfig(OnError::kSkip));
  ASSERT_NE(loader, nullptr);
  const auto& files = loader->file_list();
  ASSERT_EQ(files.size(), 3u);  // kept: indexes stay "index in sorted path order"
  EXPECT_EQ(files[1].path, Part(1));
  EXPECT_THAT(files[1].unreadable, HasSubstr("not a readable Parquet file"));
  EXPECT_TRUE(files[1].row_group_rows.empty());
  EXPECT_TRUE(files[0].unreadable.empty() && files[2].unreadable.empty());
  EXPECT_EQ(loader->rows_per_epoch(), 30 + 50);
  EXPECT_EQ(loader->skipped_files(), std::vector<int32_t>{1});

  ::testing::internal::CaptureStderr();
  const auto reads = ReadChecked(loader.get(), 2 * 80);
  loader->Stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  std::map<int64_t, std::set<std::pair<int32_t, int64_t>>> by_epoch;
  for (const auto& r : reads) {
    EXPECT_EQ(r.meta.skip, SkipReason::kNone);
    EXPECT_NE(r.meta.file, 1);
    EXPECT_TRUE(by_epoch[r.meta.epoch].emplace(r.meta.file, r.meta.row).second);
  }
  EXPECT_EQ(by_epoch[0].size(), 80u);
  EXPECT_EQ(by_epoch[1].size(), 80u);
  EXPECT_THAT(log, HasSubstr("braid: source 'src' skipped file " + Part(1) +
                             ": not a readable Parquet file"));
  EXPECT_THAT(log, HasSubstr("its rows are unknown"));

  // Deterministic: a loader made at any position continues as the first one did.
  for (size_t at : {size_t{0}, size_t{23}, size_t{80}, size_t{117}}) {
    auto resumed = MakeLoader(JobConfig(OnError::kSkip), reads[at].meta.pos);
    ASSERT_NE(resumed, nullptr);
    const auto rest = ReadN(resumed.get(), int64_t(reads.size() - at));
    EXPECT_EQ(Ids(rest), Ids(std::vector<Sample>(reads.begin() + long(at), reads.end())))
        << "resumed at sample " << at;
  }
}

TEST_F(UnreadableFileTest, TruncatedFileUnderFailIsOneLineNamingTheFile) {
  ASSERT_TRUE(testing::TruncateFile(Part(1)).ok());
  auto loader = SourceLoader::Make(JobConfig(OnError::kFail), 0, {}, {});
  ASSERT_FALSE(loader.ok());
  const Status& st = loader.status();
  ExpectDataError(st, Part(1));
  EXPECT_THAT(st.message(), AllOf(HasSubstr("not a readable Parquet file"),
                                  HasSubstr("set on_error: skip")));
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
}

TEST_F(UnreadableFileTest, NoReadableFileLeftIsADataErrorNamingTheSource) {
  for (int f = 0; f < 3; ++f) ASSERT_TRUE(testing::TruncateFile(Part(f)).ok());
  auto loader = SourceLoader::Make(JobConfig(OnError::kSkip), 0, {}, {});
  ASSERT_FALSE(loader.ok());
  ExpectDataError(loader.status(), dir_.Sub("src/*.parquet"));
  EXPECT_THAT(loader.status().message(),
              AllOf(HasSubstr("sources[0] (source 'src')"), HasSubstr("no readable file"),
                    HasSubstr(Part(0))));
}

TEST_F(UnreadableFileTest, CorruptRowGroupUnderSkipIsSkippedWholeWithItsRowsCounted) {
  ASSERT_TRUE(testing::CorruptRowGroup(Part(2), 1).ok());  // rows 10..19 of file 2
  auto loader = MakeLoader(JobConfig(OnError::kSkip));
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->rows_per_epoch(), 120);  // the footer read: the rows are known
  ::testing::internal::CaptureStderr();
  const auto reads = ReadChecked(loader.get(), 120);
  const auto skipped_files = loader->skipped_files();
  loader->Stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  std::set<std::pair<int32_t, int64_t>> seen, skipped;
  for (const auto& r : reads) {
    EXPECT_TRUE(seen.emplace(r.meta.file, r.meta.row).second);
    if (r.meta.skip != SkipReason::kNone) {
      EXPECT_EQ(r.meta.skip, SkipReason::kError);
      skipped.emplace(r.meta.file, r.meta.row);
    }
  }
  EXPECT_EQ(seen.size(), 120u);  // every row keeps its place in the order
  std::set<std::pair<int32_t, int64_t>> expected;
  for (int64_t row = 10; row < 20; ++row) expected.emplace(2, row);
  EXPECT_EQ(skipped, expected);
  EXPECT_EQ(skipped_files, std::vector<int32_t>{2});
  EXPECT_THAT(log,
              HasSubstr("braid: source 'src' skipped " + Part(2) + " (row group 1): "));
  EXPECT_THAT(log, HasSubstr("its 10 rows are skipped"));
  EXPECT_EQ(log.find("(row group 1, row "), std::string::npos) << "logged per row:\n" << log;

  // Resuming inside the window that holds the bad row group gives the same stream.
  size_t first_skip = 0;
  while (reads[first_skip].meta.skip == SkipReason::kNone) ++first_skip;
  for (size_t at : {first_skip, first_skip + 1}) {
    auto resumed = MakeLoader(JobConfig(OnError::kSkip), reads[at].meta.pos);
    ASSERT_NE(resumed, nullptr);
    const auto rest = ReadN(resumed.get(), int64_t(reads.size() - at));
    EXPECT_EQ(Ids(rest), Ids(std::vector<Sample>(reads.begin() + long(at), reads.end())));
  }
}

TEST_F(UnreadableFileTest, CorruptRowGroupUnderFailNamesTheFileAndRowGroup) {
  ASSERT_TRUE(testing::CorruptRowGroup(Part(2), 1).ok());
  auto loader = MakeLoader(JobConfig(OnError::kFail));
  ASSERT_NE(loader, nullptr);
  Status st;
  int64_t delivered = 0;
  for (int i = 0; i < 120 && st.ok(); ++i) {
    auto s = loader->Next();
    st = s.status();
    if (s.ok()) ++delivered;
  }
  ExpectDataError(st, Part(2) + " (row group 1)");
  EXPECT_THAT(st.message(), HasSubstr("set on_error: skip"));
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  EXPECT_LT(delivered, 120);
}

TEST_F(UnreadableFileTest, FileDeletedAfterOpenUnderSkipIsSkippedForTheRun) {
  auto loader = MakeLoader(JobConfig(OnError::kSkip));  // reads every footer
  ASSERT_NE(loader, nullptr);
  ASSERT_TRUE(std::filesystem::remove(Part(1)));  // before the reader starts
  ::testing::internal::CaptureStderr();
  const auto reads = ReadChecked(loader.get(), 2 * 120);
  const auto skipped_files = loader->skipped_files();
  loader->Stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  std::map<int64_t, int64_t> skipped_by_epoch;
  for (const auto& r : reads) {
    EXPECT_EQ(r.meta.skip != SkipReason::kNone, r.meta.file == 1);
    if (r.meta.file == 1) ++skipped_by_epoch[r.meta.epoch];
  }
  EXPECT_EQ(skipped_by_epoch[0], 40);  // all of its rows, counted as skips
  EXPECT_EQ(skipped_by_epoch[1], 40);
  EXPECT_EQ(skipped_files, std::vector<int32_t>{1});
  // Retried (storage), then skipped; logged once, when it was lost.
  EXPECT_THAT(log, AllOf(HasSubstr(Part(1)), HasSubstr("(4 tries)"),
                         HasSubstr("the file is lost for the rest of the run")));
  size_t lines = 0;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    lines += line.find(Part(1)) != std::string::npos;
  }
  EXPECT_EQ(lines, 1u) << log;
}

TEST_F(UnreadableFileTest, FileDeletedAfterOpenUnderFailIsAStorageErrorNamingIt) {
  auto loader = MakeLoader(JobConfig(OnError::kFail));
  ASSERT_NE(loader, nullptr);
  ASSERT_TRUE(std::filesystem::remove(Part(1)));
  Status st;
  for (int i = 0; i < 120 && st.ok(); ++i) st = loader->Next().status();
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(st.IsIOError()) << st.ToString();
  EXPECT_THAT(st.message(), AllOf(HasSubstr(Part(1)), HasSubstr("(4 tries)"),
                                  HasSubstr("set on_error: skip")));
  ASSERT_NE(GetErrorDetail(st), nullptr);
  EXPECT_EQ(GetErrorDetail(st)->kind(), ErrorKind::kData);
}

TEST_F(UnreadableFileTest, EveryFileLostMidRunIsADataErrorNamingTheSource) {
  auto loader = MakeLoader(JobConfig(OnError::kSkip, Part(0)));
  ASSERT_NE(loader, nullptr);
  ASSERT_TRUE(std::filesystem::remove(Part(0)));
  ::testing::internal::CaptureStderr();
  Status st;
  for (int i = 0; i < 100 && st.ok(); ++i) st = loader->Next().status();
  ::testing::internal::GetCapturedStderr();
  ExpectDataError(st, Part(0));
  EXPECT_THAT(st.message(), AllOf(HasSubstr("source 'src'"),
                                  HasSubstr("no readable file left")));
}

// An error passed up through several layers (a reader's record, then the loader's
// unreadable unit) says once how on_error: skip would pass it: the innermost hint.
TEST(SkipHintTest, AnErrorGetsOneHintTheInnermost) {
  const Status record = WithSkipHint(DataError("f.jsonl (row 7)", "bad"), "such records");
  EXPECT_TRUE(IsErrorKind(record, ErrorKind::kData));
  EXPECT_EQ(record.message(), "f.jsonl (row 7): bad (set on_error: skip to skip such "
                              "records)");
  EXPECT_EQ(WithSkipHint(record, "unreadable files").message(), record.message());
  EXPECT_EQ(WithSkipHint(DataError("f", "x"), "such rows").message(),
            "f: x (set on_error: skip to skip such rows)");
}

}  // namespace
}  // namespace braid
