#include "braid/io/source_files.h"

#include <arrow/api.h>
#include <arrow/filesystem/localfs.h>
#include <arrow/io/file.h>
#include <arrow/io/interfaces.h>
#include <arrow/util/uri.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>

#include "braid/source/source_loader.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A storage that fails on request, reached through the "flaky://" URI scheme: local files
// whose opens, or reads after opening, fail a set number of times per path (-1: always).
struct FlakyState {
  std::mutex mu;
  std::map<std::string, int> open_failures;  // GUARDED_BY(mu)
  std::map<std::string, int> read_failures;  // GUARDED_BY(mu)
  std::map<std::string, int> opens;          // GUARDED_BY(mu) attempts, failed or not

  // True if this call should fail (and counts it down).
  bool Fail(std::map<std::string, int>* failures, const std::string& path) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = failures->find(path);
    if (it == failures->end() || it->second == 0) return false;
    if (it->second > 0) --it->second;
    return true;
  }
  void Reset() {
    std::lock_guard<std::mutex> lock(mu);
    open_failures.clear();
    read_failures.clear();
    opens.clear();
  }
};

FlakyState& Flaky() {
  static FlakyState* state = new FlakyState();
  return *state;
}

class FlakyFile : public arrow::io::RandomAccessFile {
 public:
  FlakyFile(std::shared_ptr<arrow::io::RandomAccessFile> inner, std::string path)
      : inner_(std::move(inner)), path_(std::move(path)) {}
  arrow::Status Close() override { return inner_->Close(); }
  bool closed() const override { return inner_->closed(); }
  arrow::Result<int64_t> Tell() const override { return inner_->Tell(); }
  arrow::Status Seek(int64_t position) override { return inner_->Seek(position); }
  arrow::Result<int64_t> GetSize() override { return inner_->GetSize(); }
  arrow::Result<int64_t> Read(int64_t nbytes, void* out) override {
    ARROW_RETURN_NOT_OK(Check());
    return inner_->Read(nbytes, out);
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> Read(int64_t nbytes) override {
    ARROW_RETURN_NOT_OK(Check());
    return inner_->Read(nbytes);
  }
  arrow::Result<int64_t> ReadAt(int64_t position, int64_t nbytes, bool allow_short_read,
                                void* out) override {
    ARROW_RETURN_NOT_OK(Check());
    return inner_->ReadAt(position, nbytes, allow_short_read, out);
  }
  arrow::Result<int64_t> ReadAt(int64_t position, int64_t nbytes, void* out) override {
    ARROW_RETURN_NOT_OK(Check());
    return inner_->ReadAt(position, nbytes, out);
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(int64_t position, int64_t nbytes,
                                                       bool allow_short_read) override {
    ARROW_RETURN_NOT_OK(Check());
    return inner_->ReadAt(position, nbytes, allow_short_read);
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(int64_t position,
                                                       int64_t nbytes) override {
    ARROW_RETURN_NOT_OK(Check());
    return inner_->ReadAt(position, nbytes);
  }

 private:
  arrow::Status Check() {
    if (Flaky().Fail(&Flaky().read_failures, path_)) {
      return arrow::Status::IOError("flaky: the server stopped answering");
    }
    return arrow::Status::OK();
  }
  std::shared_ptr<arrow::io::RandomAccessFile> inner_;
  std::string path_;
};

class FlakyFileSystem : public arrow::fs::LocalFileSystem {
 public:
  std::string type_name() const override { return "flaky"; }
  using arrow::fs::LocalFileSystem::OpenInputFile;
  arrow::Result<std::shared_ptr<arrow::io::RandomAccessFile>> OpenInputFile(
      const std::string& path) override {
    {
      std::lock_guard<std::mutex> lock(Flaky().mu);
      ++Flaky().opens[path];
    }
    if (Flaky().Fail(&Flaky().open_failures, path)) {
      return arrow::Status::IOError("flaky: cannot reach ", path);
    }
    ARROW_ASSIGN_OR_RAISE(auto file, arrow::fs::LocalFileSystem::OpenInputFile(path));
    return std::make_shared<FlakyFile>(std::move(file), path);
  }
};

void RegisterFlaky() {
  static const arrow::Status registered = arrow::fs::RegisterFileSystemFactory(
      "flaky",
      arrow::fs::FileSystemFactory(
          [](const arrow::util::Uri& uri, const arrow::io::IOContext&,
             std::string* out_path) -> Result<std::shared_ptr<arrow::fs::FileSystem>> {
            if (out_path != nullptr) *out_path = uri.path();
            return std::make_shared<FlakyFileSystem>();
          },
          __FILE__, __LINE__));
  ASSERT_TRUE(registered.ok()) << registered.ToString();
}

// dir/part-{0,1,2}.parquet (30, 40, 50 rows in row groups of 10) read as flaky://.
class FlakyStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegisterFlaky();
    Flaky().Reset();
    for (int f = 0; f < 3; ++f) {
      testing::TokenFileOptions opts;
      opts.row_group_rows = 10;
      const auto docs = testing::RandomDocs(30 + 10 * f, {}, uint64_t(f + 1));
      ASSERT_TRUE(testing::WriteTokenFile(Part(f), docs, opts).ok());
    }
  }
  void TearDown() override { Flaky().Reset(); }
  std::string Part(int f) const {
    return dir_.Sub("src/part-" + std::to_string(f) + ".parquet");
  }
  Config JobConfig(OnError on_error, bool flaky = true) const {
    Config c;
    c.seed = 2;
    c.batch.seq_len = 128;
    c.batch.global_tokens = 128;
    SourceConfig s;
    s.name = "src";
    s.path = (flaky ? "flaky://" : "") + dir_.Sub("src/*.parquet");
    s.tokens_column = "input_ids";
    s.shuffle_window_rows = 15;
    s.on_error = on_error;
    c.sources.push_back(s);
    return c;
  }
  // (file, row, skip) of the next n samples, or the first error.
  Result<std::vector<std::tuple<int32_t, int64_t, SkipReason>>> Stream(SampleStream* s,
                                                                       int64_t n) {
    std::vector<std::tuple<int32_t, int64_t, SkipReason>> out;
    for (int64_t i = 0; i < n; ++i) {
      ARROW_ASSIGN_OR_RAISE(Sample sample, s->Next());
      out.emplace_back(sample.meta.file, sample.meta.row, sample.meta.skip);
    }
    return out;
  }
  std::unique_ptr<SourceLoader> Loader(OnError on_error, bool flaky = true) {
    auto loader = SourceLoader::Make(JobConfig(on_error, flaky), 0, {}, {});
    EXPECT_TRUE(loader.ok()) << loader.status().ToString();
    return loader.ok() ? std::move(*loader) : nullptr;
  }

  testing::ScopedTempDir dir_{"braid-flaky"};
};

TEST_F(FlakyStorageTest, ShortOutagesAreRetriedAndChangeNothing) {
  auto plain = Loader(OnError::kFail, /*flaky=*/false);
  ASSERT_NE(plain, nullptr);
  auto expected = Stream(plain.get(), 240);
  ASSERT_TRUE(expected.ok());
  // A footer that fails twice at open time, a file that stops answering for three opens
  // mid-run, and reads that fail twice on an open file: all within the 4 tries.
  Flaky().open_failures[Part(0)] = 2;
  auto loader = Loader(OnError::kFail);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(Flaky().opens[Part(0)], 3);
  Flaky().open_failures[Part(1)] = 3;
  Flaky().read_failures[Part(2)] = 2;
  auto got = Stream(loader.get(), 240);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, *expected);
  EXPECT_TRUE(loader->skipped_files().empty());
}

TEST_F(FlakyStorageTest, AFileThatStopsAnsweringMidRunIsSkippedAfterFourTries) {
  auto loader = Loader(OnError::kSkip);
  ASSERT_NE(loader, nullptr);
  Flaky().read_failures[Part(1)] = -1;  // opens, then every read fails
  ::testing::internal::CaptureStderr();
  auto got = Stream(loader.get(), 120);
  loader->Stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  int64_t skipped = 0;
  for (const auto& [file, row, skip] : *got) {
    EXPECT_EQ(skip != SkipReason::kNone, file == 1);
    skipped += skip != SkipReason::kNone;
  }
  EXPECT_EQ(skipped, 40);
  EXPECT_EQ(loader->skipped_files(), std::vector<int32_t>{1});
  // Each try reopens the file; the file is lost after the 4th, never tried again.
  EXPECT_EQ(Flaky().opens[Part(1)], 1 + 4);  // the footer, then 4 tries
  EXPECT_THAT(log,
              AllOf(HasSubstr(Part(1)), HasSubstr("stopped answering"),
                    HasSubstr("(4 tries)"), HasSubstr("lost for the rest of the run")));
}

TEST_F(FlakyStorageTest, UnderFailItIsOneStorageErrorNamingTheFile) {
  auto loader = Loader(OnError::kFail);
  ASSERT_NE(loader, nullptr);
  Flaky().read_failures[Part(1)] = -1;
  auto got = Stream(loader.get(), 120);
  ASSERT_FALSE(got.ok());
  const Status& st = got.status();
  EXPECT_TRUE(st.IsIOError()) << st.ToString();
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr(Part(1) + " (row group "), HasSubstr("stopped answering"),
                    HasSubstr("(4 tries)")));
  EXPECT_EQ(st.message().find('\n'), std::string::npos);
}

TEST_F(FlakyStorageTest, AFooterThatNeverAnswersIsSkippedAtOpenOrFails) {
  Flaky().open_failures[Part(2)] = -1;
  auto failing = SourceLoader::Make(JobConfig(OnError::kFail), 0, {}, {});
  ASSERT_FALSE(failing.ok());
  EXPECT_TRUE(failing.status().IsIOError());
  EXPECT_THAT(failing.status().message(),
              AllOf(HasSubstr(Part(2)), HasSubstr("(4 tries)")));
  auto skipping = Loader(OnError::kSkip);
  ASSERT_NE(skipping, nullptr);
  EXPECT_THAT(skipping->file_list()[2].unreadable, HasSubstr("cannot reach"));
  EXPECT_EQ(skipping->rows_per_epoch(), 30 + 40);
}

// Footers are read side by side, 64 files at a time: what is kept, each file's row
// groups and the error are those of path order, in the first batch and after it.
TEST_F(FlakyStorageTest, FootersReadSideBySideKeepPathOrder) {
  std::vector<int64_t> rows;
  auto name = [&](int f) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "many/part-%03d.parquet", f);
    return dir_.Sub(buf);
  };
  std::filesystem::create_directories(dir_.Sub("many"));
  for (int f = 0; f < 70; ++f) {
    testing::TokenFileOptions opts;
    opts.row_group_rows = 4 + f % 5;
    rows.push_back(5 + f);
    const auto docs = testing::RandomDocs(rows.back(), {}, uint64_t(100 + f));
    ASSERT_TRUE(testing::WriteTokenFile(name(f), docs, opts).ok());
  }
  Flaky().open_failures[name(5)] = -1;   // in the first 64
  Flaky().open_failures[name(66)] = -1;  // after them
  SourceConfig s;
  s.name = "src";
  s.path = "flaky://" + dir_.Sub("many/*.parquet");
  s.tokens_column = "input_ids";
  s.on_error = OnError::kFail;
  auto failing = SourceFiles::Open(s, "sources[0]");
  ASSERT_FALSE(failing.ok());
  EXPECT_THAT(failing.status().message(),
              AllOf(HasSubstr(name(5)), HasSubstr("(4 tries)")));
  EXPECT_THAT(failing.status().message(), ::testing::Not(HasSubstr(name(66))));
  s.on_error = OnError::kSkip;
  auto files = SourceFiles::Open(s, "sources[0]");
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  ASSERT_EQ((*files)->files().size(), 70u);
  EXPECT_EQ((*files)->unreadable_files(), 2);
  int64_t total = 0;
  for (int f = 0; f < 70; ++f) {
    const auto& file = (*files)->files()[size_t(f)];
    EXPECT_NE(file.path.find(name(f)), std::string::npos) << f;
    if (f == 5 || f == 66) {
      EXPECT_THAT(file.unreadable, HasSubstr("cannot reach")) << f;
      EXPECT_EQ(file.num_rows, 0) << f;
      continue;
    }
    EXPECT_TRUE(file.unreadable.empty()) << f;
    EXPECT_EQ(file.num_rows, rows[size_t(f)]) << f;
    const int64_t per = 4 + f % 5;
    EXPECT_EQ(int64_t(file.row_group_rows.size()), (rows[size_t(f)] + per - 1) / per)
        << f;
    total += rows[size_t(f)];
  }
  EXPECT_EQ((*files)->total_rows(), total);
}

// ---------------------------------------------------------------------------
// ReadLengths: each row's token count without its tokens.

using Docs = std::vector<std::vector<int32_t>>;

SourceConfig TokenSource(const std::string& path, const std::string& length_column = "") {
  SourceConfig s;
  s.name = "src";
  s.path = path;
  s.tokens_column = "input_ids";
  s.length_column = length_column;
  return s;
}

std::unique_ptr<SourceFiles> OpenFiles(const SourceConfig& s) {
  std::vector<ColumnSpec> specs = {
      TokenColumnSpec(s.tokens_column, "sources[0].tokens_column")};
  if (!s.length_column.empty()) {
    specs.push_back(LengthColumnSpec(s.length_column, "sources[0].length_column"));
  }
  auto files = SourceFiles::Open(s, "sources[0]", specs);
  EXPECT_TRUE(files.ok()) << files.status().ToString();
  return files.ok() ? std::move(*files) : nullptr;
}

// The counts of a token list read whole (what the token column transform sees).
std::vector<RowLength> ListLengths(const arrow::Array& array) {
  std::vector<RowLength> out;
  const auto& list = static_cast<const arrow::ListArray&>(array);
  for (int64_t i = 0; i < list.length(); ++i) {
    RowLength r;
    r.null = list.IsNull(i);
    if (!r.null) {
      r.tokens = list.value_length(i);
      for (int64_t k = 0; k < r.tokens; ++k) {
        if (list.values()->IsNull(list.value_offset(i) + k)) r.null_values = true;
      }
    }
    out.push_back(r);
  }
  return out;
}

MATCHER(SameLength, "") {
  const RowLength& a = std::get<0>(arg);
  const RowLength& b = std::get<1>(arg);
  return a.tokens == b.tokens && a.null == b.null && a.null_values == b.null_values;
}

// ReadLengths against the lengths of the lists read whole, row group by row group.
void ExpectLengthsOfTheLists(const std::string& path) {
  auto files = OpenFiles(TokenSource(path));
  ASSERT_NE(files, nullptr);
  int64_t rows = 0;
  for (size_t rg = 0; rg < files->files()[0].row_group_rows.size(); ++rg) {
    auto lengths = files->ReadLengths(0, int(rg));
    ASSERT_TRUE(lengths.ok()) << lengths.status().ToString();
    auto tokens = files->ReadTokens(0, int(rg));
    ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
    EXPECT_THAT(**lengths, ::testing::Pointwise(SameLength(), ListLengths(**tokens)))
        << path << " row group " << rg;
    rows += int64_t((*lengths)->size());
  }
  EXPECT_EQ(rows, files->total_rows());
}

TEST(ReadLengthsTest, LevelsGiveTheListLengthsOfEveryLayout) {
  testing::ScopedTempDir dir("braid-lengths");
  testing::LengthSpec spec;
  spec.median_tokens = 60;
  spec.max_tokens = 2000;
  Docs docs = testing::RandomDocs(300, spec, 11);
  docs[0].clear();  // empty rows, first in a row group and inside one
  docs[41].clear();
  struct Layout {
    std::string name;
    testing::TokenFileOptions options;
  };
  std::vector<Layout> layouts(9);
  layouts[0].name = "plain";
  layouts[1].name = "required";
  layouts[1].options.required = true;
  layouts[2].name = "int64";
  layouts[2].options.int64_values = true;
  layouts[3].name = "v2";
  layouts[3].options.data_page_v2 = true;
  layouts[4].name = "snappy";
  layouts[4].options.compression = "snappy";
  layouts[5].name = "zstd-v2";
  layouts[5].options.compression = "zstd";
  layouts[5].options.data_page_v2 = true;
  layouts[6].name = "small-pages";  // rows span pages
  layouts[6].options.data_page_bytes = 200;
  layouts[7].name = "small-pages-v2";
  layouts[7].options.data_page_bytes = 200;
  layouts[7].options.data_page_v2 = true;
  layouts[7].options.compression = "snappy";
  layouts[8].name = "one-row-group";
  layouts[8].options.row_group_rows = 1 << 20;
  for (auto& layout : layouts) {
    if (!layout.options.required) layout.options.null_rows = {5, 40, 299};
    if (layout.options.row_group_rows == 1024) layout.options.row_group_rows = 37;
    const std::string path = dir.Sub(layout.name + ".parquet");
    ASSERT_TRUE(testing::WriteTokenFile(path, docs, layout.options).ok()) << layout.name;
    SCOPED_TRACE(layout.name);
    ExpectLengthsOfTheLists(path);
  }
}

TEST(ReadLengthsTest, NullIdsInsideAListAreFlagged) {
  testing::ScopedTempDir dir("braid-lengths-null-ids");
  auto values = std::make_shared<arrow::Int32Builder>();
  arrow::ListBuilder list(arrow::default_memory_pool(), values);
  for (int row = 0; row < 50; ++row) {
    ASSERT_TRUE(list.Append().ok());
    for (int k = 0; k < row % 7; ++k) {
      ASSERT_TRUE((row == 9 && k == 1 ? values->AppendNull() : values->Append(k)).ok());
    }
  }
  auto array = list.Finish();
  ASSERT_TRUE(array.ok());
  auto table = arrow::Table::Make(
      arrow::schema({arrow::field("input_ids", (*array)->type())}), {*array});
  const std::string path = dir.Sub("t.parquet");
  auto out = arrow::io::FileOutputStream::Open(path);
  ASSERT_TRUE(out.ok());
  ASSERT_TRUE(
      parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), *out, 16).ok());
  ASSERT_TRUE((*out)->Close().ok());
  ExpectLengthsOfTheLists(path);
  auto files = OpenFiles(TokenSource(path));
  auto lengths = files->ReadLengths(0, 0);
  ASSERT_TRUE(lengths.ok());
  EXPECT_TRUE((**lengths)[9].null_values);
  EXPECT_EQ((**lengths)[9].tokens, 2);
  EXPECT_FALSE((**lengths)[8].null_values);
}

TEST(ReadLengthsTest, TheLengthColumnIsReadInsteadOfTheTokens) {
  testing::ScopedTempDir dir("braid-lengths-column");
  testing::TokenFileOptions o;
  o.row_group_rows = 20;
  o.length_column = "n";
  o.null_rows = {3};
  o.length_overrides = {{7, 1234}};  // planning cannot tell; a run checks it
  const std::string path = dir.Sub("t.parquet");
  const Docs docs = testing::RandomDocs(60, {}, 5);
  ASSERT_TRUE(testing::WriteTokenFile(path, docs, o).ok());
  ASSERT_TRUE(testing::CorruptRowGroup(path, 0, /*column=*/0).ok());  // the token ids
  auto files = OpenFiles(TokenSource(path, "n"));
  ASSERT_NE(files, nullptr);
  auto lengths = files->ReadLengths(0, 0);
  ASSERT_TRUE(lengths.ok()) << lengths.status().ToString();
  ASSERT_EQ((*lengths)->size(), 20u);
  for (int64_t i = 0; i < 20; ++i) {
    const RowLength& r = (**lengths)[size_t(i)];
    EXPECT_EQ(r.null, i == 3);
    EXPECT_EQ(r.tokens, i == 3 ? 0 : i == 7 ? 1234 : int64_t(docs[size_t(i)].size()));
  }
  EXPECT_FALSE(files->ReadColumns(0, 0).ok());  // the tokens themselves do not read
  // Without the length column the counts come from the token column: it does not read.
  auto levels = OpenFiles(TokenSource(path));
  auto bad = levels->ReadLengths(0, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr(path), HasSubstr("row group 0")));
  EXPECT_TRUE(levels->ReadLengths(0, 1).ok());
}

TEST(ReadLengthsTest, ANegativeLengthIsADataErrorNamingTheRowAndTheKey) {
  testing::ScopedTempDir dir("braid-lengths-negative");
  testing::TokenFileOptions o;
  o.row_group_rows = 10;
  o.length_column = "n";
  o.length_overrides = {{14, -3}};
  const std::string path = dir.Sub("t.parquet");
  ASSERT_TRUE(testing::WriteTokenFile(path, testing::RandomDocs(30, {}, 5), o).ok());
  auto files = OpenFiles(TokenSource(path, "n"));
  ASSERT_NE(files, nullptr);
  EXPECT_TRUE(files->ReadLengths(0, 0).ok());
  auto bad = files->ReadLengths(0, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().IsInvalid());
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr(path), HasSubstr("row group 1"), HasSubstr("row 14"),
                    HasSubstr("sources[0].length_column"), HasSubstr("-3")));
  const auto* detail = GetErrorDetail(bad.status());
  ASSERT_NE(detail, nullptr);
  EXPECT_EQ(detail->kind(), ErrorKind::kData);
}

TEST(ReadLengthsTest, AMissingOrNonIntegerLengthColumnIsAConfigErrorNamingTheFile) {
  testing::ScopedTempDir dir("braid-lengths-config");
  const std::string path = dir.Sub("t.parquet");
  testing::TokenFileOptions o;
  o.length_column = "n";
  ASSERT_TRUE(testing::WriteTokenFile(path, testing::RandomDocs(30, {}, 5), o).ok());
  auto open = [&](const std::string& column) {
    SourceConfig s = TokenSource(path, column);
    return SourceFiles::Open(s, "sources[0]",
                             {TokenColumnSpec("input_ids", "sources[0].tokens_column"),
                              LengthColumnSpec(column, "sources[0].length_column")})
        .status();
  };
  for (const std::string column : {"missing", "input_ids"}) {
    const Status st = open(column);
    ASSERT_FALSE(st.ok()) << column;
    EXPECT_TRUE(st.IsInvalid());
    EXPECT_THAT(st.message(), AllOf(HasSubstr("sources[0].length_column"),
                                    HasSubstr(path), HasSubstr(column)));
    const auto* detail = GetErrorDetail(st);
    ASSERT_NE(detail, nullptr);
    EXPECT_EQ(detail->kind(), ErrorKind::kConfig);
    EXPECT_EQ(detail->where(), "sources[0].length_column");
  }
  EXPECT_THAT(open("input_ids").message(), HasSubstr("expected an integer column"));
  EXPECT_THAT(open("missing").message(), HasSubstr("columns: input_ids, n"));
  EXPECT_TRUE(open("n").ok());
}

TEST(ReadLengthsTest, TheLengthColumnDoesNotMoveTheWindows) {
  // The footer's size estimate (which bounds windows in bytes) counts the token column
  // only, so a source with a length column has the order of the same source without.
  testing::ScopedTempDir dir("braid-lengths-windows");
  testing::TokenFileOptions o;
  o.row_group_rows = 10;
  o.length_column = "n";
  const std::string path = dir.Sub("t.parquet");
  ASSERT_TRUE(testing::WriteTokenFile(path, testing::RandomDocs(30, {}, 5), o).ok());
  auto with = OpenFiles(TokenSource(path, "n"));
  auto without = OpenFiles(TokenSource(path));
  ASSERT_TRUE(with && without);
  EXPECT_EQ(with->files()[0].row_group_bytes, without->files()[0].row_group_bytes);
}

// Files that change under a run (source_files.h): the file is stamped an hour in the
// past, as a file written before the run is, so the rewrite's timestamp differs whatever
// the filesystem's granularity.
void BackdateFile(const std::string& path) {
  std::filesystem::last_write_time(
      path, std::filesystem::last_write_time(path) - std::chrono::hours(1));
}

Docs ShiftedDocs(const Docs& docs, int32_t by) {
  Docs out = docs;
  for (auto& d : out) {
    for (auto& t : d) t += by;
  }
  return out;
}

// `count` documents of 20 tokens or so (at most 60), seeded.
Docs ShortDocs(int64_t count, uint64_t seed) {
  testing::LengthSpec spec;
  spec.median_tokens = 20;
  spec.max_tokens = 60;
  return testing::RandomDocs(count, spec, seed);
}

testing::TokenFileOptions TenRowGroups() {
  testing::TokenFileOptions options;
  options.row_group_rows = 10;
  return options;
}

int32_t FirstToken(const arrow::Array& tokens) {
  const auto& list = static_cast<const arrow::ListArray&>(tokens);
  return static_cast<const arrow::Int32Array&>(*list.values())
      .Value(list.value_offset(0));
}

TEST(ChangedFileTest, AFileRewrittenInPlaceIsNeverReadAgainByAnyRead) {
  testing::ScopedTempDir dir("braid-changed");
  const Docs docs = ShortDocs(60, 5);
  const testing::TokenFileOptions options = TenRowGroups();
  for (const std::string read : {"columns", "lengths", "block"}) {
    SCOPED_TRACE(read);
    const std::string path = dir.Sub(read + ".parquet");
    ASSERT_TRUE(testing::WriteTokenFile(path, docs, options).ok());
    BackdateFile(path);
    auto files = OpenFiles(TokenSource(path));
    ASSERT_NE(files, nullptr);
    auto read_rg = [&](int rg) -> Status {
      if (read == "columns") return files->ReadTokens(0, rg).status();
      if (read == "lengths") return files->ReadLengths(0, rg).status();
      return files->ReadBlock(0, rg, 5, 0).status();
    };
    ASSERT_TRUE(read_rg(0).ok());
    // The same writer, the same lengths, other ids: the same size, the old footer's
    // offsets still point at pages.
    const int64_t size = int64_t(std::filesystem::file_size(path));
    ASSERT_TRUE(testing::WriteTokenFile(path, ShiftedDocs(docs, 1), options).ok());
    ASSERT_EQ(int64_t(std::filesystem::file_size(path)), size);
    const Status st = read_rg(1);
    ASSERT_FALSE(st.ok());
    EXPECT_FALSE(st.IsIOError()) << st.ToString();  // a data error: not retried
    EXPECT_THAT(st.message(),
                AllOf(HasSubstr(path), HasSubstr("changed since the source opened it"),
                      HasSubstr("size " + std::to_string(size) + " -> " +
                                std::to_string(size) + " bytes"),
                      HasSubstr("3600.")));
    EXPECT_EQ(st.message().find('\n'), std::string::npos);
    EXPECT_TRUE(files->is_lost(0));
    EXPECT_EQ(files->lost_files(), 1);
    // Every read of it fails from now on, also of a row group read before.
    for (int rg : {0, 1, 2}) {
      const Status again = read_rg(rg);
      EXPECT_THAT(again.message(), HasSubstr("changed since the source opened it")) << rg;
    }
  }
}

TEST(ChangedFileTest, ADeletedFileReadsThroughItsOpenReaderThenNamesItsPath) {
  testing::ScopedTempDir dir("braid-deleted");
  const Docs a = ShortDocs(30, 6);
  const Docs b = ShiftedDocs(a, 1000);
  const testing::TokenFileOptions options = TenRowGroups();
  ASSERT_TRUE(testing::WriteTokenFile(dir.Sub("src/a.parquet"), a, options).ok());
  ASSERT_TRUE(testing::WriteTokenFile(dir.Sub("src/b.parquet"), b, options).ok());
  auto files = OpenFiles(TokenSource(dir.Sub("src/*.parquet")));
  ASSERT_NE(files, nullptr);
  ASSERT_TRUE(files->ReadTokens(0, 0).ok());
  std::filesystem::remove(dir.Sub("src/a.parquet"));
  // Its reader holds the file: row group 1 is still a's.
  auto held = files->ReadTokens(0, 1);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(FirstToken(**held), a[10][0]);
  EXPECT_FALSE(files->is_lost(0));
  ASSERT_TRUE(files->ReadTokens(1, 0).ok());  // the reader moves to b
  const Status gone = files->ReadTokens(0, 2).status();
  EXPECT_TRUE(gone.IsIOError()) << gone.ToString();
  EXPECT_THAT(gone.message(),
              AllOf(HasSubstr(dir.Sub("src/a.parquet")), HasSubstr("(4 tries)")));
  EXPECT_EQ(gone.message().find('\n'), std::string::npos);
  EXPECT_TRUE(files->is_lost(0));
}

TEST(ChangedFileTest, TheLoaderSkipsOrFailsOnAChangedFileAndNeverDeliversItsNewRows) {
  testing::ScopedTempDir dir("braid-changed-loader");
  const Docs docs = ShortDocs(40, 7);
  const testing::TokenFileOptions options = TenRowGroups();
  for (OnError on_error : {OnError::kFail, OnError::kSkip}) {
    SCOPED_TRACE(on_error == OnError::kFail ? "fail" : "skip");
    for (int f = 0; f < 3; ++f) {
      const std::string path = dir.Sub("src/part-" + std::to_string(f) + ".parquet");
      ASSERT_TRUE(
          testing::WriteTokenFile(path, ShiftedDocs(docs, 100 * f), options).ok());
      BackdateFile(path);
    }
    Config c;
    c.seed = 4;
    c.batch.seq_len = 128;
    c.batch.global_tokens = 128;
    SourceConfig s = TokenSource(dir.Sub("src/*.parquet"));
    s.shuffle_window_rows = 10;  // a window per row group: files are read as consumed
    s.on_error = on_error;
    c.sources.push_back(s);
    SourceLoader::Options loader_options;
    loader_options.read_ahead_bytes = 1;  // one window ahead at most
    auto loader = SourceLoader::Make(c, 0, {}, loader_options);
    ASSERT_TRUE(loader.ok()) << loader.status().ToString();
    // The new ids are past every old one: a new row delivered would show.
    const std::string changed = dir.Sub("src/part-1.parquet");
    ASSERT_TRUE(
        testing::WriteTokenFile(changed, ShiftedDocs(docs, 100000), options).ok());
    ::testing::internal::CaptureStderr();
    Status error;
    int64_t skipped = 0, delivered = 0;
    for (int i = 0; i < 120; ++i) {
      auto sample = (*loader)->Next();
      if (!sample.ok()) {
        error = sample.status();
        break;
      }
      if (sample->meta.skip != SkipReason::kNone) {
        EXPECT_EQ(sample->meta.file, 1);
        ++skipped;
        continue;
      }
      auto payload = sample->payload.Get();
      if (!payload.ok()) {
        error = payload.status();
        break;
      }
      ++delivered;
      for (int32_t t : (*payload)->tokens) ASSERT_LT(t, 100000) << "a new row";
    }
    (*loader)->Stop();
    const std::string log = ::testing::internal::GetCapturedStderr();
    if (on_error == OnError::kFail) {
      ASSERT_FALSE(error.ok());
      EXPECT_THAT(error.message(), AllOf(HasSubstr(changed),
                                         HasSubstr("changed since the source opened it"),
                                         HasSubstr("set on_error: skip")));
    } else {
      ASSERT_TRUE(error.ok()) << error.ToString();
      EXPECT_EQ(delivered + skipped, 120);
      EXPECT_GT(skipped, 0);
      EXPECT_EQ((*loader)->skipped_files(), std::vector<int32_t>{1});
      EXPECT_THAT(log, AllOf(HasSubstr(changed), HasSubstr("changed since the source"),
                             HasSubstr("lost for the rest of the run")));
    }
  }
}

}  // namespace
}  // namespace braid
