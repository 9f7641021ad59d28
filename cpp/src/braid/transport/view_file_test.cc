#include "braid/transport/view_file.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cstring>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "braid/construct/tensor_memory.h"

namespace braid {
namespace {

// The bytes of `fd` as a reader maps them.
std::vector<uint8_t> FileBytes(int fd) {
  struct stat st;
  EXPECT_EQ(fstat(fd, &st), 0);
  std::vector<uint8_t> out(size_t(st.st_size));
  if (out.empty()) return out;
  void* p = mmap(nullptr, out.size(), PROT_READ, MAP_PRIVATE, fd, 0);
  EXPECT_NE(p, MAP_FAILED);
  std::memcpy(out.data(), p, out.size());
  munmap(p, out.size());
  return out;
}

Tensor Filled(TensorFile* file, const std::string& name, DType dtype,
              std::vector<int64_t> shape, uint8_t seed) {
  Tensor t = ZerosIn(file, name, dtype, std::move(shape));
  for (size_t i = 0; i < t.storage->size(); ++i) t.storage->data()[i] = uint8_t(seed + i);
  return t;
}

TEST(ViewFileTest, AReaderFindsEveryTensorWhereTheHeaderSays) {
  auto first = TensorFile::Make(), second = TensorFile::Make();
  ASSERT_TRUE(first.ok() && second.ok());
  auto batch = std::make_shared<Batch>();
  batch->tensors.push_back(Filled(first->get(), "input_ids", DType::kInt64, {2, 3}, 1));
  batch->tensors.push_back(Filled(nullptr, "cu_seqlens", DType::kInt32, {5}, 50));
  batch->tensors.push_back(Filled(second->get(), "pixel_values", DType::kFloat32, {4, 6}, 90));
  batch->tensors.push_back(Filled(first->get(), "labels", DType::kInt64, {2, 3}, 7));
  batch->tensors.push_back(Filled(nullptr, "image_grid", DType::kInt32, {0, 2}, 0));
  auto made = ViewFile::Write(batch, "{\"before\":1}", "{\"after\":2}");
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const ViewFile& view = **made;
  // Two tensor files, in the order their tensors come; the heap tensors copied.
  ASSERT_EQ(view.files().size(), 2u);
  EXPECT_EQ(view.files()[0], (*first)->fd());
  EXPECT_EQ(view.files()[1], (*second)->fd());
  const std::vector<uint8_t> head = FileBytes(view.header_fd());
  ASSERT_EQ(int64_t(head.size()), view.header_size());
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t(head[size_t(i)]) << (8 * i);
  const auto header =
      nlohmann::json::parse(head.begin() + 8, head.begin() + 8 + int64_t(length));
  EXPECT_EQ(header["before"], "{\"before\":1}");
  EXPECT_EQ(header["after"], "{\"after\":2}");
  const int64_t base = (8 + int64_t(length) + 63) / 64 * 64;
  const std::vector<std::vector<uint8_t>> files = {head, FileBytes(view.files()[0]),
                                                   FileBytes(view.files()[1])};
  const std::vector<std::string> dtypes = {"<i8", "<i4", "<f4", "<i8", "<i4"};
  const std::vector<int64_t> file_of = {1, 0, 2, 1, 0};
  ASSERT_EQ(header["arrays"].size(), batch->tensors.size());
  for (size_t i = 0; i < batch->tensors.size(); ++i) {
    const Tensor& t = batch->tensors[i];
    const auto& a = header["arrays"][i];
    EXPECT_EQ(a[0], t.name);
    EXPECT_EQ(a[1], dtypes[i]) << t.name;
    EXPECT_EQ(a[2].get<std::vector<int64_t>>(), t.shape) << t.name;
    EXPECT_EQ(a[3].get<int64_t>(), file_of[i]) << t.name;
    const int64_t file = a[3], nbytes = a[5];
    const int64_t at = a[4].get<int64_t>() + (file == 0 ? base : 0);
    ASSERT_EQ(nbytes, int64_t(t.storage->size())) << t.name;
    ASSERT_LE(at + nbytes, int64_t(files[size_t(file)].size())) << t.name;
    EXPECT_EQ(std::vector<uint8_t>(files[size_t(file)].begin() + at,
                                   files[size_t(file)].begin() + at + nbytes),
              std::vector<uint8_t>(t.storage->data(), t.storage->data() + nbytes))
        << t.name;
  }
}

}  // namespace
}  // namespace braid
