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

TEST(RetryStorageTest, DefaultBackoffIsSmallAndFixed) {
  const std::vector<int> delays(std::begin(kStorageRetryDelaysMs),
                                std::end(kStorageRetryDelaysMs));
  EXPECT_EQ(delays, (std::vector<int>{50, 200, 800}));
}

}  // namespace
}  // namespace braid::internal
