// The builds a node's peers share: a file written by one is what another finds for the
// same plan, and only for it; a damaged file is a miss; a (step, bucket) is claimed by
// one peer at a time.
#include "braid/transport/node_builds.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>

#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

StepPlan PlanWith(int64_t step, int64_t row) {
  StepPlan plan;
  plan.step = step;
  plan.buckets.resize(2);
  MicroBatch mb;
  Sequence seq;
  DocPiece piece;
  piece.row = row;
  piece.len = 4;
  piece.doc_tokens = 4;
  seq.docs.push_back(piece);
  mb.sequences.push_back(seq);
  plan.buckets[1].micro_batches.push_back(mb);
  return plan;
}

std::shared_ptr<const Batch> BatchOf(int64_t step, int64_t first) {
  Batch b;
  b.step = step;
  b.dp = 1;
  Tensor ids = Tensor::Zeros("input_ids", DType::kInt64, {1, 5});
  for (int64_t i = 0; i < 5; ++i) ids.data<int64_t>()[i] = first + i;
  b.tensors.push_back(ids);
  Tensor pixels = Tensor::Zeros("pixel_values", DType::kFloat32, {3, 7});
  pixels.data<float>()[20] = 0.5f;
  b.tensors.push_back(pixels);
  return std::make_shared<const Batch>(std::move(b));
}

TEST(NodeBuildsTest, APeersBuildIsFoundForTheSamePlanOnly) {
  testing::ScopedTempDir dir("braid-node-builds");
  auto writer = NodeBuilds::Make(dir.Sub("builds"), /*keep_steps=*/2);
  auto reader = NodeBuilds::Make(dir.Sub("builds"), 2);
  ASSERT_TRUE(writer.ok() && reader.ok());
  const StepPlan plan = PlanWith(3, 10);
  EXPECT_FALSE((*reader)->Find(plan, 1).has_value());
  (*writer)->Put(plan, 1, {BatchOf(3, 100), BatchOf(3, 200)});
  auto found = (*reader)->Find(plan, 1);
  ASSERT_TRUE(found.has_value());
  ASSERT_EQ(found->size(), 2u);
  const Batch& second = *(*found)[1];
  EXPECT_EQ(second.step, 3);
  EXPECT_EQ(second.dp, 1);
  ASSERT_EQ(second.tensors.size(), 2u);
  EXPECT_EQ(second.tensors[0].name, "input_ids");
  EXPECT_EQ(second.tensors[0].shape, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(*second.tensors[0].storage, *BatchOf(3, 200)->tensors[0].storage);
  EXPECT_EQ(second.tensors[1].dtype, DType::kFloat32);
  EXPECT_EQ(second.tensors[1].data<float>()[20], 0.5f);
  // Mapped copy-on-write: a trainer that writes to its array changes no one else's.
  const_cast<int64_t*>(second.tensors[0].data<int64_t>())[0] = -1;
  EXPECT_EQ((*(*reader)->Find(plan, 1))[1]->tensors[0].data<int64_t>()[0], 200);
  // Another plan of the same step and bucket (another run, another row): not taken.
  EXPECT_FALSE((*reader)->Find(PlanWith(3, 11), 1).has_value());
  EXPECT_FALSE((*reader)->Find(plan, 0).has_value());
  // A damaged file is a miss.
  const std::string file = dir.Sub("builds/s3-b1.build");
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 100);
  EXPECT_FALSE((*reader)->Find(plan, 1).has_value());
  // The writer removes its builds keep_steps behind the newest, and the rest when it
  // goes.
  (*writer)->Put(PlanWith(6, 1), 1, {BatchOf(6, 0)});
  EXPECT_FALSE(std::filesystem::exists(file));
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("builds/s6-b1.build")));
  writer->reset();
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("builds/s6-b1.build")));
}

TEST(NodeBuildsTest, OnePeerAtATimeClaimsAStep) {
  testing::ScopedTempDir dir("braid-node-builds");
  auto builds = NodeBuilds::Make(dir.Sub("builds"), 2);
  ASSERT_TRUE(builds.ok());
  const StepPlan plan = PlanWith(1, 0);
  std::atomic<bool> stop{false};
  auto stopped = [&] { return stop.load(); };
  auto held = (*builds)->Claim(plan, 1, stopped);
  ASSERT_NE(held, nullptr);
  auto waiter = std::async(std::launch::async, [&] {
    return (*builds)->Claim(plan, 1, stopped);
  });
  EXPECT_EQ(waiter.wait_for(std::chrono::milliseconds(150)), std::future_status::timeout);
  held.reset();
  EXPECT_NE(waiter.get(), nullptr);
  held = (*builds)->Claim(plan, 1, stopped);
  stop = true;  // a peer that stops waits no more
  EXPECT_EQ((*builds)->Claim(plan, 1, stopped), nullptr);
}

}  // namespace
}  // namespace braid
