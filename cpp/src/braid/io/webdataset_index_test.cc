// Megatron-Energon's index under a WebDataset source: counts and spans from the index
// equal what the member headers give, opening reads no member header, a block behind the
// reader is entered at its sample's offset, and a stale or damaged index (counts,
// offsets, a shard it does not list, a shard changed under it) is a warning naming the
// shard and the shard is read from its headers, or, once planned from the index, a data
// error naming the shard and the index. The index is written here from libarchive's
// writer positions; the Python tests use `energon prepare` itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arrow/api.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "braid/io/format_reader_internal.h"
#include "braid/io/source_files.h"
#include "braid/io/webdataset_index_internal.h"
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

// A tar of `members`; the offset of each sample's first header, then the archive's
// end: a .tar.idx's values.
std::vector<int64_t> WriteTar(const std::string& path, const Members& members) {
  auto offsets = testing::WriteTarShard(path, members);
  EXPECT_TRUE(offsets.ok()) << offsets.status().ToString();
  return offsets.ok() ? *offsets : std::vector<int64_t>{};
}

void WriteIdx(const std::string& path, const std::vector<int64_t>& offsets) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (int64_t v : offsets) {
    unsigned char b[8];
    for (int k = 0; k < 8; ++k) b[k] = static_cast<unsigned char>(uint64_t(v) >> (8 * k));
    out.write(reinterpret_cast<const char*>(b), 8);
  }
}

// FOLDER/.nv-meta/.info.json (or the legacy .info.yaml) with `counts`.
void WriteInfo(const std::string& folder, const std::map<std::string, int64_t>& counts,
               bool yaml = false) {
  std::filesystem::create_directories(folder + "/.nv-meta");
  std::ofstream out(folder + "/.nv-meta/.info." + (yaml ? "yaml" : "json"));
  if (yaml) {
    out << "energon_version: 7.4.1\nshard_counts:\n";
    for (const auto& [name, n] : counts) out << "  " << name << ": " << n << "\n";
  } else {
    out << "{\n  \"energon_version\": \"7.4.1\",\n  \"shard_counts\": {";
    bool first = true;
    for (const auto& [name, n] : counts) {
      out << (first ? "" : ",") << "\n    \"" << name << "\": " << n;
      first = false;
    }
    out << "\n  }\n}\n";
  }
}

// Sample i: a caption and a JSON record of i % 9 + 1 token ids, every third an image.
Members Shard(int64_t first, int64_t n) {
  Members out;
  for (int64_t i = first; i < first + n; ++i) {
    out.emplace_back(SampleKey(i) + ".txt", "caption " + std::to_string(i));
    out.emplace_back(SampleKey(i) + ".json", "{\"input_ids\": " + SampleIdsJson(i) + "}");
    if (i % 3 == 0) {
      out.emplace_back(SampleKey(i) + ".jpg", std::string(600 + 7 * i, '\xff'));
    }
  }
  return out;
}

SourceConfig Wds(const std::string& path) {
  SourceConfig s;
  s.name = "w";
  s.path = path;
  s.tokens_column = "json:input_ids";
  s.shuffle_window_rows = 16;
  return s;
}

// Samples first .. first + n of shard `file` (its first sample `base`) as ReadBlock
// gives them in blocks of n, compared with what they hold.
void ExpectBlock(SourceFiles* files, int file, int64_t base, int64_t n, int64_t block) {
  auto read = files->ReadBlock(file, 0, n, block);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  int64_t at = block * n;
  for (const auto& chunk : *read) {
    for (int64_t i = 0; i < chunk.front()->length(); ++i, ++at) {
      EXPECT_EQ(ListRowIds(*chunk.front(), i), SampleIds(base + at)) << at;
    }
  }
  EXPECT_EQ(at, std::min(files->files()[size_t(file)].num_rows, block * n + n));
}

// Two shards, a.tar (50 samples) and b.tar (30), in `folder`, prepared (an index) or not.
struct Prepared {
  std::vector<int64_t> a, b;  // their offsets
};
Prepared WriteFolder(const std::string& folder, bool prepare, bool yaml = false) {
  Prepared p;
  p.a = WriteTar(folder + "/a.tar", Shard(0, 50));
  p.b = WriteTar(folder + "/b.tar", Shard(50, 30));
  if (prepare) {
    WriteIdx(folder + "/a.tar.idx", p.a);
    WriteIdx(folder + "/b.tar.idx", p.b);
    WriteInfo(folder, {{"a.tar", 50}, {"b.tar", 30}}, yaml);
  }
  return p;
}

// Every file's rows and bytes, as the planner sees them.
std::vector<std::pair<int64_t, int64_t>> Units(const SourceFiles& files) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& f : files.files()) {
    out.emplace_back(f.row_group_rows.at(0), f.row_group_bytes.at(0));
  }
  return out;
}

// One sample of a source's stream.
struct Read {
  int32_t file = 0;
  int64_t row = 0;
  std::vector<int32_t> tokens;
  StreamPos pos;  // where it is in the stream
  bool operator==(const Read& o) const {
    return file == o.file && row == o.row && tokens == o.tokens;
  }
};

// `n` samples of the source's stream from `at`.
std::vector<Read> Stream(const std::string& path, int64_t n, StreamPos at = {}) {
  Config config;
  config.seed = 3;
  config.batch.seq_len = 64;
  config.batch.global_tokens = 64;
  config.sources.push_back(Wds(path));
  config.sources[0].shuffle_window_bytes = 4096;  // shards cut into blocks of samples
  std::vector<Read> out;
  auto loader = SourceLoader::Make(config, 0, at, {});
  EXPECT_TRUE(loader.ok()) << loader.status().ToString();
  if (!loader.ok()) return out;
  Status st;
  for (const auto& r : testing::ReadSamples(loader->get(), n, &st)) {
    out.push_back(Read{r.meta.file, r.meta.row,
                       {r.payload->tokens.begin(), r.payload->tokens.end()}, r.meta.pos});
  }
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

TEST(WebDatasetIndexTest, TheSearchRootIsTheSourcePathBeforeItsGlob) {
  using internal::IndexSearchRoot;
  EXPECT_EQ(IndexSearchRoot("/d/set"), "/d/set");
  EXPECT_EQ(IndexSearchRoot("/d/set/"), "/d/set");
  EXPECT_EQ(IndexSearchRoot("/d/set/shard-*.tar"), "/d/set");
  EXPECT_EQ(IndexSearchRoot("/d/set/a.tar"), "/d/set/a.tar");
  EXPECT_EQ(IndexSearchRoot("s3://bucket/set/*.tar?endpoint_override=x:1"), "bucket/set");
  EXPECT_EQ(IndexSearchRoot("gs://bucket/set"), "bucket/set");
}

TEST(WebDatasetIndexTest, TheIndexGivesTheCountsSpansAndStreamOfTheHeaders) {
  testing::ScopedTempDir dir("braid-wdsi");
  const Prepared p = WriteFolder(dir.Sub("plain"), /*prepare=*/false);
  WriteFolder(dir.Sub("prep"), /*prepare=*/true);
  auto plain = SourceFiles::Open(Wds(dir.Sub("plain")), "sources[0]");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ::testing::internal::CaptureStderr();
  auto prep = SourceFiles::Open(Wds(dir.Sub("prep")), "sources[0]");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");  // nothing disagrees
  ASSERT_TRUE(prep.ok()) << prep.status().ToString();
  EXPECT_EQ(Units(**prep), Units(**plain));
  EXPECT_EQ(Units(**prep)[0],
            std::make_pair(int64_t{50}, p.a.back() - p.a.front()));  // the span
  // Blocks behind the reader, entered at their offsets, and in order.
  for (int64_t b : {3, 1, 2, 0, 4}) ExpectBlock(prep->get(), 0, 0, 10, b);
  ExpectBlock(prep->get(), 1, 50, 7, 2);
  // The stream and a resume inside a shard are those without the index.
  const auto want = Stream(dir.Sub("plain"), 200);
  ASSERT_EQ(want.size(), 200u);
  EXPECT_EQ(Stream(dir.Sub("prep"), 200), want);
  // Resumes at positions inside a shard (past its first block) give the same rest.
  int resumes = 0;
  for (size_t k = 0; k < want.size() && resumes < 3; k += 17) {
    if (want[k].row < 20) continue;
    ++resumes;
    const auto rest = Stream(dir.Sub("prep"), 40, want[k].pos);
    ASSERT_EQ(rest.size(), 40u);
    EXPECT_EQ(rest, Stream(dir.Sub("plain"), 40, want[k].pos));
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(), want.begin() + long(k))) << k;
  }
  EXPECT_EQ(resumes, 3);
}

TEST(WebDatasetIndexTest, OpeningReadsNoHeaderAndABlockIsEnteredAtItsSample) {
  testing::ScopedTempDir dir("braid-wdsi");
  WriteFolder(dir.Sub("prep"), /*prepare=*/true, /*yaml=*/true);  // the legacy .info.yaml
  // The headers of samples 0 .. 19 overwritten: no tar reader gets past them.
  {
    std::fstream f(dir.Sub("prep/a.tar"),
                   std::ios::in | std::ios::out | std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), {});
    for (int64_t i = 0; i < 20; ++i) {
      const size_t name = bytes.find(SampleKey(i) + ".txt");
      ASSERT_NE(name, std::string::npos);
      f.seekp(std::streamoff(name - name % 512 + 148));
      f.write("9999999", 7);
    }
  }
  auto files = SourceFiles::Open(Wds(dir.Sub("prep")), "sources[0]");
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_EQ((*files)->total_rows(), 80);
  // Samples 21 .. 49: entered at sample 20's offset, never past the damaged headers.
  ExpectBlock(files->get(), 0, 0, 7, 3);
  ExpectBlock(files->get(), 0, 0, 7, 6);
  ExpectBlock(files->get(), 0, 0, 7, 5);
  // Planning counts a block from its own samples, entered the same way; the whole
  // shard's counts would pass over the damaged headers.
  auto counts = (*files)->ReadBlockLengths(0, 0, 21, 29);
  ASSERT_TRUE(counts.ok()) << counts.status().ToString();
  ASSERT_EQ((*counts)->size(), 29u);
  for (int64_t i = 0; i < 29; ++i) {
    EXPECT_EQ((**counts)[size_t(i)].tokens, int64_t(SampleIds(21 + i).size())) << i;
  }
  EXPECT_FALSE((*files)->ReadLengths(0, 0).ok());
  // The damaged samples themselves are a data error naming the shard.
  auto damaged = (*files)->ReadBlock(0, 0, 7, 0);
  ASSERT_FALSE(damaged.ok());
  EXPECT_THAT(damaged.status().message(),
              AllOf(HasSubstr(dir.Sub("prep/a.tar")), HasSubstr("not a readable tar")));
  // Without the index the shard does not open (in a process that has not counted it).
  std::filesystem::remove_all(dir.Sub("prep/.nv-meta"));
  internal::ForgetCountsKeptInProcess();
  auto unindexed = SourceFiles::Open(Wds(dir.Sub("prep")), "sources[0]");
  ASSERT_FALSE(unindexed.ok());
  EXPECT_THAT(unindexed.status().message(), HasSubstr("not a readable tar"));
}

// A damage to the index of a.tar (50 samples) and what the warning says about it.
struct Damage {
  std::string name;
  std::function<void(const std::string& folder, const Prepared& p)> apply;
  std::string says;  // in the warning, beside the shard's (or the info file's) path
};

class WebDatasetStaleIndexTest : public ::testing::TestWithParam<Damage> {};

TEST_P(WebDatasetStaleIndexTest, FallsBackToTheHeadersWithAWarningNamingTheShard) {
  testing::ScopedTempDir dir("braid-wdsi");
  WriteFolder(dir.Sub("plain"), /*prepare=*/false);
  const Prepared p = WriteFolder(dir.Sub("prep"), /*prepare=*/true);
  GetParam().apply(dir.Sub("prep"), p);
  auto plain = SourceFiles::Open(Wds(dir.Sub("plain")), "sources[0]");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ::testing::internal::CaptureStderr();
  auto prep = SourceFiles::Open(Wds(dir.Sub("prep")), "sources[0]");
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(prep.ok()) << prep.status().ToString();
  EXPECT_EQ(Units(**prep), Units(**plain));
  EXPECT_THAT(log, AllOf(HasSubstr(dir.Sub("prep/")), HasSubstr(GetParam().says)));
  for (int64_t b : {3, 1, 4}) ExpectBlock(prep->get(), 0, 0, 10, b);
  ExpectBlock(prep->get(), 1, 50, 7, 2);
}

INSTANTIATE_TEST_SUITE_P(
    Damages, WebDatasetStaleIndexTest,
    ::testing::Values(
        Damage{"CountDisagrees",
               [](const std::string& d, const Prepared&) {
                 WriteInfo(d, {{"a.tar", 49}, {"b.tar", 30}});
               },
               "a.tar.idx: it holds 51 offsets where the info file's 49 samples need 50"},
        Damage{"LastOffsetPastTheShard",
               [](const std::string& d, const Prepared& p) {
                 auto o = p.a;
                 o.back() = int64_t(std::filesystem::file_size(d + "/a.tar")) + 512;
                 WriteIdx(d + "/a.tar.idx", o);
               },
               "is past the shard's size"},
        Damage{"MembersAfterTheEnd",  // the index of a.tar when it had 48 samples
               [](const std::string& d, const Prepared& p) {
                 WriteIdx(d + "/a.tar.idx", {p.a.begin(), p.a.begin() + 49});
                 WriteInfo(d, {{"a.tar", 48}, {"b.tar", 30}});
               },
               "does not end at the last offset"},
        Damage{"NotListed",
               [](const std::string& d, const Prepared&) {
                 WriteInfo(d, {{"b.tar", 30}});
               },
               "does not list 1 of the source's shards"},
        Damage{"OffsetsDoNotIncrease",
               [](const std::string& d, const Prepared& p) {
                 auto o = p.a;
                 std::swap(o[3], o[4]);
                 WriteIdx(d + "/a.tar.idx", o);
               },
               "offsets do not increase (sample 4"},
        Damage{"NoIdx",
               [](const std::string& d, const Prepared&) {
                 std::filesystem::remove(d + "/a.tar.idx");
               },
               "it has no"},
        Damage{"InfoNotJson",
               [](const std::string& d, const Prepared&) {
                 std::ofstream(d + "/.nv-meta/.info.json") << "{\"shard_counts\": {";
               },
               "is not Energon's index (it is not JSON)"}),
    [](const auto& info) { return info.param.name; });

TEST(WebDatasetIndexTest, ASampleNotWhereTheIndexSaysIsFoundWhenRead) {
  // Sample 25's offset moved to its second member, or sample 24's (where a block of
  // samples 25 .. 29 is entered) into a header: the count, the order of the offsets and
  // the archive's end still agree, so the shard opens from the index.
  struct Case {
    int64_t sample, moved;
    std::string says;
  };
  for (const Case& c : {Case{25, 1024, "sample 25 ('000025') starts at offset"},
                        Case{24, 100, "reading it from offset"}}) {
    SCOPED_TRACE(c.says);
    testing::ScopedTempDir dir("braid-wdsi");
    const Prepared p = WriteFolder(dir.Sub("prep"), /*prepare=*/true);
    auto o = p.a;
    o[size_t(c.sample)] += c.moved;
    WriteIdx(dir.Sub("prep/a.tar.idx"), o);
    auto files = SourceFiles::Open(Wds(dir.Sub("prep")), "sources[0]");
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    ::testing::internal::CaptureStderr();
    ExpectBlock(files->get(), 0, 0, 5, 5);  // samples 25 .. 29, entered at sample 24
    EXPECT_THAT(::testing::internal::GetCapturedStderr(),
                AllOf(HasSubstr(dir.Sub("prep/a.tar") + ": its Energon index"),
                      HasSubstr(c.says),
                      HasSubstr("reading it from its member headers")));
    ExpectBlock(files->get(), 0, 0, 5, 8);  // without the index from now on
  }
}

TEST(WebDatasetIndexTest, AShardChangedUnderItsIndexIsADataErrorNamingBoth) {
  testing::ScopedTempDir dir("braid-wdsi");
  WriteFolder(dir.Sub("prep"), /*prepare=*/true);
  const std::string path = dir.Sub("prep/a.tar");
  auto files = SourceFiles::Open(Wds(dir.Sub("prep")), "sources[0]");
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  // Rewritten with its first 40 samples, the same size and time (its stamp unchanged).
  const auto size = std::filesystem::file_size(path);
  const auto mtime = std::filesystem::last_write_time(path);
  WriteTar(path, Shard(0, 40));
  std::filesystem::resize_file(path, size);
  std::filesystem::last_write_time(path, mtime);
  ::testing::internal::CaptureStderr();
  auto read = (*files)->ReadBlock(0, 0, 10, 4);
  ::testing::internal::GetCapturedStderr();
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(read.status().IsInvalid()) << read.status().ToString();
  EXPECT_THAT(read.status().message(),
              AllOf(HasSubstr(path + ": has 40 samples"),
                    HasSubstr("where opening took 50 samples"),
                    HasSubstr(path + ".idx"), HasSubstr(".nv-meta/.info.json"),
                    HasSubstr("energon prepare")));
}

}  // namespace
}  // namespace braid
