// Hugging Face save_to_disk folders (Arrow IPC stream files) as a source: one unit per
// record batch, columns by name, the folder's JSON files left alone, and errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/ipc/api.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "braid/io/source_files.h"
#include "braid/source/source_loader.h"
#include "braid/testing/formats_fixture.h"
#include "braid/testing/memory_stream.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Docs = std::vector<std::vector<int32_t>>;

Docs MakeDocs(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Docs docs(static_cast<size_t>(n));
  for (auto& d : docs) {
    d.resize(1 + rng() % 40);
    for (auto& t : d) t = int32_t(rng() % 30000);
  }
  return docs;
}

// An IPC stream of `docs` in batches of `batch_rows`, columns "text" then "input_ids".
Status WriteStream(const std::string& path, const Docs& docs, int64_t batch_rows) {
  auto schema = arrow::schema({arrow::field("text", arrow::utf8()),
                               arrow::field("input_ids", arrow::list(arrow::int32()))});
  ARROW_ASSIGN_OR_RAISE(auto out, arrow::io::FileOutputStream::Open(path));
  ARROW_ASSIGN_OR_RAISE(auto writer, arrow::ipc::MakeStreamWriter(out, schema));
  for (size_t first = 0; first < docs.size(); first += size_t(batch_rows)) {
    arrow::StringBuilder text;
    arrow::ListBuilder ids(arrow::default_memory_pool(), std::make_shared<arrow::Int32Builder>());
    auto* values = static_cast<arrow::Int32Builder*>(ids.value_builder());
    const size_t end = std::min(docs.size(), first + size_t(batch_rows));
    for (size_t i = first; i < end; ++i) {
      ARROW_RETURN_NOT_OK(text.Append("doc " + std::to_string(i)));
      ARROW_RETURN_NOT_OK(ids.Append());
      ARROW_RETURN_NOT_OK(values->AppendValues(docs[i]));
    }
    std::shared_ptr<arrow::Array> a, b;
    ARROW_RETURN_NOT_OK(text.Finish(&a));
    ARROW_RETURN_NOT_OK(ids.Finish(&b));
    ARROW_RETURN_NOT_OK(writer->WriteRecordBatch(
        *arrow::RecordBatch::Make(schema, int64_t(end - first), {a, b})));
  }
  ARROW_RETURN_NOT_OK(writer->Close());
  return out->Close();
}

SourceConfig Hf(const std::string& path, OnError on_error = OnError::kFail) {
  SourceConfig s;
  s.name = "hf";
  s.path = path;
  s.tokens_column = "input_ids";
  s.on_error = on_error;
  s.shuffle_window_rows = 16;
  return s;
}

// A save_to_disk folder of two shards, with its JSON files.
void WriteFolder(const testing::ScopedTempDir& dir, const std::vector<Docs>& shards) {
  for (size_t k = 0; k < shards.size(); ++k) {
    ASSERT_TRUE(WriteStream(dir.Sub("ds/data-0000" + std::to_string(k) + "-of-0000" +
                                    std::to_string(shards.size()) + ".arrow"),
                            shards[k], 7)
                    .ok());
  }
  std::ofstream(dir.Sub("ds/state.json")) << "{\"_data_files\": []}";
  std::ofstream(dir.Sub("ds/dataset_info.json")) << "{}";
}

TEST(HfArrowFilesTest, EachRecordBatchIsAUnitAndTheStreamHasEveryRowOnce) {
  testing::ScopedTempDir dir("braid-hf");
  std::filesystem::create_directories(dir.Sub("ds"));
  const std::vector<Docs> shards = {MakeDocs(50, 1), MakeDocs(31, 2)};
  WriteFolder(dir, shards);
  auto files = SourceFiles::Open(Hf(dir.Sub("ds")), "sources[0]");
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_EQ((*files)->format(), SourceFormat::kHfArrow);
  ASSERT_EQ((*files)->files().size(), 2u);
  const auto& f = (*files)->files()[0];
  EXPECT_EQ(f.row_group_rows, (std::vector<int64_t>{7, 7, 7, 7, 7, 7, 7, 1}));
  EXPECT_EQ(f.row_group_first_row[3], 21);
  for (int unit : {5, 0, 7}) {
    auto cols = (*files)->ReadColumns(0, unit);
    ASSERT_TRUE(cols.ok()) << cols.status().ToString();
    const auto& list = static_cast<const arrow::ListArray&>(*cols->front());
    ASSERT_EQ(list.length(), f.row_group_rows[size_t(unit)]);
    const auto& values = static_cast<const arrow::Int32Array&>(*list.values());
    for (int64_t i = 0; i < list.length(); ++i) {
      std::vector<int32_t> got;
      for (int64_t k = list.value_offset(i); k < list.value_offset(i + 1); ++k) {
        got.push_back(values.Value(k));
      }
      EXPECT_EQ(got, shards[0][size_t(unit * 7 + i)]);
    }
    auto lengths = (*files)->ReadLengths(0, unit);
    ASSERT_TRUE(lengths.ok());
    EXPECT_EQ((**lengths)[0].tokens, int64_t(shards[0][size_t(unit * 7)].size()));
  }
  Config config;
  config.seed = 2;
  config.batch.seq_len = 64;
  config.batch.global_tokens = 64;
  config.sources.push_back(Hf(dir.Sub("ds")));
  auto loader = SourceLoader::Make(config, 0, {}, {});
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  Status st;
  const auto reads = testing::ReadSamples(loader->get(), 81, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::set<std::pair<int32_t, int64_t>> seen;
  for (const auto& r : reads) {
    EXPECT_TRUE(seen.emplace(r.meta.file, r.meta.row).second);
    ASSERT_NE(r.payload, nullptr);
    EXPECT_EQ(r.payload->tokens, shards[size_t(r.meta.file)][size_t(r.meta.row)]);
  }
  EXPECT_EQ(seen.size(), 81u);
}

TEST(HfArrowFilesTest, NotAStreamOrAMissingColumnNamesTheFile) {
  testing::ScopedTempDir dir("braid-hf");
  std::filesystem::create_directories(dir.Sub("ds"));
  WriteFolder(dir, {MakeDocs(20, 3)});
  std::ofstream(dir.Sub("ds/data-00009-of-00010.arrow")) << "not an arrow stream";
  auto files = SourceFiles::Open(Hf(dir.Sub("ds")), "sources[0]");
  ASSERT_FALSE(files.ok());
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr("data-00009-of-00010.arrow"), HasSubstr("on_error: skip")));
  files = SourceFiles::Open(Hf(dir.Sub("ds"), OnError::kSkip), "sources[0]");
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_EQ((*files)->unreadable_files(), 1);
  EXPECT_EQ((*files)->total_rows(), 20);
  SourceConfig other = Hf(dir.Sub("ds/data-00000-of-00001.arrow"));
  other.tokens_column = "ids";
  auto missing = SourceFiles::Open(other, "sources[0]");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              AllOf(HasSubstr("no column 'ids'"), HasSubstr("input_ids")));
}

// A shard cut short (an interrupted copy): under on_error: fail an error naming it; under
// skip its whole record batches before the cut, read as written.
TEST(HfArrowFilesTest, AShardCutShortYieldsItsBatchesBeforeTheCutUnderSkip) {
  testing::ScopedTempDir dir("braid-hf");
  const Docs docs = MakeDocs(100, 4);
  const std::string path = dir.Sub("data-00000-of-00001.arrow");
  ASSERT_TRUE(WriteStream(path, docs, 7).ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  auto fail = SourceFiles::Open(Hf(path), "sources[0]");
  ASSERT_FALSE(fail.ok());
  EXPECT_THAT(fail.status().message(),
              AllOf(HasSubstr(path), HasSubstr("record batches"),
                    HasSubstr("on_error: skip")));
  auto skip = SourceFiles::Open(Hf(path, OnError::kSkip), "sources[0]");
  ASSERT_TRUE(skip.ok()) << skip.status().ToString();
  const SourceFiles::File& f = (*skip)->files()[0];
  EXPECT_TRUE(f.unreadable.empty());
  EXPECT_THAT(f.damaged, HasSubstr("not an Arrow IPC stream"));
  const int64_t batches = int64_t(f.row_group_rows.size());
  EXPECT_GE(batches, 4);  // about half of the 15 batches
  EXPECT_LT(batches, 15);
  EXPECT_EQ(f.num_rows, 7 * batches);
  for (int64_t b = 0; b < batches; ++b) {
    auto cols = (*skip)->ReadColumns(0, int(b));
    ASSERT_TRUE(cols.ok()) << cols.status().ToString();
    for (int64_t i = 0; i < 7; ++i) {
      EXPECT_EQ(testing::ListRowIds(*cols->front(), i), docs[size_t(7 * b + i)]);
    }
  }
}

}  // namespace
}  // namespace braid
