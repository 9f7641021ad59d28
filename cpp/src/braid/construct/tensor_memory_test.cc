#include "braid/construct/tensor_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

#include "braid/construct/constructor.h"

namespace braid {
namespace {

// What another process sees: the file mapped anew at the tensor's offset.
std::vector<uint8_t> ReadThroughFile(const Bytes& bytes) {
  void* p = mmap(nullptr, bytes.size(), PROT_READ, MAP_SHARED, bytes.fd(), bytes.offset());
  EXPECT_NE(p, MAP_FAILED);
  if (p == MAP_FAILED) return {};
  std::vector<uint8_t> out(static_cast<uint8_t*>(p), static_cast<uint8_t*>(p) + bytes.size());
  munmap(p, bytes.size());
  return out;
}

TEST(TensorMemoryTest, RegionsAreZeroedPageAlignedAndSharedThroughTheFile) {
  auto file = TensorFile::Make();
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto a = (*file)->Allocate(10);
  auto b = (*file)->Allocate(70000);
  ASSERT_TRUE(a.ok() && b.ok());
  const int64_t page = sysconf(_SC_PAGESIZE);
  EXPECT_EQ((*a)->fd(), (*file)->fd());
  EXPECT_EQ((*a)->offset(), 0);
  EXPECT_EQ((*b)->offset(), page);  // the next page after a's 10 bytes
  EXPECT_EQ((*b)->size(), 70000u);
  for (size_t i = 0; i < (*b)->size(); ++i) ASSERT_EQ((*b)->data()[i], 0) << i;
  std::memset((*a)->data(), 7, 10);
  (*b)->data()[69999] = 9;
  EXPECT_EQ(ReadThroughFile(**a), std::vector<uint8_t>(10, 7));
  EXPECT_EQ(ReadThroughFile(**b).back(), 9);
  // The tensors keep the file: dropping its handle changes nothing.
  const int fd = (*b)->fd();
  file = Status::Cancelled("dropped");
  EXPECT_EQ((*b)->fd(), fd);
  EXPECT_EQ(ReadThroughFile(**b).back(), 9);
  EXPECT_EQ(ReadThroughFile(**a), std::vector<uint8_t>(10, 7));
}

TEST(TensorMemoryTest, ABuildInAFileEqualsTheHeapBuildAndLiesInTheFile) {
  auto payload = MakeTokenPayload({5, 6, 7, 8, 9});
  Sequence seq;
  DocPiece d;
  d.source = 1;
  d.start = 0;
  d.len = 5;
  d.doc_tokens = 5;
  d.payload = payload;
  seq.docs = {d};
  seq.tokens = 5;
  StepPlan plan;
  plan.step = 3;
  plan.seq_len = 8;
  plan.buckets.resize(1);
  plan.buckets[0].micro_batches.resize(1);
  plan.buckets[0].micro_batches[0].sequences = {seq, seq};
  auto file = TensorFile::Make();
  ASSERT_TRUE(file.ok());
  auto heap = BuildMicroBatch(plan, 0, 0);
  auto shared = BuildMicroBatch(plan, 0, 0, /*pad_to_multiple_of=*/1, file->get());
  ASSERT_TRUE(heap.ok() && shared.ok());
  ASSERT_EQ(heap->tensors.size(), shared->tensors.size());
  for (size_t i = 0; i < heap->tensors.size(); ++i) {
    const Tensor& h = heap->tensors[i];
    const Tensor& s = shared->tensors[i];
    EXPECT_EQ(h.name, s.name);
    EXPECT_EQ(h.shape, s.shape);
    EXPECT_EQ(*h.storage, *s.storage) << h.name;
    EXPECT_EQ(h.storage->fd(), -1) << h.name;
    EXPECT_EQ(s.storage->fd(), (*file)->fd()) << s.name;
    EXPECT_EQ(ReadThroughFile(*s.storage),
              std::vector<uint8_t>(h.storage->data(), h.storage->data() + h.storage->size()))
        << s.name;
  }
}

TEST(TensorMemoryTest, NoFileMeansTheHeap) {
  EXPECT_EQ(MaybeTensorFile(false), nullptr);
  auto file = MaybeTensorFile(true);
  ASSERT_NE(file, nullptr);
  Tensor on_heap = ZerosIn(nullptr, "x", DType::kInt32, {3});
  Tensor in_file = ZerosIn(file.get(), "x", DType::kInt32, {3});
  EXPECT_EQ(on_heap.storage->fd(), -1);
  EXPECT_EQ(in_file.storage->fd(), file->fd());
  EXPECT_EQ(*on_heap.storage, *in_file.storage);
}

}  // namespace
}  // namespace braid
