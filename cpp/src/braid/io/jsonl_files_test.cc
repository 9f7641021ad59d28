// JSON Lines files as a source: record counts, whole files and blocks against what was
// written (plain, gzip, zstd through Arrow's compressed streams), fields, and errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arrow/api.h>
#include <arrow/io/compressed.h>
#include <arrow/io/file.h>
#include <arrow/filesystem/localfs.h>
#include <arrow/util/compression.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
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
using Docs = std::vector<std::vector<int32_t>>;

Docs MakeDocs(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Docs docs(static_cast<size_t>(n));
  for (auto& d : docs) {
    d.resize(1 + rng() % 50);
    for (auto& t : d) t = int32_t(rng() % 30000);
  }
  return docs;
}

// Records with the ids, an unexpected nested field, blank lines between some.
std::string Lines(const Docs& docs) {
  std::string out;
  for (size_t i = 0; i < docs.size(); ++i) {
    out += "{\"meta\": {\"k\": [1, {\"x\": null}]}, \"input_ids\": [";
    for (size_t k = 0; k < docs[i].size(); ++k) {
      if (k > 0) out += ',';
      out += std::to_string(docs[i][k]);
    }
    out += "], \"text\": \"doc " + std::to_string(i) + "\"}\n";
    if (i % 7 == 3) out += "\n  \n";
  }
  return out;
}

Status Write(const std::string& path, const std::string& body,
             arrow::Compression::type compression = arrow::Compression::UNCOMPRESSED) {
  ARROW_ASSIGN_OR_RAISE(auto file, arrow::io::FileOutputStream::Open(path));
  std::shared_ptr<arrow::io::OutputStream> out = file;
  std::unique_ptr<arrow::util::Codec> codec;
  if (compression != arrow::Compression::UNCOMPRESSED) {
    ARROW_ASSIGN_OR_RAISE(codec, arrow::util::Codec::Create(compression));
    ARROW_ASSIGN_OR_RAISE(out, arrow::io::CompressedOutputStream::Make(codec.get(), file));
  }
  ARROW_RETURN_NOT_OK(out->Write(body.data(), int64_t(body.size())));
  return out->Close();
}

// Rewrites `path` with as many bytes of 'x' and its old modification time, which it
// returns: the same file to a stat, not JSON Lines (nor gzip, zstd) to a reader.
std::filesystem::file_time_type GarbleKeepingSizeAndTime(const std::string& path) {
  const auto size = std::filesystem::file_size(path);
  const auto mtime = std::filesystem::last_write_time(path);
  EXPECT_TRUE(Write(path, std::string(size, 'x')).ok());
  std::filesystem::last_write_time(path, mtime);
  return mtime;
}

SourceConfig Jsonl(const std::string& path, OnError on_error = OnError::kFail) {
  SourceConfig s;
  s.name = "j";
  s.path = path;
  s.tokens_column = "input_ids";
  s.on_error = on_error;
  s.shuffle_window_rows = 32;
  return s;
}

using Chunks = std::vector<std::vector<std::shared_ptr<arrow::Array>>>;

// One line per record of `docs` (as Lines writes it), the records in `bad` given the
// line there instead (one that does not parse; the file's last may lack its newline).
std::string WithBadLines(const Docs& docs, const std::map<int64_t, std::string>& bad) {
  std::string body;
  for (int64_t i = 0; i < int64_t(docs.size()); ++i) {
    if (const auto it = bad.find(i); it != bad.end()) {
      body += it->second;
      continue;
    }
    const std::string line = Lines(Docs{docs[size_t(i)]});
    body += line.substr(0, line.find('\n') + 1);
  }
  return body;
}

// Expects `chunks`, records from `first` on of the file `files` reads under on_error:
// skip, to hold `docs`' ids, and each record in `bad` to be null with the reader's
// reason; returns the record after the last.
int64_t ExpectRecords(const SourceFiles& files, const Chunks& chunks, int64_t first,
                      const Docs& docs, const std::map<int64_t, std::string>& bad) {
  int64_t at = first;
  for (const auto& chunk : chunks) {
    const arrow::Array& ids = *chunk.front();
    for (int64_t i = 0; i < ids.length(); ++i, ++at) {
      if (bad.count(at) > 0) {
        EXPECT_TRUE(ids.IsNull(i)) << at;
        EXPECT_THAT(files.WhyNull(0, at), HasSubstr("does not parse as JSON (")) << at;
      } else if (ids.IsNull(i)) {
        ADD_FAILURE() << "record " << at << " is null";
      } else {
        EXPECT_EQ(testing::ListRowIds(ids, i), docs[size_t(at)]) << at;
      }
    }
  }
  return at;
}

TEST(JsonlFilesTest, EveryCompressionReadsWholeAndInBlocks) {
  testing::ScopedTempDir dir("braid-jsonl");
  const Docs docs = MakeDocs(150, 1);
  const std::vector<std::pair<std::string, arrow::Compression::type>> kinds = {
      {"a.jsonl", arrow::Compression::UNCOMPRESSED},
      {"b.jsonl.gz", arrow::Compression::GZIP},
      {"c.json.zst", arrow::Compression::ZSTD}};
  for (const auto& [name, compression] : kinds) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(Write(dir.Sub(name), Lines(docs), compression).ok());
    auto files = SourceFiles::Open(Jsonl(dir.Sub(name)), "sources[0]");
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    EXPECT_EQ((*files)->format(), SourceFormat::kJsonl);
    const auto& f = (*files)->files()[0];
    EXPECT_EQ(f.num_rows, 150);  // blank lines are no records
    ASSERT_EQ(f.row_group_rows, std::vector<int64_t>{150});
    auto whole = (*files)->ReadColumns(0, 0);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    ASSERT_EQ(whole->front()->length(), 150);
    for (int64_t i = 0; i < 150; ++i) EXPECT_EQ(testing::ListRowIds(*whole->front(), i), docs[size_t(i)]);
    auto lengths = (*files)->ReadLengths(0, 0);
    ASSERT_TRUE(lengths.ok());
    EXPECT_EQ((**lengths)[17].tokens, int64_t(docs[17].size()));
    // Blocks in order, then one behind the reader (a resume inside the file).
    for (int64_t b : {0, 1, 2, 3, 1, 3}) {
      auto block = (*files)->ReadBlock(0, 0, 40, b);
      ASSERT_TRUE(block.ok()) << block.status().ToString();
      int64_t at = b * 40;
      for (const auto& chunk : *block) {
        for (int64_t i = 0; i < chunk.front()->length(); ++i, ++at) {
          EXPECT_EQ(testing::ListRowIds(*chunk.front(), i), docs[size_t(at)]) << at;
        }
      }
      EXPECT_EQ(at, std::min<int64_t>(150, b * 40 + 40));
    }
    // A block's counts from its own records, in order and behind the reader.
    for (int64_t b : {0, 1, 3, 2}) {
      const int64_t first = b * 40, rows = std::min<int64_t>(40, 150 - first);
      auto counts = (*files)->ReadBlockLengths(0, 0, first, rows);
      ASSERT_TRUE(counts.ok()) << counts.status().ToString();
      ASSERT_EQ(int64_t((*counts)->size()), rows);
      for (int64_t i = 0; i < rows; ++i) {
        EXPECT_EQ((**counts)[size_t(i)].tokens, int64_t(docs[size_t(first + i)].size()));
      }
    }
  }
  // A directory of them is detected as JSON Lines, files in sorted order.
  auto all = SourceFiles::Open(Jsonl(dir.path().string()), "sources[0]");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ((*all)->files().size(), 3u);
  EXPECT_EQ((*all)->total_rows(), 450);
}

TEST(JsonlFilesTest, TheStreamHasEveryRecordOncePerEpochAcrossWindowBlocks) {
  testing::ScopedTempDir dir("braid-jsonl");
  std::vector<Docs> docs = {MakeDocs(120, 2), MakeDocs(80, 3)};
  ASSERT_TRUE(Write(dir.Sub("x0.jsonl.gz"), Lines(docs[0]), arrow::Compression::GZIP).ok());
  ASSERT_TRUE(Write(dir.Sub("x1.jsonl"), Lines(docs[1])).ok());
  Config config;
  config.seed = 4;
  config.batch.seq_len = 64;
  config.batch.global_tokens = 64;
  config.sources.push_back(Jsonl(dir.Sub("x*")));
  config.sources[0].shuffle_window_bytes = 1024;  // files cut into blocks of records
  auto loader = SourceLoader::Make(config, 0, {}, {});
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  Status st;
  const auto reads = testing::ReadSamples(loader->get(), 400, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::map<int64_t, std::set<std::pair<int32_t, int64_t>>> seen;
  for (const auto& r : reads) {
    EXPECT_TRUE(seen[r.meta.epoch].emplace(r.meta.file, r.meta.row).second);
    ASSERT_NE(r.payload, nullptr);
    EXPECT_EQ(r.payload->tokens, docs[size_t(r.meta.file)][size_t(r.meta.row)]);
  }
  EXPECT_EQ(seen[0].size(), 200u);
  EXPECT_EQ(seen[1].size(), 200u);
  // Resumed inside a file: the same records from there on.
  const StreamPos at = reads[133].meta.pos;
  auto resumed = SourceLoader::Make(config, 0, at, {});
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  const auto rest = testing::ReadSamples(resumed->get(), 100, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].meta.file, reads[133 + i].meta.file);
    EXPECT_EQ(rest[i].meta.row, reads[133 + i].meta.row);
  }
}

TEST(JsonlFilesTest, ARecordLongerThanArrowsBlockIsRead) {
  testing::ScopedTempDir dir("braid-jsonl");
  Docs docs = MakeDocs(5, 4);
  docs[2].assign(1'200'000, 12345);  // about 7 MB of JSON on one line
  ASSERT_TRUE(Write(dir.Sub("long.jsonl"), Lines(docs)).ok());
  auto files = SourceFiles::Open(Jsonl(dir.Sub("long.jsonl")), "sources[0]");
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  auto cols = (*files)->ReadColumns(0, 0);
  ASSERT_TRUE(cols.ok()) << cols.status().ToString();
  EXPECT_EQ(testing::ListRowIds(*cols->front(), 2).size(), 1'200'000u);
  EXPECT_EQ(testing::ListRowIds(*cols->front(), 4), docs[4]);
}

// A block behind the reader reopens the file and passes the records before it by their
// line ends, unparsed: records are found as Arrow's reader finds them (blank and
// whitespace lines are none, CRLF ends, records longer than a read chunk, a line cut by
// a chunk's end, a last line with no newline), and a line before the block that does
// not parse is no error, since it is not read.
TEST(JsonlFilesTest, ABlockBehindTheReaderStartsAtItsRecordWithoutParsingThoseBefore) {
  testing::ScopedTempDir dir("braid-jsonl");
  Docs docs = MakeDocs(400, 9);
  for (size_t i = 0; i < docs.size(); i += 37) docs[i].resize(20000, 7);  // > 64 KiB
  std::string body;
  for (size_t i = 0; i < docs.size(); ++i) {
    std::string line = Lines(Docs{docs[i]});
    line.resize(line.find('\n'));
    if (i == 2) line = "{\"input_ids\": [1,, 2]}";  // read only by block 0
    body += line + (i % 5 == 1 ? "\r\n" : "\n");
    if (i % 9 == 4) body += " \t \n\n";
  }
  body.pop_back();  // the last line has no newline
  const std::vector<std::pair<std::string, arrow::Compression::type>> kinds = {
      {"a.jsonl", arrow::Compression::UNCOMPRESSED},
      {"b.jsonl.zst", arrow::Compression::ZSTD}};
  for (const auto& [name, compression] : kinds) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(Write(dir.Sub(name), body, compression).ok());
    auto files = SourceFiles::Open(Jsonl(dir.Sub(name)), "sources[0]");
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    ASSERT_EQ((*files)->total_rows(), 400);
    // Blocks of 3 records, last first: each one behind the reader.
    for (int64_t b = 133; b >= 1; b -= (b > 120 ? 1 : 11)) {
      auto block = (*files)->ReadBlock(0, 0, 3, b);
      ASSERT_TRUE(block.ok()) << "block " << b << ": " << block.status().ToString();
      int64_t at = b * 3;
      for (const auto& chunk : *block) {
        for (int64_t i = 0; i < chunk.front()->length(); ++i, ++at) {
          ASSERT_EQ(testing::ListRowIds(*chunk.front(), i), docs[size_t(at)]) << at;
        }
      }
      EXPECT_EQ(at, std::min<int64_t>(b * 3 + 3, 400)) << "block " << b;
    }
    // Block 0 holds the bad line: the error names it.
    auto first = (*files)->ReadBlock(0, 0, 3, 0);
    ASSERT_FALSE(first.ok());
    EXPECT_THAT(first.status().message(), HasSubstr("row 2)"));
  }
}

TEST(JsonlFilesTest, AWholeFileReadsAsArrowsBlocksWithTheRowsOfReadColumns) {
  testing::ScopedTempDir dir("braid-jsonl");
  Docs docs = MakeDocs(1500, 7);
  for (auto& d : docs) d.resize(1000, 29999);  // about 9 MB of JSON: several blocks
  ASSERT_TRUE(Write(dir.Sub("big.jsonl.zst"), Lines(docs), arrow::Compression::ZSTD).ok());
  auto files = SourceFiles::Open(Jsonl(dir.Sub("big.jsonl.zst")), "sources[0]");
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  auto chunks = (*files)->ReadChunks(0, 0);
  ASSERT_TRUE(chunks.ok()) << chunks.status().ToString();
  EXPECT_GT(chunks->size(), 1u);
  int64_t at = 0;
  for (const auto& chunk : *chunks) {
    for (int64_t i = 0; i < chunk.front()->length(); ++i, ++at) {
      ASSERT_EQ(testing::ListRowIds(*chunk.front(), i), docs[size_t(at)]) << at;
    }
  }
  EXPECT_EQ(at, 1500);
  auto whole = (*files)->ReadColumns(0, 0);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  ASSERT_EQ(whole->front()->length(), 1500);
  EXPECT_EQ(testing::ListRowIds(*whole->front(), 1499), docs[1499]);
}

TEST(JsonlFilesTest, BadBytesNameTheFile) {
  testing::ScopedTempDir dir("braid-jsonl");
  ASSERT_TRUE(Write(dir.Sub("a.jsonl"), Lines(MakeDocs(20, 5))).ok());
  ASSERT_TRUE(Write(dir.Sub("b.jsonl.gz"), "not gzip").ok());
  auto files = SourceFiles::Open(Jsonl(dir.path().string()), "sources[0]");
  ASSERT_FALSE(files.ok());
  EXPECT_TRUE(files.status().IsInvalid()) << files.status().ToString();  // not retried
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr(dir.Sub("b.jsonl.gz")), HasSubstr("on_error: skip")));
  files = SourceFiles::Open(Jsonl(dir.path().string(), OnError::kSkip), "sources[0]");
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_EQ((*files)->unreadable_files(), 1);
  EXPECT_EQ((*files)->total_rows(), 20);
  // A line that is not JSON: a data error naming the file and the record.
  ASSERT_TRUE(Write(dir.Sub("c.jsonl"), Lines(MakeDocs(10, 6)) + "{broken\n").ok());
  auto broken = SourceFiles::Open(Jsonl(dir.Sub("c.jsonl")), "sources[0]");
  ASSERT_TRUE(broken.ok()) << broken.status().ToString();
  auto cols = (*broken)->ReadColumns(0, 0);
  ASSERT_FALSE(cols.ok());
  EXPECT_TRUE(cols.status().IsInvalid()) << cols.status().ToString();
  EXPECT_THAT(cols.status().message(),
              AllOf(HasSubstr(dir.Sub("c.jsonl")), HasSubstr("row 10"),
                    HasSubstr("does not parse as JSON")));
  // A field of another type than the transform reads.
  ASSERT_TRUE(Write(dir.Sub("d.jsonl"), "{\"input_ids\": \"text\"}\n").ok());
  auto typed = SourceFiles::Open(Jsonl(dir.Sub("d.jsonl")), "sources[0]");
  ASSERT_TRUE(typed.ok());
  EXPECT_FALSE((*typed)->ReadColumns(0, 0).ok());
}

// A `.json` file holding a JSON array of records (another format, often met under that
// name): a data error at open naming the file and saying what it is, plain or
// compressed, the array's first bracket after blank lines; under skip the file is left
// out and the JSON Lines beside it read.
TEST(JsonlFilesTest, AJsonArrayIsNamedAsOneAtOpen) {
  testing::ScopedTempDir dir("braid-jsonl");
  ASSERT_TRUE(Write(dir.Sub("a.jsonl"), Lines(MakeDocs(20, 5))).ok());
  const std::string array = " \n\n [{\"input_ids\": [1, 2]},\n {\"input_ids\": [3]}]\n";
  for (auto [name, compression] :
       {std::pair{"b.json", arrow::Compression::UNCOMPRESSED},
        std::pair{"b.json.zst", arrow::Compression::ZSTD}}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(Write(dir.Sub(name), array, compression).ok());
    auto files = SourceFiles::Open(Jsonl(dir.Sub(name)), "sources[0]");
    ASSERT_FALSE(files.ok());
    EXPECT_TRUE(files.status().IsInvalid()) << files.status().ToString();
    EXPECT_THAT(files.status().message(),
                AllOf(HasSubstr(dir.Sub(name)), HasSubstr("holds a JSON array"),
                      HasSubstr("one JSON object per line")));
    files = SourceFiles::Open(Jsonl(dir.path().string(), OnError::kSkip), "sources[0]");
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    EXPECT_EQ((*files)->unreadable_files(), 1);
    EXPECT_EQ((*files)->total_rows(), 20);
    std::filesystem::remove(dir.Sub(name));
  }
}

// Lines that do not parse (a broken record, a cut one at the end) in a file read in
// several of Arrow's blocks: under on_error: skip each is a null record in its place and
// every other record is read, in the file's first block, a later one, and its last
// line, whole and in blocks, plain and gzip; under fail the first is the error, by
// record.
TEST(JsonlFilesTest, ALineThatDoesNotParseIsANullRecordInItsPlaceUnderSkip) {
  testing::ScopedTempDir dir("braid-jsonl");
  const Docs docs = MakeDocs(30000, 8);  // about 7 MB: seven of Arrow's 1 MiB blocks
  const std::map<int64_t, std::string> bad = {
      {5, "{\"input_ids\": [1, 2,, 3]}\n"},
      {17000, "not json at all\n"},
      {29999, "{\"input_ids\": [4, 5"}};  // cut short, no newline
  const std::string body = WithBadLines(docs, bad);
  for (const auto& [name, compression] :
       std::vector<std::pair<std::string, arrow::Compression::type>>{
           {"a.jsonl", arrow::Compression::UNCOMPRESSED},
           {"b.jsonl.gz", arrow::Compression::GZIP}}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(Write(dir.Sub(name), body, compression).ok());
    auto failing = SourceFiles::Open(Jsonl(dir.Sub(name)), "sources[0]");
    ASSERT_TRUE(failing.ok()) << failing.status().ToString();
    auto error = (*failing)->ReadColumns(0, 0);
    ASSERT_FALSE(error.ok());
    EXPECT_THAT(error.status().message(),
                AllOf(HasSubstr(dir.Sub(name)), HasSubstr("row 5)"),
                      HasSubstr("does not parse as JSON")));
    auto files = SourceFiles::Open(Jsonl(dir.Sub(name), OnError::kSkip), "sources[0]");
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    ASSERT_EQ((*files)->total_rows(), 30000);
    EXPECT_EQ((*files)->WhyNull(0, 5), "");  // not read yet
    auto whole = (*files)->ReadColumns(0, 0);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    ASSERT_EQ(whole->front()->length(), 30000);
    // Why each bad record is null, for the loader's skip line; none for the others.
    EXPECT_EQ(ExpectRecords(**files, {*whole}, 0, docs, bad), 30000);
    EXPECT_EQ((*files)->WhyNull(0, 6), "");
    // In blocks: in order, then behind the reader (reopened, found again).
    for (int64_t b : {0, 1, 2, 3, 2}) {
      auto block = (*files)->ReadBlock(0, 0, 8000, b);
      ASSERT_TRUE(block.ok()) << block.status().ToString();
      EXPECT_EQ(ExpectRecords(**files, *block, b * 8000, docs, bad),
                std::min<int64_t>(30000, b * 8000 + 8000));
    }
  }
}

// A file read in line mode after a bad line goes back to Arrow's streaming reader once
// blocks in a row parse whole, and a later bad line enters line mode again: bad lines in
// the first block, in a run of blocks after a dozen clean ones, and in the last block;
// every other record read, each bad one null in its place (skip), the first named
// (fail), whole and in blocks in order.
TEST(JsonlFilesTest, LineModeEndsAfterCleanBlocksAndBeginsAgainAtTheNextBadLine) {
  testing::ScopedTempDir dir("braid-jsonl");
  const Docs docs = MakeDocs(90000, 12);  // about 21 MB: 21 of Arrow's 1 MiB blocks
  std::map<int64_t, std::string> bad;
  for (int64_t i = 60000; i < 70000; i += 500) bad[i] = "";  // blocks 14-16 or so
  for (int64_t i : {int64_t{3}, int64_t{200}, int64_t{89990}}) bad[i] = "";
  for (auto& [i, line] : bad) line = "{\"input_ids\": [7 7]}\n";
  const std::string body = WithBadLines(docs, bad);
  for (const auto& [name, compression] :
       std::vector<std::pair<std::string, arrow::Compression::type>>{
           {"a.jsonl", arrow::Compression::UNCOMPRESSED},
           {"b.jsonl.zst", arrow::Compression::ZSTD}}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(Write(dir.Sub(name), body, compression).ok());
    auto failing = SourceFiles::Open(Jsonl(dir.Sub(name)), "sources[0]");
    ASSERT_TRUE(failing.ok()) << failing.status().ToString();
    auto error = (*failing)->ReadColumns(0, 0);
    ASSERT_FALSE(error.ok());
    EXPECT_THAT(error.status().message(), HasSubstr("row 3)"));
    auto files = SourceFiles::Open(Jsonl(dir.Sub(name), OnError::kSkip), "sources[0]");
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    auto whole = (*files)->ReadChunks(0, 0);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_EQ(ExpectRecords(**files, *whole, 0, docs, bad), 90000);
    int64_t at = 0;
    for (int64_t b = 0; b < 9; ++b) {  // in blocks, in order
      auto block = (*files)->ReadBlock(0, 0, 10000, b);
      ASSERT_TRUE(block.ok()) << block.status().ToString();
      at = ExpectRecords(**files, *block, at, docs, bad);
    }
    EXPECT_EQ(at, 90000);
  }
}

// A compressed file cut short (an interrupted download): under on_error: fail an error
// naming it; under skip its records before the cut, exactly, and the rest unknown; the
// counts are not kept, so a later open under fail finds the damage again. A file cut
// before its first record ends did not open.
TEST(JsonlFilesTest, AFileCutShortYieldsItsRecordsBeforeTheCutUnderSkip) {
  testing::ScopedTempDir dir("braid-jsonl");
  const Docs docs = MakeDocs(4000, 9);  // about 1 MB decoded
  for (const auto& [name, compression] :
       std::vector<std::pair<std::string, arrow::Compression::type>>{
           {"a.jsonl.gz", arrow::Compression::GZIP},
           {"b.jsonl.zst", arrow::Compression::ZSTD}}) {
    SCOPED_TRACE(name);
    const std::string path = dir.Sub(name);
    ASSERT_TRUE(Write(path, Lines(docs), compression).ok());
    std::filesystem::resize_file(path, std::filesystem::file_size(path) * 6 / 10);
    auto fail = SourceFiles::Open(Jsonl(path), "sources[0]");
    ASSERT_FALSE(fail.ok());
    EXPECT_THAT(fail.status().message(),
                AllOf(HasSubstr(path), HasSubstr("records"),
                      HasSubstr("on_error: skip")));
    auto skip = SourceFiles::Open(Jsonl(path, OnError::kSkip), "sources[0]");
    ASSERT_TRUE(skip.ok()) << skip.status().ToString();
    const SourceFiles::File& f = (*skip)->files()[0];
    EXPECT_TRUE(f.unreadable.empty());
    EXPECT_THAT(f.damaged, HasSubstr("records"));
    // About 6 in 10 of them decode; those of the last 64 KiB before the cut are lost.
    EXPECT_GT(f.num_rows, 1500);
    EXPECT_LT(f.num_rows, 2500);
    auto whole = (*skip)->ReadColumns(0, 0);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    ASSERT_EQ(whole->front()->length(), f.num_rows);
    for (int64_t i = 0; i < f.num_rows; ++i) {
      ASSERT_EQ(testing::ListRowIds(*whole->front(), i), docs[size_t(i)]) << i;
    }
    auto last_block = (*skip)->ReadBlock(0, 0, 64, (f.num_rows - 1) / 64);
    ASSERT_TRUE(last_block.ok()) << last_block.status().ToString();
    // Not kept: the same file under fail is refused again.
    EXPECT_FALSE(SourceFiles::Open(Jsonl(path), "sources[0]").ok());
  }
  // Cut inside its first record: nothing before the damage, the file did not open.
  const std::string tiny = dir.Sub("c.jsonl.gz");
  ASSERT_TRUE(Write(tiny, Lines(MakeDocs(1, 3)), arrow::Compression::GZIP).ok());
  std::filesystem::resize_file(tiny, std::filesystem::file_size(tiny) / 2);
  auto none = SourceFiles::Open(Jsonl(tiny, OnError::kSkip), "sources[0]");
  ASSERT_FALSE(none.ok());  // its only file did not open: no readable file left
  EXPECT_THAT(none.status().message(), HasSubstr(tiny));
}

// Files are counted side by side (FormatOpen::AddWholeFiles): what is kept, each file's
// counts and the error are those of path order, however the counts finish.
TEST(JsonlFilesTest, FilesCountedSideBySideKeepPathOrder) {
  testing::ScopedTempDir dir("braid-jsonl");
  const arrow::Compression::type kinds[] = {arrow::Compression::UNCOMPRESSED,
                                            arrow::Compression::GZIP,
                                            arrow::Compression::ZSTD};
  const char* suffixes[] = {"", ".gz", ".zst"};
  std::vector<int64_t> written;
  for (int i = 0; i < 12; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "part-%02d.jsonl%s", i, suffixes[i % 3]);
    if (i == 4 || i == 8) {  // not what their names say (gzip, zstd)
      ASSERT_TRUE(Write(dir.Sub(name), "not compressed at all").ok());
      written.push_back(-1);
      continue;
    }
    const int64_t n = 40 + 37 * i;  // the larger files come last
    ASSERT_TRUE(Write(dir.Sub(name), Lines(MakeDocs(n, 100 + uint64_t(i))),
                      kinds[i % 3]).ok());
    written.push_back(n);
  }
  for (int round = 0; round < 5; ++round) {
    auto failed = SourceFiles::Open(Jsonl(dir.path().string()), "sources[0]");
    ASSERT_FALSE(failed.ok());
    EXPECT_THAT(failed.status().message(), HasSubstr(dir.Sub("part-04.jsonl.gz")));
    EXPECT_THAT(failed.status().message(),
                ::testing::Not(HasSubstr(dir.Sub("part-08.jsonl.zst"))));
    auto files = SourceFiles::Open(Jsonl(dir.path().string(), OnError::kSkip),
                                   "sources[0]");
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    ASSERT_EQ((*files)->files().size(), written.size());
    EXPECT_EQ((*files)->unreadable_files(), 2);
    int64_t total = 0;
    for (size_t i = 0; i < written.size(); ++i) {
      const auto& f = (*files)->files()[i];
      if (written[i] < 0) {
        EXPECT_FALSE(f.unreadable.empty()) << f.path;
        EXPECT_EQ(f.num_rows, 0) << f.path;
        continue;
      }
      EXPECT_TRUE(f.unreadable.empty()) << f.path << ": " << f.unreadable;
      EXPECT_EQ(f.num_rows, written[i]) << f.path;
      total += written[i];
    }
    EXPECT_EQ((*files)->total_rows(), total);
  }
}

// Every loader of a source (and its planner stream, its server) opens its files: an
// unchanged file is counted once in a process, with or without runtime.length_cache.
TEST(JsonlFilesTest, AnUnchangedFileIsCountedOnceInAProcess) {
  testing::ScopedTempDir dir("braid-jsonl");
  const std::string path = dir.Sub("a.jsonl.zst");
  ASSERT_TRUE(Write(path, Lines(MakeDocs(45, 8)), arrow::Compression::ZSTD).ok());
  auto first = SourceFiles::Open(Jsonl(path), "sources[0]");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ((*first)->total_rows(), 45);
  const auto mtime = GarbleKeepingSizeAndTime(path);
  auto again = SourceFiles::Open(Jsonl(path), "sources[0]");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->total_rows(), 45);
  // Changed (a new time): counted again, and it is no zstd now.
  std::filesystem::last_write_time(path, mtime + std::chrono::seconds(5));
  EXPECT_FALSE(SourceFiles::Open(Jsonl(path), "sources[0]").ok());
}

TEST(JsonlFilesTest, TheLengthCacheKeepsTheRecordCountsOfUnchangedFiles) {
  testing::ScopedTempDir dir("braid-jsonl");
  const std::string path = dir.Sub("a.jsonl.gz");
  ASSERT_TRUE(Write(path, Lines(MakeDocs(60, 7)), arrow::Compression::GZIP).ok());
  SourceConfig s = Jsonl(path);
  s.length_cache_dir = dir.Sub("cache");
  auto first = SourceFiles::Open(s, "sources[0]");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ((*first)->total_rows(), 60);
  // The same size and time, other bytes: the counts come from the cache, unread (not
  // from what this process kept: forgotten, as a new process has not got them).
  const auto mtime = GarbleKeepingSizeAndTime(path);
  internal::ForgetCountsKeptInProcess();
  auto kept = SourceFiles::Open(s, "sources[0]");
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ((*kept)->total_rows(), 60);
  // A new time is a miss: the file is counted again (and is no gzip now).
  std::filesystem::last_write_time(path, mtime + std::chrono::seconds(5));
  EXPECT_FALSE(SourceFiles::Open(s, "sources[0]").ok());
}

// A user transform's columns (ColumnSpec::any_type) have the types Arrow infers from the
// source's first file's first records, unified over them and held for every file: a
// date stays its string, an integer beside floats is a float, an object a struct, a list
// of numbers a list; a record Arrow cannot type (a list of mixed values in a field not
// read) does not count, and is read; a record of another type later is an error naming
// its file and record; a field with no value to type it by is a config error naming the
// key and the field.
TEST(JsonlFilesTest, AUserTransformsColumnsTakeTheFirstRecordsTypesAndHoldThem) {
  testing::ScopedTempDir dir("braid-jsonl");
  auto record = [](int i, const std::string& n) {
    const std::string x = i == 0 ? "1" : std::to_string(i) + ".5";
    const std::string o = i % 2 == 1 ? "[1, \"two\"]" : "[]";
    return "{\"o\": " + o + ", \"n\": " + n + ", \"x\": " + x + ", \"d\": \"2020-01-0" +
           std::to_string(1 + i % 9) + "\", \"m\": {\"k\": " + std::to_string(i) +
           ", \"t\": \"v\"}, \"l\": [" + std::to_string(i) + ", 7], \"e\": null}\n";
  };
  std::string a, b;
  for (int i = 0; i < 30; ++i) a += record(i, std::to_string(i));
  for (int i = 30; i < 40; ++i) b += record(i, std::to_string(i));
  ASSERT_TRUE(Write(dir.Sub("a.jsonl"), a).ok());
  ASSERT_TRUE(Write(dir.Sub("b.jsonl.gz"), b, arrow::Compression::GZIP).ok());
  auto any = [](const std::string& name) {
    ColumnSpec spec{name, "sources[0].transform.columns." + name,
                    [](const arrow::DataType&) { return std::string(); }};
    spec.any_type = true;
    return spec;
  };
  SourceConfig s = Jsonl(dir.path().string());
  s.tokens_column.clear();
  auto files = SourceFiles::Open(s, "sources[0]", {any("n"), any("x"), any("d"), any("m"),
                                                  any("l")});
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  auto cols = (*files)->ReadColumns(1, 0);
  ASSERT_TRUE(cols.ok()) << cols.status().ToString();
  ASSERT_EQ(cols->size(), 5u);
  EXPECT_EQ((*cols)[0]->type()->ToString(), "int64");
  EXPECT_EQ((*cols)[1]->type()->ToString(), "double");
  EXPECT_EQ((*cols)[2]->type()->ToString(), "string");
  EXPECT_EQ((*cols)[3]->type()->ToString(), "struct<k: int64, t: string>");
  EXPECT_EQ((*cols)[4]->type()->ToString(), "list<item: int64>");
  ASSERT_EQ((*cols)[0]->length(), 10);
  EXPECT_EQ(static_cast<const arrow::Int64Array&>(*(*cols)[0]).Value(3), 33);
  EXPECT_EQ(static_cast<const arrow::DoubleArray&>(*(*cols)[1]).Value(3), 33.5);
  EXPECT_EQ(static_cast<const arrow::StringArray&>(*(*cols)[2]).GetString(3),
            "2020-01-07");
  // A later file whose `n` is a string: its record is an error naming file and record.
  ASSERT_TRUE(Write(dir.Sub("c.jsonl"), record(40, "40") + record(41, "\"x\"")).ok());
  files = SourceFiles::Open(s, "sources[0]", {any("n")});
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  auto bad = (*files)->ReadColumns(2, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr(dir.Sub("c.jsonl")),
                                            HasSubstr("row 1")));
  // Types that do not unify in the first records: the file and the field.
  testing::ScopedTempDir mixed("braid-jsonl");
  ASSERT_TRUE(Write(mixed.Sub("m.jsonl"), "{\"n\": 1}\n{\"n\": \"one\"}\n").ok());
  SourceConfig m = Jsonl(mixed.Sub("m.jsonl"));
  m.tokens_column.clear();
  auto unmixed = SourceFiles::Open(m, "sources[0]", {any("n")});
  ASSERT_FALSE(unmixed.ok());
  EXPECT_THAT(unmixed.status().message(),
              AllOf(HasSubstr(mixed.Sub("m.jsonl")), HasSubstr("field 'n'"),
                    HasSubstr("do not unify")));
  // No value to take a type from: the key, the field and the file it looked in.
  for (const char* field : {"e", "absent"}) {
    auto untyped = SourceFiles::Open(s, "sources[0]", {any(field)});
    ASSERT_FALSE(untyped.ok()) << field;
    EXPECT_THAT(untyped.status().message(),
                AllOf(HasSubstr("sources[0].transform.columns." + std::string(field)),
                      HasSubstr("'" + std::string(field) + "'"),
                      HasSubstr(dir.Sub("a.jsonl"))));
  }
}

// An image field (a column that takes bytes) holds where each image is: the reader
// loads them, and the file's bytes, which size the windows, count them.
TEST(JsonlFilesTest, AnImageFieldIsLoadedAndItsImagesCountInTheFilesBytes) {
  testing::ScopedTempDir dir("braid-jsonl");
  std::filesystem::create_directories(dir.Sub("imgs"));
  for (int i = 0; i < 3; ++i) {
    std::ofstream(dir.Sub("imgs/" + std::to_string(i) + ".jpg"), std::ios::binary)
        << std::string(1000, char('a' + i));
  }
  std::string body;
  for (int r = 0; r < 20; ++r) {
    body += "{\"image\": \"imgs/" + std::to_string(r % 3) + ".jpg\", \"caption\": \"c" +
            std::to_string(r) + "\"}\n";
  }
  ASSERT_TRUE(Write(dir.Sub("a.jsonl"), body).ok());
  SourceConfig s = Jsonl(dir.Sub("a.jsonl"));
  s.tokens_column.clear();
  ColumnSpec image{"image", "sources[0].image_column", [](const arrow::DataType& t) {
                     return t.id() == arrow::Type::BINARY ? std::string()
                                                          : std::string("binary");
                   }};
  auto files = SourceFiles::Open(s, "sources[0]", {image});
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  const int64_t bytes = (*files)->files()[0].row_group_bytes.at(0);
  EXPECT_GE(bytes, 20 * 1000);
  EXPECT_LE(bytes, 20 * 1000 + int64_t(body.size()));
  auto cols = (*files)->ReadColumns(0, 0);
  ASSERT_TRUE(cols.ok()) << cols.status().ToString();
  const auto& got = static_cast<const arrow::BinaryArray&>(*cols->front());
  ASSERT_EQ(got.length(), 20);
  EXPECT_EQ(got.GetString(4), std::string(1000, 'b'));
  // A later open in this process takes the first records' types and image sizes from
  // the first open: it loads no image (they are gone now) and sizes the file alike.
  std::filesystem::remove_all(dir.Sub("imgs"));
  auto again = SourceFiles::Open(s, "sources[0]", {image});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->files()[0].row_group_bytes.at(0), bytes);
  // Images on another filesystem than the records: a config error naming the key.
  SourceConfig elsewhere = s;
  elsewhere.image_folder = "s3://bucket/imgs";
  auto other = SourceFiles::Open(elsewhere, "sources[0]", {image});
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(),
              AllOf(HasSubstr("sources[0].image.folder"), HasSubstr("s3 filesystem")));
  // A number where the paths are: the key, the field and what it holds.
  ASSERT_TRUE(Write(dir.Sub("b.jsonl"), "{\"image\": 3}\n").ok());
  s.path = dir.Sub("b.jsonl");
  auto wrong = SourceFiles::Open(s, "sources[0]", {image});
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(),
              AllOf(HasSubstr("sources[0].image_column"), HasSubstr("int64"),
                    HasSubstr("path or data: URI")));
}

// Openers of one source at once (a node's embedded ranks, here two threads that share no
// open state) with a length cache count each file once between them: one waits for the
// file another is counting and reads its counts from the cache.
TEST(JsonlFilesTest, OpenersAtOnceCountEachFileOnceBetweenThemWithALengthCache) {
  testing::ScopedTempDir dir("braid-jsonl");
  std::vector<std::string> paths;
  std::vector<arrow::fs::FileInfo> stamps;
  arrow::fs::LocalFileSystem fs;
  for (int i = 0; i < 4; ++i) {
    paths.push_back(dir.Sub("f" + std::to_string(i) + ".jsonl"));
    ASSERT_TRUE(Write(paths.back(), Lines(MakeDocs(5 + i, uint64_t(i)))).ok());
    stamps.push_back(fs.GetFileInfo(paths.back()).ValueOrDie());
  }
  SourceConfig s = Jsonl(dir.path().string());
  s.length_cache_dir = dir.Sub("cache");
  internal::ForgetCountsKeptInProcess();
  std::vector<std::atomic<int>> counts(paths.size());
  auto count = [&](size_t file, int64_t* rows, int64_t* bytes, Status*) {
    ++counts[file];
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // both are opening
    *rows = int64_t(5 + file);
    *bytes = 100;
    return Status::OK();
  };
  std::vector<Result<std::vector<int64_t>>> got(2, Status::UnknownError("not run"));
  std::vector<std::thread> openers;
  for (int t = 0; t < 2; ++t) {
    openers.emplace_back([&, t] {
      internal::FormatOpen open;
      got[size_t(t)] = open.AddWholeFiles(&fs, paths, stamps, s, "test 1", count);
    });
  }
  for (auto& t : openers) t.join();
  for (const auto& rows : got) {
    ASSERT_TRUE(rows.ok()) << rows.status().ToString();
    EXPECT_EQ(*rows, (std::vector<int64_t>{5, 6, 7, 8}));
  }
  for (size_t f = 0; f < paths.size(); ++f) EXPECT_EQ(counts[f].load(), 1) << f;
}

}  // namespace
}  // namespace braid
