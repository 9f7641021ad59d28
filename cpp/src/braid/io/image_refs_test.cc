// Image references as JSON Lines image fields hold them: relative and absolute paths,
// data: URIs, lists of them, nulls, and the references that do not load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arrow/api.h>
#include <arrow/filesystem/localfs.h>
#include <arrow/util/base64.h>

#include <fstream>

#include "braid/io/image_refs_internal.h"
#include "braid/testing/temp_dir.h"

namespace braid::internal {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<arrow::Array> Strings(const std::vector<std::optional<std::string>>& v) {
  arrow::StringBuilder b;
  for (const auto& s : v) {
    EXPECT_TRUE((s ? b.Append(*s) : b.AppendNull()).ok());
  }
  return b.Finish().ValueOrDie();
}

TEST(ImageRefsTest, PathsAndDataUrisLoadTheirBytes) {
  testing::ScopedTempDir dir("braid-refs");
  std::filesystem::create_directories(dir.Sub("imgs/sub"));
  std::ofstream(dir.Sub("imgs/sub/a.jpg"), std::ios::binary) << std::string("A\0a", 3);
  std::ofstream(dir.Sub("b.png"), std::ios::binary) << "BB";
  arrow::fs::LocalFileSystem fs;
  const std::string data = "data:image/png;base64," + arrow::util::base64_encode("CCC");
  auto refs = Strings({"sub/a.jpg", dir.Sub("b.png"), data, std::nullopt, "nothing.jpg",
                       "data:image/png;base64,@@@", "data:text/plain,hi", ""});
  auto loaded = LoadImageRefs(&fs, dir.Sub("imgs"), *refs);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const auto& bytes = static_cast<const arrow::BinaryArray&>(*loaded->bytes);
  ASSERT_EQ(bytes.length(), 8);
  EXPECT_EQ(bytes.GetString(0), std::string("A\0a", 3));
  EXPECT_EQ(bytes.GetString(1), "BB");
  EXPECT_EQ(bytes.GetString(2), "CCC");
  for (int64_t row : {3, 4, 5, 6, 7}) EXPECT_TRUE(bytes.IsNull(row)) << row;
  // The null is no error; each other null says why, naming the reference.
  ASSERT_EQ(loaded->bad.size(), 4u);
  EXPECT_EQ(loaded->bad[0].first, 4);
  EXPECT_THAT(loaded->bad[0].second,
              AllOf(HasSubstr("'nothing.jpg'"), HasSubstr("no image file"),
                    HasSubstr(dir.Sub("imgs/nothing.jpg"))));
  EXPECT_THAT(loaded->bad[1].second, HasSubstr("base64 does not decode"));
  EXPECT_THAT(loaded->bad[2].second, HasSubstr("not base64"));
  EXPECT_THAT(loaded->bad[3].second, HasSubstr("empty reference"));
}

TEST(ImageRefsTest, AListLoadsEachAndOneBadReferenceMakesItsRowNull) {
  testing::ScopedTempDir dir("braid-refs");
  std::ofstream(dir.Sub("a.jpg"), std::ios::binary) << "A";
  std::ofstream(dir.Sub("b.jpg"), std::ios::binary) << "BB";
  arrow::fs::LocalFileSystem fs;
  auto values = std::make_shared<arrow::StringBuilder>();
  arrow::ListBuilder lists(arrow::default_memory_pool(), values);
  ASSERT_TRUE(lists.Append().ok());  // [a, b]
  ASSERT_TRUE(values->AppendValues({"a.jpg", "b.jpg"}).ok());
  ASSERT_TRUE(lists.Append().ok());  // [a, missing]
  ASSERT_TRUE(values->AppendValues({"a.jpg", "gone.jpg"}).ok());
  ASSERT_TRUE(lists.Append().ok());  // []
  ASSERT_TRUE(lists.AppendNull().ok());
  auto refs = lists.Finish().ValueOrDie();
  // A slice, as a block of a file's records is.
  auto loaded = LoadImageRefs(&fs, dir.path().string(), *refs->Slice(0, 4));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_EQ(loaded->bytes->type()->ToString(), "list<item: binary>");
  const auto& got = static_cast<const arrow::ListArray&>(*loaded->bytes);
  const auto& items = static_cast<const arrow::BinaryArray&>(*got.values());
  ASSERT_EQ(got.value_length(0), 2);
  EXPECT_EQ(items.GetString(got.value_offset(0)), "A");
  EXPECT_EQ(items.GetString(got.value_offset(0) + 1), "BB");
  EXPECT_TRUE(got.IsNull(1));
  EXPECT_EQ(got.value_length(2), 0);
  EXPECT_TRUE(got.IsNull(3));
  ASSERT_EQ(loaded->bad.size(), 1u);
  EXPECT_EQ(loaded->bad[0].first, 1);
  EXPECT_THAT(loaded->bad[0].second, HasSubstr("'gone.jpg'"));
}

}  // namespace
}  // namespace braid::internal
