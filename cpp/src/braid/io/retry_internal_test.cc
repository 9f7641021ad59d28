#include "braid/io/retry_internal.h"

#include <gtest/gtest.h>

#include <vector>

namespace braid::internal {
namespace {

constexpr int kNoDelays[] = {0, 0, 0};

TEST(RetryStorageTest, RetriesIoErrorsUpToTheNumberOfDelays) {
  int calls = 0, tries = 0;
  const arrow::Status st = RetryStorage(
      [&] {
        ++calls;
        return arrow::Status::IOError("gone");
      },
      kNoDelays, &tries);
  EXPECT_TRUE(st.IsIOError());
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(tries, 4);
}

TEST(RetryStorageTest, StopsAtTheFirstSuccess) {
  int calls = 0, tries = 0;
  const arrow::Result<int> r = RetryStorage(
      [&]() -> arrow::Result<int> {
        if (++calls < 3) return arrow::Status::IOError("timeout");
        return 42;
      },
      kNoDelays, &tries);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 42);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(tries, 3);
}

TEST(RetryStorageTest, NeverRetriesOtherErrors) {
  int calls = 0, tries = 0;
  const arrow::Status st = RetryStorage(
      [&] {
        ++calls;
        return arrow::Status::Invalid("bad footer");
      },
      kNoDelays, &tries);
  EXPECT_TRUE(st.IsInvalid());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(tries, 1);
}

// Refused access is an I/O error that trying again does not mend: tried once. (The
// messages as Arrow's S3 and GCS filesystems and a local open give them.)
TEST(RetryStorageTest, RefusedAccessIsNotRetried) {
  for (const char* message :
       {"When getting information for key 'a.parquet' in bucket 'b': AWS Error "
        "ACCESS_DENIED during HeadObject operation: No response body.",
        "AWS Error [code 403] during GetObject operation: Forbidden",
        "AWS Error INVALID_ACCESS_KEY_ID during ListObjectsV2: InvalidAccessKeyId",
        "GCS: PERMISSION_DENIED: caller does not have storage.objects.get access",
        "Failed to open local file '/data/a.jsonl'. Detail: [errno 13] Permission "
        "denied"}) {
    SCOPED_TRACE(message);
    int calls = 0, tries = 0;
    const arrow::Status st = RetryStorage(
        [&] {
          ++calls;
          return arrow::Status::IOError(message);
        },
        kNoDelays, &tries);
    EXPECT_TRUE(st.IsIOError());
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(tries, 1);
  }
  // A denied word in another error (bad bytes) changes nothing: not retried either way.
  EXPECT_FALSE(AccessRefused(arrow::Status::Invalid("Permission denied")));
  EXPECT_FALSE(AccessRefused(arrow::Status::IOError("connection reset")));
}

TEST(RetryStorageTest, DefaultBackoffIsSmallAndFixed) {
  const std::vector<int> delays(std::begin(kStorageRetryDelaysMs),
                                std::end(kStorageRetryDelaysMs));
  EXPECT_EQ(delays, (std::vector<int>{50, 200, 800}));
}

}  // namespace
}  // namespace braid::internal
