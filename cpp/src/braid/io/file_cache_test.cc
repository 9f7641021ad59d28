#include "braid/io/file_cache.h"

#include <arrow/buffer.h>
#include <arrow/filesystem/localfs.h>
#include <arrow/io/interfaces.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

namespace stdfs = std::filesystem;
using ::testing::HasSubstr;

// A local folder standing in for remote storage; counts the files copied out of it.
class CountingFileSystem : public arrow::fs::LocalFileSystem {
 public:
  using arrow::fs::LocalFileSystem::OpenInputStream;
  arrow::Result<std::shared_ptr<arrow::io::InputStream>> OpenInputStream(
      const arrow::fs::FileInfo& info) override {
    ++opened;
    return arrow::fs::LocalFileSystem::OpenInputStream(info.path());
  }
  std::atomic<int> opened{0};
};

class FileCacheTest : public ::testing::Test {
 protected:
  // A "remote" file of `size` bytes whose content depends on `seed`; returns its info.
  arrow::fs::FileInfo Remote(const std::string& name, int64_t size, int seed) {
    const std::string path = dir_.Sub("remote-" + name);
    std::ofstream out(path, std::ios::binary);
    for (int64_t i = 0; i < size; ++i) out.put(static_cast<char>((i * 131 + seed) & 0xff));
    out.close();
    auto info = remote_.GetFileInfo(path);
    EXPECT_TRUE(info.ok());
    return *info;
  }

  static std::string ReadAll(arrow::io::RandomAccessFile* file) {
    auto size = file->GetSize();
    EXPECT_TRUE(size.ok());
    auto buffer = file->ReadAt(0, *size);
    EXPECT_TRUE(buffer.ok());
    return (*buffer)->ToString();
  }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // Bytes of the complete copies in the cache folder.
  int64_t CachedBytes() const {
    int64_t total = 0;
    for (const auto& e : stdfs::directory_iterator(cache_dir())) {
      if (e.is_regular_file()) total += static_cast<int64_t>(e.file_size());
    }
    return total;
  }
  std::string cache_dir() const { return dir_.Sub("cache"); }
  bool Cached(const arrow::fs::FileInfo& info) const {
    return stdfs::exists(stdfs::path(cache_dir()) / FileCache::EntryName(info));
  }

  testing::ScopedTempDir dir_{"braid-file-cache"};
  CountingFileSystem remote_;
};

TEST_F(FileCacheTest, CopiesOnDemandAndReusesTheCopy) {
  auto cache = FileCache::Make(cache_dir(), 1 << 20);
  const auto info = Remote("a.parquet", 5000, 1);
  auto absent = cache->Open(&remote_, info, /*download=*/false);
  ASSERT_TRUE(absent.ok()) << absent.status().ToString();
  EXPECT_EQ(*absent, nullptr);
  EXPECT_EQ(remote_.opened, 0);

  auto first = cache->Open(&remote_, info, /*download=*/true);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_NE(*first, nullptr);
  EXPECT_EQ(ReadAll(first->get()), ReadFile(info.path()));
  EXPECT_TRUE(Cached(info));
  first->reset();
  auto again = cache->Open(&remote_, info, /*download=*/false);
  ASSERT_TRUE(again.ok());
  ASSERT_NE(*again, nullptr);
  EXPECT_EQ(remote_.opened, 1);
  // Only complete copies at the top level; no download left behind.
  EXPECT_TRUE(stdfs::is_empty(stdfs::path(cache_dir()) / ".partial"));
}

TEST_F(FileCacheTest, AFileLargerThanTheCacheIsReadRemotely) {
  auto cache = FileCache::Make(cache_dir(), 1000);
  auto opened = cache->Open(&remote_, Remote("big", 1001, 2), /*download=*/true);
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(*opened, nullptr);
  EXPECT_EQ(remote_.opened, 0);
}

TEST_F(FileCacheTest, PinnedCopiesAreNotEvictedAndTheFolderShrinksWhenReleased) {
  auto cache = FileCache::Make(cache_dir(), 2500);
  const auto a = Remote("a", 2000, 3);
  const auto b = Remote("b", 2000, 4);
  auto pin_a = cache->Open(&remote_, a, true);
  ASSERT_TRUE(pin_a.ok() && *pin_a);
  // b does not fit beside a, but a is pinned: both stay, over budget by what is pinned.
  auto pin_b = cache->Open(&remote_, b, true);
  ASSERT_TRUE(pin_b.ok() && *pin_b);
  EXPECT_TRUE(Cached(a));
  EXPECT_TRUE(Cached(b));
  EXPECT_EQ(CachedBytes(), 4000);
  EXPECT_EQ(ReadAll(pin_a->get()), ReadFile(a.path()));
  // Releasing the pins trims the folder back under its budget: the least recently used
  // copy (a) goes.
  pin_a->reset();
  EXPECT_LE(CachedBytes(), 2500);
  EXPECT_FALSE(Cached(a));
  EXPECT_TRUE(Cached(b));
  pin_b->reset();
  EXPECT_TRUE(Cached(b));
}

TEST_F(FileCacheTest, UnpinnedCopiesAreEvictedLeastRecentlyUsedFirst) {
  auto cache = FileCache::Make(cache_dir(), 2500);
  const auto a = Remote("a", 1000, 5);
  const auto b = Remote("b", 1000, 6);
  const auto c = Remote("c", 1000, 7);
  ASSERT_TRUE(cache->Open(&remote_, a, true).ok());
  ASSERT_TRUE(cache->Open(&remote_, b, true).ok());
  // a is older than b until it is used again; c then evicts b.
  const auto past = stdfs::file_time_type::clock::now() - std::chrono::hours(1);
  stdfs::last_write_time(stdfs::path(cache_dir()) / FileCache::EntryName(b), past);
  stdfs::last_write_time(stdfs::path(cache_dir()) / FileCache::EntryName(a),
                         past - std::chrono::minutes(1));
  ASSERT_TRUE(cache->Open(&remote_, a, false).ok());  // touches a
  ASSERT_TRUE(cache->Open(&remote_, c, true).ok());
  EXPECT_TRUE(Cached(a));
  EXPECT_FALSE(Cached(b));
  EXPECT_TRUE(Cached(c));
  EXPECT_EQ(CachedBytes(), 2000);
}

TEST_F(FileCacheTest, AReaderKeepsItsCopyWhenTheFileIsRemovedUnderIt) {
  auto cache = FileCache::Make(cache_dir(), 1 << 20);
  const auto a = Remote("a", 3000, 8);
  auto pin = cache->Open(&remote_, a, true);
  ASSERT_TRUE(pin.ok() && *pin);
  stdfs::remove_all(cache_dir());  // whatever happens to the folder
  EXPECT_EQ(ReadAll(pin->get()), ReadFile(a.path()));
  pin->reset();
  // The next reader makes the copy again.
  auto again = cache->Open(&remote_, a, true);
  ASSERT_TRUE(again.ok() && *again) << again.status().ToString();
  EXPECT_EQ(ReadAll(again->get()), ReadFile(a.path()));
  EXPECT_EQ(remote_.opened, 2);
}

TEST_F(FileCacheTest, AChangedRemoteFileGetsANewEntry) {
  auto cache = FileCache::Make(cache_dir(), 1 << 20);
  auto a = Remote("a", 3000, 9);
  ASSERT_TRUE(cache->Open(&remote_, a, true).ok());
  auto changed = a;
  changed.set_size(2999);
  EXPECT_NE(FileCache::EntryName(a), FileCache::EntryName(changed));
  auto absent = cache->Open(&remote_, changed, false);
  ASSERT_TRUE(absent.ok());
  EXPECT_EQ(*absent, nullptr);
}

TEST_F(FileCacheTest, ConcurrentReadersDownloadAFileOnce) {
  auto cache = FileCache::Make(cache_dir(), 1 << 20);
  const auto a = Remote("a", 200000, 10);
  const std::string expected = ReadFile(a.path());
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      // Each thread its own FileCache, as separate processes would have.
      auto own = FileCache::Make(cache_dir(), 1 << 20);
      auto file = own->Open(&remote_, a, true);
      if (file.ok() && *file && ReadAll(file->get()) == expected) ++good;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good, 8);
  EXPECT_EQ(remote_.opened, 1);
}

TEST_F(FileCacheTest, AFailedDownloadLeavesNothingAndNamesTheFile) {
  auto cache = FileCache::Make(cache_dir(), 1 << 20);
  auto a = Remote("a", 3000, 11);
  stdfs::remove(a.path());
  auto opened = cache->Open(&remote_, a, true);
  ASSERT_FALSE(opened.ok());
  EXPECT_THAT(opened.status().message(), HasSubstr("remote-a"));
  EXPECT_FALSE(Cached(a));
  EXPECT_TRUE(stdfs::is_empty(stdfs::path(cache_dir()) / ".partial"));
}

TEST_F(FileCacheTest, DownloadsLeftByADeadProcessAreRemoved) {
  auto cache = FileCache::Make(cache_dir(), 1 << 20);
  const auto a = Remote("a", 1000, 12);
  ASSERT_TRUE(cache->Open(&remote_, a, true).ok());
  const auto stale = stdfs::path(cache_dir()) / ".partial" / "0123456789abcdef-b.99999-0";
  std::ofstream(stale) << "half a file";
  ASSERT_TRUE(cache->Trim(0, ""));
  EXPECT_FALSE(stdfs::exists(stale));
  EXPECT_TRUE(Cached(a));
}

}  // namespace
}  // namespace braid
