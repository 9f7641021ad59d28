// WebDataset tar shards as a source: members grouped into samples as the webdataset
// package groups them, member columns (bytes, text, integers, JSON members and fields,
// alternatives), blocks in order and behind the reader, missing members and corrupt
// tars under both error policies. Shards are written with libarchive's writer (pax, as
// Python's tarfile writes them; the Python tests use the webdataset package's own).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arrow/api.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "braid/io/format_reader_internal.h"
#include "braid/io/source_files.h"
#include "braid/source/source_loader.h"
#include "braid/testing/memory_stream.h"
#include "braid/testing/temp_dir.h"
#include "braid/testing/formats_fixture.h"

namespace braid {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Members = testing::TarMembers;
using testing::ListRowIds;
using testing::SampleIds;
using testing::SampleIdsJson;
using testing::SampleKey;

// A tar of `members` in order (gzip-compressed when `gzip`).
void WriteTar(const std::string& path, const Members& members, bool gzip = false) {
  ASSERT_TRUE(testing::WriteTarShard(path, members, gzip).ok()) << path;
}

// Sample i: a caption, a class, a JSON record with token ids; every third an image.
Members Shard(int64_t first, int64_t n) {
  Members out;
  for (int64_t i = first; i < first + n; ++i) {
    out.emplace_back(SampleKey(i) + ".txt", "caption " + std::to_string(i));
    out.emplace_back(SampleKey(i) + ".cls", std::to_string(i % 10) + "\n");
    out.emplace_back(SampleKey(i) + ".json", "{\"input_ids\": " + SampleIdsJson(i) +
                                                 ",\n  \"meta\": {\"x\": [1, null]}}");
    if (i % 3 == 0) out.emplace_back(SampleKey(i) + ".jpg", std::string(20 + i, '\xff'));
  }
  return out;
}

SourceConfig Wds(const std::string& path, const std::string& tokens = "json:input_ids",
                 OnError on_error = OnError::kFail) {
  SourceConfig s;
  s.name = "w";
  s.path = path;
  s.tokens_column = tokens;
  s.on_error = on_error;
  s.shuffle_window_rows = 16;
  return s;
}

ColumnSpec Spec(const std::string& name, arrow::Type::type id) {
  return ColumnSpec{name, "sources[0].text_column", [id](const arrow::DataType& t) {
                      return t.id() == id ? std::string() : std::string("another type");
                    }};
}

TEST(WebDatasetFilesTest, TokenListsFromAJsonFieldWholeAndInBlocks) {
  testing::ScopedTempDir dir("braid-wds");
  WriteTar(dir.Sub("a.tar"), Shard(0, 50));
  WriteTar(dir.Sub("b.tar.gz"), Shard(50, 30), /*gzip=*/true);
  auto files = SourceFiles::Open(Wds(dir.path().string()), "sources[0]");
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_EQ((*files)->format(), SourceFormat::kWebDataset);
  ASSERT_EQ((*files)->files().size(), 2u);
  EXPECT_EQ((*files)->total_rows(), 80);
  for (int f = 0; f < 2; ++f) {
    const int64_t first = f == 0 ? 0 : 50;
    const auto& file = (*files)->files()[size_t(f)];
    ASSERT_EQ(file.row_group_rows, std::vector<int64_t>{f == 0 ? 50 : 30});
    EXPECT_GT(file.row_group_bytes[0], 0);
    auto whole = (*files)->ReadColumns(f, 0);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    for (int64_t i = 0; i < file.num_rows; ++i) {
      EXPECT_EQ(ListRowIds(*whole->front(), i), SampleIds(first + i));
    }
    auto lengths = (*files)->ReadLengths(f, 0);
    ASSERT_TRUE(lengths.ok());
    EXPECT_EQ((**lengths)[7].tokens, int64_t(SampleIds(first + 7).size()));
    // Blocks in order, then behind the reader (a resume inside the shard).
    for (int64_t b : {0, 1, 2, 1, 0, 2}) {
      auto block = (*files)->ReadBlock(f, 0, 12, b);
      ASSERT_TRUE(block.ok()) << block.status().ToString();
      int64_t at = b * 12;
      for (const auto& chunk : *block) {
        for (int64_t i = 0; i < chunk.front()->length(); ++i, ++at) {
          EXPECT_EQ(ListRowIds(*chunk.front(), i), SampleIds(first + at)) << at;
        }
      }
      EXPECT_EQ(at, std::min<int64_t>(file.num_rows, b * 12 + 12));
    }
  }
}

TEST(WebDatasetFilesTest, MembersGroupAsWebdatasetGroupsThem) {
  testing::ScopedTempDir dir("braid-wds");
  // Keys with folders and dots after the first; upper-case extensions are lower-cased;
  // names without a dot in the basename and __meta__ members are passed over; a key
  // that comes back later is a new sample (samples are runs of members).
  WriteTar(dir.Sub("g.tar"), {{"__index__", "x"},
                              {"d.1/s0.TXT", "zero"},
                              {"d.1/s0.seg.png", "p"},
                              {"README", "not a member of a sample"},
                              {"d.1/s1.txt", "one"},
                              {"d.1/s0.txt", "zero again"}});
  SourceConfig s = Wds(dir.Sub("g.tar"));
  auto files = SourceFiles::Open(s, "sources[0]",
                                 {Spec("txt", arrow::Type::STRING),
                                  Spec("seg.png;txt", arrow::Type::BINARY)});
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_EQ((*files)->total_rows(), 3);
  auto cols = (*files)->ReadColumns(0, 0);
  ASSERT_TRUE(cols.ok()) << cols.status().ToString();
  const auto& text = static_cast<const arrow::StringArray&>(*(*cols)[0]);
  EXPECT_EQ(text.GetString(0), "zero");
  EXPECT_EQ(text.GetString(1), "one");
  EXPECT_EQ(text.GetString(2), "zero again");
  // Alternatives: the first of them a sample has.
  const auto& alt = static_cast<const arrow::BinaryArray&>(*(*cols)[1]);
  EXPECT_EQ(alt.GetString(0), "p");
  EXPECT_EQ(alt.GetString(1), "one");
  // A class member is an integer; two members of one extension are an error.
  WriteTar(dir.Sub("c.tar"), Shard(0, 4));
  auto classes = SourceFiles::Open(Wds(dir.Sub("c.tar")), "sources[0]",
                                   {Spec("cls", arrow::Type::INT64)});
  ASSERT_TRUE(classes.ok()) << classes.status().ToString();
  auto cls = (*classes)->ReadColumns(0, 0);
  ASSERT_TRUE(cls.ok()) << cls.status().ToString();
  EXPECT_EQ(static_cast<const arrow::Int64Array&>(*cls->front()).Value(3), 3);
  WriteTar(dir.Sub("dup.tar"), {{"a.txt", "x"}, {"a.TXT", "y"}});
  auto dup = SourceFiles::Open(Wds(dir.Sub("dup.tar")), "sources[0]",
                               {Spec("txt", arrow::Type::STRING)});
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(dup.status().message(),
              AllOf(HasSubstr(dir.Sub("dup.tar")), HasSubstr("sample 'a'"),
                    HasSubstr("two members")));
}

TEST(WebDatasetFilesTest, AMissingMemberNamesShardSampleAndMemberOrIsANullUnderSkip) {
  testing::ScopedTempDir dir("braid-wds");
  Members m = Shard(0, 6);
  m.erase(std::remove_if(m.begin(), m.end(),
                         [](const auto& x) { return x.first == SampleKey(4) + ".json"; }),
          m.end());
  m.emplace_back(SampleKey(6) + ".json", "{\"other\": 1}");  // no input_ids field
  m.emplace_back(SampleKey(7) + ".json", "{\"input_ids\": [1, 2");  // not JSON
  WriteTar(dir.Sub("m.tar"), m);
  auto failing = SourceFiles::Open(Wds(dir.Sub("m.tar")), "sources[0]");
  ASSERT_TRUE(failing.ok()) << failing.status().ToString();
  auto cols = (*failing)->ReadColumns(0, 0);
  ASSERT_FALSE(cols.ok());
  EXPECT_TRUE(cols.status().IsInvalid());
  EXPECT_THAT(cols.status().message(),
              AllOf(HasSubstr(dir.Sub("m.tar")), HasSubstr("sample '000004' (row 4)"),
                    HasSubstr("no member 'json'"), HasSubstr("its members: txt, cls"),
                    HasSubstr("tokens_column")));
  // The block after it: a JSON member without the field, then one that is not JSON.
  auto later = (*failing)->ReadBlock(0, 0, 1, 6);
  ASSERT_FALSE(later.ok());
  EXPECT_THAT(later.status().message(),
              AllOf(HasSubstr("sample '000006'"), HasSubstr("no field 'input_ids'")));
  later = (*failing)->ReadBlock(0, 0, 1, 7);
  ASSERT_FALSE(later.ok());
  EXPECT_THAT(later.status().message(),
              AllOf(HasSubstr("sample '000007'"), HasSubstr("not JSON")));
  // Under skip: those rows are nulls, the others read.
  auto skipping = SourceFiles::Open(Wds(dir.Sub("m.tar"), "json:input_ids",
                                        OnError::kSkip),
                                    "sources[0]");
  ASSERT_TRUE(skipping.ok());
  cols = (*skipping)->ReadColumns(0, 0);
  ASSERT_TRUE(cols.ok()) << cols.status().ToString();
  const auto& a = *cols->front();
  ASSERT_EQ(a.length(), 8);
  EXPECT_EQ(a.null_count(), 3);
  EXPECT_TRUE(a.IsNull(4) && a.IsNull(6) && a.IsNull(7));
  EXPECT_EQ(ListRowIds(a, 5), SampleIds(5));
}

TEST(WebDatasetFilesTest, ACorruptTarFailsNamingItOrIsSkippedUnderSkip) {
  testing::ScopedTempDir dir("braid-wds");
  WriteTar(dir.Sub("d/a.tar"), Shard(0, 20));
  WriteTar(dir.Sub("d/b.tar"), Shard(20, 20));
  // b.tar: a member header's checksum overwritten.
  {
    std::fstream f(dir.Sub("d/b.tar"), std::ios::in | std::ios::out | std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), {});
    const size_t name = bytes.find(SampleKey(25) + ".json");
    ASSERT_NE(name, std::string::npos);
    f.seekp(std::streamoff(name - name % 512 + 148));
    f.write("9999999", 7);
  }
  WriteTar(dir.Sub("d/c.tar"), Shard(40, 20));
  std::filesystem::resize_file(dir.Sub("d/c.tar"), 512 * 7 + 100);  // truncated
  for (const char* bad : {"b.tar", "c.tar"}) {
    SCOPED_TRACE(bad);
    auto files = SourceFiles::Open(Wds(dir.Sub(std::string("d/") + bad)), "sources[0]");
    ASSERT_FALSE(files.ok());
    EXPECT_TRUE(files.status().IsInvalid()) << files.status().ToString();  // not retried
    EXPECT_THAT(files.status().message(),
                AllOf(HasSubstr(dir.Sub(std::string("d/") + bad)),
                      HasSubstr("not a readable tar"), HasSubstr("on_error: skip")));
  }
  // Under skip, b.tar yields its 5 whole samples before the bad header (each ended by
  // the next one's header); c.tar, cut inside its first samples, what it has whole.
  auto files = SourceFiles::Open(Wds(dir.Sub("d"), "json:input_ids", OnError::kSkip),
                                 "sources[0]");
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  const auto& b = (*files)->files()[1];
  const auto& c = (*files)->files()[2];
  EXPECT_TRUE(b.unreadable.empty());
  EXPECT_THAT(b.damaged, AllOf(HasSubstr("not a readable tar"), HasSubstr("5 samples")));
  EXPECT_EQ(b.num_rows, 5);
  auto read = (*files)->ReadColumns(1, 0);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->front()->length(), 5);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(ListRowIds(*read->front(), i), SampleIds(20 + i));
  }
  EXPECT_NE(c.unreadable.empty(), c.damaged.empty());  // one or the other
  EXPECT_EQ((*files)->unreadable_files(), c.unreadable.empty() ? 0 : 1);
  EXPECT_EQ((*files)->total_rows(), 25 + c.num_rows);
  EXPECT_LE(c.num_rows, 1);
  // Not a tar at all.
  std::ofstream(dir.Sub("x.tar")) << "this is no tar";
  EXPECT_FALSE(SourceFiles::Open(Wds(dir.Sub("x.tar")), "sources[0]").ok());
}

TEST(WebDatasetFilesTest, TheStreamHasEverySampleOncePerEpochAndResumesInsideAShard) {
  testing::ScopedTempDir dir("braid-wds");
  WriteTar(dir.Sub("s/000.tar"), Shard(0, 70));
  WriteTar(dir.Sub("s/001.tar"), Shard(70, 50));
  Config config;
  config.seed = 3;
  config.batch.seq_len = 64;
  config.batch.global_tokens = 64;
  config.sources.push_back(Wds(dir.Sub("s/*.tar")));
  config.sources[0].shuffle_window_bytes = 1024;  // shards cut into blocks of samples
  auto loader = SourceLoader::Make(config, 0, {}, {});
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  Status st;
  const auto reads = testing::ReadSamples(loader->get(), 300, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::map<int64_t, std::set<std::pair<int32_t, int64_t>>> seen;
  for (const auto& r : reads) {
    EXPECT_TRUE(seen[r.meta.epoch].emplace(r.meta.file, r.meta.row).second);
    ASSERT_NE(r.payload, nullptr);
    EXPECT_EQ(r.payload->tokens, SampleIds(r.meta.file * 70 + r.meta.row));
  }
  EXPECT_EQ(seen[0].size(), 120u);
  EXPECT_EQ(seen[1].size(), 120u);
  const StreamPos at = reads[77].meta.pos;
  auto resumed = SourceLoader::Make(config, 0, at, {});
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  const auto rest = testing::ReadSamples(resumed->get(), 100, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].meta.file, reads[77 + i].meta.file);
    EXPECT_EQ(rest[i].meta.row, reads[77 + i].meta.row);
  }
}

TEST(WebDatasetFilesTest, TheLengthCacheKeepsTheSampleCountsOfUnchangedShards) {
  testing::ScopedTempDir dir("braid-wds");
  const std::string path = dir.Sub("a.tar");
  WriteTar(path, Shard(0, 30));
  SourceConfig s = Wds(path);
  s.length_cache_dir = dir.Sub("cache");
  auto first = SourceFiles::Open(s, "sources[0]");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ((*first)->total_rows(), 30);
  const auto size = std::filesystem::file_size(path);
  const auto mtime = std::filesystem::last_write_time(path);
  std::filesystem::resize_file(path, 0);
  std::filesystem::resize_file(path, size);  // zeros: no tar, same size
  std::filesystem::last_write_time(path, mtime);
  internal::ForgetCountsKeptInProcess();  // as a new process: the cache alone has them
  auto kept = SourceFiles::Open(s, "sources[0]");
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ((*kept)->total_rows(), 30);
  std::filesystem::last_write_time(path, mtime + std::chrono::seconds(5));
  // A new time is a miss: counted again, a tar of zeros holds no sample.
  EXPECT_FALSE(SourceFiles::Open(s, "sources[0]").ok());
}

}  // namespace
}  // namespace braid
