#include "braid/source/source_files.h"

#include <arrow/filesystem/localfs.h>
#include <arrow/util/uri.h>
#include <arrow/io/interfaces.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace braid
