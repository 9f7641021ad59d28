// Megatron indexed datasets as a source: the index read in pieces, the paths that name a
// dataset, tokens and counts against what was written, the stream's order and errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arrow/api.h>
#include <arrow/io/file.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "braid/io/formats.h"
#include "braid/io/megatron_index.h"
#include "braid/io/source_files.h"
#include "braid/source/source_loader.h"
#include "braid/testing/megatron_fixture.h"
#include "braid/testing/memory_stream.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Docs = std::vector<std::vector<int32_t>>;

Docs MakeDocs(int64_t n, uint64_t seed, int32_t vocab = 30000) {
  testing::LengthSpec spec;
  spec.median_tokens = 30;
  spec.max_tokens = 300;
  Docs docs = testing::RandomDocs(n, spec, seed, vocab);
  docs[1].clear();  // an empty document
  return docs;
}

SourceConfig MegatronSource(const std::string& path, OnError on_error = OnError::kFail) {
  SourceConfig s;
  s.name = "meg";
  s.path = path;
  s.on_error = on_error;
  s.shuffle_window_rows = 64;
  return s;
}

Config OneSource(const SourceConfig& s, uint64_t seed = 3) {
  Config c;
  c.seed = seed;
  c.batch.seq_len = 128;
  c.batch.global_tokens = 128;
  c.sources.push_back(s);
  return c;
}

std::vector<int32_t> ListRow(const arrow::Array& a, int64_t i) {
  std::vector<int32_t> out;
  const auto& list = static_cast<const arrow::ListArray&>(a);
  const auto values = list.values();
  for (int64_t k = list.value_offset(i); k < list.value_offset(i + 1); ++k) {
    if (values->type_id() == arrow::Type::INT64) {
      out.push_back(int32_t(static_cast<const arrow::Int64Array&>(*values).Value(k)));
    } else {
      out.push_back(static_cast<const arrow::Int32Array&>(*values).Value(k));
    }
  }
  return out;
}

// Every document of every unit, read whole, in blocks and as counts.
void ExpectDocuments(SourceFiles* files, int file, const Docs& docs) {
  const auto& f = files->files()[size_t(file)];
  ASSERT_EQ(f.num_rows, int64_t(docs.size()));
  int64_t row = 0;
  for (size_t u = 0; u < f.row_group_rows.size(); ++u) {
    EXPECT_EQ(f.row_group_first_row[u], row);
    auto cols = files->ReadColumns(file, int(u));
    ASSERT_TRUE(cols.ok()) << cols.status().ToString();
    ASSERT_EQ(cols->size(), 1u);
    const auto& a = *cols->front();
    ASSERT_EQ(a.length(), f.row_group_rows[u]);
    auto lengths = files->ReadLengths(file, int(u));
    ASSERT_TRUE(lengths.ok()) << lengths.status().ToString();
    for (int64_t i = 0; i < a.length(); ++i) {
      EXPECT_EQ(ListRow(a, i), docs[size_t(row + i)]) << "document " << row + i;
      EXPECT_EQ((**lengths)[size_t(i)].tokens, int64_t(docs[size_t(row + i)].size()));
      EXPECT_FALSE((**lengths)[size_t(i)].null);
    }
    // Blocks of 3 rows read the same documents.
    const int64_t n = f.row_group_rows[u];
    for (int64_t b = 0; b * 3 < n; ++b) {
      auto block = files->ReadBlock(file, int(u), 3, b);
      ASSERT_TRUE(block.ok()) << block.status().ToString();
      int64_t at = b * 3;
      for (const auto& chunk : *block) {
        for (int64_t i = 0; i < chunk.front()->length(); ++i, ++at) {
          EXPECT_EQ(ListRow(*chunk.front(), i), docs[size_t(row + at)]);
        }
      }
      EXPECT_EQ(at, std::min(n, b * 3 + 3));
    }
    row += n;
  }
}

TEST(MegatronIndexTest, HeaderAndDocumentsOfEveryDtype) {
  testing::ScopedTempDir dir("braid-megatron");
  for (int code : {1, 2, 3, 4, 5, 8}) {
    SCOPED_TRACE(code);
    const Docs docs = MakeDocs(200, uint64_t(code), code <= 2 ? 100 : 30000);
    const std::string prefix = dir.Sub("d" + std::to_string(code));
    testing::MegatronOptions options;
    options.dtype_code = code;
    options.sequences_per_document = code == 4 ? 3 : 1;  // sentence-split documents
    ASSERT_TRUE(testing::WriteMegatronDataset(prefix, docs, options).ok());
    auto idx = arrow::io::ReadableFile::Open(prefix + ".idx");
    ASSERT_TRUE(idx.ok());
    auto index = MegatronIndex::Open(*idx, prefix + ".idx");
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    EXPECT_EQ((*index)->documents(), 200);
    EXPECT_EQ((*index)->sequences(), 200 * options.sequences_per_document);
    EXPECT_EQ((*index)->dtype_code(), code);
    auto some = (*index)->ReadDocuments(10, 5, /*with_pointers=*/true);
    ASSERT_TRUE(some.ok()) << some.status().ToString();
    for (int64_t d = 0; d < 5; ++d) {
      EXPECT_EQ(some->tokens[size_t(d)], int64_t(docs[size_t(10 + d)].size()));
    }
    auto files = SourceFiles::Open(MegatronSource(prefix), "sources[0]");
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    EXPECT_EQ((*files)->format(), SourceFormat::kMegatron);
    ExpectDocuments(files->get(), 0, docs);
  }
}

TEST(MegatronFilesTest, APrefixEitherFileADirectoryOrAGlobNameTheDatasets) {
  testing::ScopedTempDir dir("braid-megatron");
  std::filesystem::create_directories(dir.Sub("data"));
  ASSERT_TRUE(testing::WriteMegatronDataset(dir.Sub("data/b_text_document"),
                                            MakeDocs(50, 1)).ok());
  ASSERT_TRUE(testing::WriteMegatronDataset(dir.Sub("data/a_text_document"),
                                            MakeDocs(70, 2)).ok());
  const std::string a = dir.Sub("data/a_text_document");
  const std::string b = dir.Sub("data/b_text_document");
  for (const auto& [path, expect] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{
           {a, {a}}, {a + ".idx", {a}}, {a + ".bin", {a}},
           {dir.Sub("data"), {a, b}}, {dir.Sub("data/*.idx"), {a, b}},
           {dir.Sub("data/*_document.*"), {a, b}}}) {
    SCOPED_TRACE(path);
    SourceConfig s = MegatronSource(path);
    // A directory or a glob of .idx files is detected as well as named.
    auto files = SourceFiles::Open(s, "sources[0]");
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    std::vector<std::string> got;
    for (const auto& f : (*files)->files()) got.push_back(f.path);
    EXPECT_EQ(got, expect);
    EXPECT_EQ((*files)->total_rows(), expect.size() == 2 ? 120 : 70);
  }
  EXPECT_EQ(DetectFormatFromName(a + ".idx"), SourceFormat::kMegatron);
  EXPECT_EQ(DetectFormatFromName("s3://b/x.bin?endpoint_override=h:1"),
            SourceFormat::kMegatron);
  EXPECT_EQ(DetectFormatFromName(a), SourceFormat::kAuto);
  EXPECT_TRUE(IsLocalMegatronPrefix(a));
  EXPECT_FALSE(IsLocalMegatronPrefix(a + ".idx"));
  EXPECT_FALSE(IsLocalMegatronPrefix(dir.Sub("data/none")));
}

TEST(MegatronFilesTest, AMissingPrefixIsADataErrorNamingTheKey) {
  testing::ScopedTempDir dir("braid-megatron");
  SourceConfig s = MegatronSource(dir.Sub("none"));
  s.format = SourceFormat::kMegatron;
  auto files = SourceFiles::Open(s, "sources[2]");
  ASSERT_FALSE(files.ok());
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr("sources[2].path"), HasSubstr("no Megatron dataset")));
}

TEST(MegatronFilesTest, ABadIndexOrAMissingBinNamesTheFile) {
  testing::ScopedTempDir dir("braid-megatron");
  const std::string good = dir.Sub("a");
  const std::string bad = dir.Sub("b");
  ASSERT_TRUE(testing::WriteMegatronDataset(good, MakeDocs(40, 1)).ok());
  ASSERT_TRUE(testing::WriteMegatronDataset(bad, MakeDocs(40, 2)).ok());
  {
    std::fstream f(bad + ".idx", std::ios::in | std::ios::out | std::ios::binary);
    f.write("NOTMEGA", 7);
  }
  SourceConfig s = MegatronSource(dir.Sub("*.idx"));
  auto files = SourceFiles::Open(s, "sources[0]");
  ASSERT_FALSE(files.ok());
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr(bad + ".idx"), HasSubstr("MMIDIDX"),
                    HasSubstr("on_error: skip")));
  // Skipped: kept in the list, unreadable, with no rows.
  s.on_error = OnError::kSkip;
  files = SourceFiles::Open(s, "sources[0]");
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  ASSERT_EQ((*files)->files().size(), 2u);
  EXPECT_EQ((*files)->files()[1].num_rows, 0);
  EXPECT_THAT((*files)->files()[1].unreadable, HasSubstr("MMIDIDX"));
  EXPECT_EQ((*files)->total_rows(), 40);
  // A missing .bin.
  std::filesystem::remove(good + ".bin");
  auto missing = SourceFiles::Open(MegatronSource(good), "sources[0]");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr(good + ".bin"));
}

TEST(MegatronFilesTest, ATruncatedBinIsADataErrorNamingTheDocuments) {
  testing::ScopedTempDir dir("braid-megatron");
  const std::string prefix = dir.Sub("t");
  const Docs docs = MakeDocs(100, 4);
  ASSERT_TRUE(testing::WriteMegatronDataset(prefix, docs).ok());
  std::filesystem::resize_file(prefix + ".bin",
                               std::filesystem::file_size(prefix + ".bin") / 2);
  auto files = SourceFiles::Open(MegatronSource(prefix), "sources[0]");
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  // Counts come from the index alone: planning still reads them.
  auto lengths = (*files)->ReadLengths(0, 0);
  ASSERT_TRUE(lengths.ok()) << lengths.status().ToString();
  auto cols = (*files)->ReadColumns(0, 0);
  ASSERT_FALSE(cols.ok());
  EXPECT_TRUE(cols.status().IsInvalid()) << cols.status().ToString();  // data, no retry
  EXPECT_THAT(cols.status().message(),
              AllOf(HasSubstr(prefix + ".bin"), HasSubstr("documents 0..")));
}

TEST(MegatronFilesTest, TheStreamHasEveryDocumentOncePerEpochAndPlanningReadsNoToken) {
  testing::ScopedTempDir dir("braid-megatron");
  std::vector<Docs> docs = {MakeDocs(150, 7), MakeDocs(90, 8)};
  ASSERT_TRUE(testing::WriteMegatronDataset(dir.Sub("x0"), docs[0]).ok());
  ASSERT_TRUE(testing::WriteMegatronDataset(dir.Sub("x1"), docs[1]).ok());
  const Config config = OneSource(MegatronSource(dir.Sub("x*.idx")));
  const int64_t rows = 240;
  auto loader = SourceLoader::Make(config, 0, {}, {});
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  Status st;
  const auto reads = testing::ReadSamples(loader->get(), 2 * rows, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::map<int64_t, std::set<std::pair<int32_t, int64_t>>> seen;
  for (const auto& r : reads) {
    const auto& m = r.meta;
    EXPECT_TRUE(seen[m.epoch].emplace(m.file, m.row).second);
    const auto& doc = docs[size_t(m.file)][size_t(m.row)];
    EXPECT_EQ(m.tokens, int64_t(doc.size()));
    if (doc.empty()) {
      EXPECT_EQ(m.skip, SkipReason::kEmpty);
      continue;
    }
    ASSERT_NE(r.payload, nullptr);
    EXPECT_EQ(r.payload->tokens, doc);
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].size(), size_t(rows));
  EXPECT_EQ(seen[1].size(), size_t(rows));
  // Without payloads: the same metadata, from the index alone (the .bin may be gone).
  std::filesystem::remove(dir.Sub("x0.bin"));
  std::filesystem::remove(dir.Sub("x1.bin"));
  {
    std::ofstream(dir.Sub("x0.bin")) << "";  // present, empty: no token can be read
    std::ofstream(dir.Sub("x1.bin")) << "";
  }
  SourceLoader::Options plan_only;
  plan_only.read_payloads = false;
  auto planner = SourceLoader::Make(config, 0, {}, plan_only);
  ASSERT_TRUE(planner.ok()) << planner.status().ToString();
  const auto metas = testing::ReadSamples(planner->get(), 2 * rows, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(metas.size(), reads.size());
  for (size_t i = 0; i < metas.size(); ++i) {
    EXPECT_EQ(metas[i].meta.file, reads[i].meta.file);
    EXPECT_EQ(metas[i].meta.row, reads[i].meta.row);
    EXPECT_EQ(metas[i].meta.tokens, reads[i].meta.tokens);
    EXPECT_EQ(metas[i].meta.skip, reads[i].meta.skip);
  }
}

TEST(MegatronFilesTest, AResumedLoaderContinuesTheSameStream) {
  testing::ScopedTempDir dir("braid-megatron");
  const Docs docs = MakeDocs(300, 9);
  ASSERT_TRUE(testing::WriteMegatronDataset(dir.Sub("r"), docs).ok());
  const Config config = OneSource(MegatronSource(dir.Sub("r")));
  auto whole = SourceLoader::Make(config, 0, {}, {});
  ASSERT_TRUE(whole.ok());
  Status st;
  const auto all = testing::ReadSamples(whole->get(), 400, &st);
  ASSERT_TRUE(st.ok());
  const StreamPos at = all[137].meta.pos;
  auto resumed = SourceLoader::Make(config, 0, at, {});
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  const auto rest = testing::ReadSamples(resumed->get(), 400 - 137, &st);
  ASSERT_TRUE(st.ok());
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].meta.row, all[137 + i].meta.row);
    EXPECT_EQ(rest[i].meta.epoch, all[137 + i].meta.epoch);
  }
}

}  // namespace
}  // namespace braid
