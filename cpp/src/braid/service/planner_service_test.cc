// The planner service's state machine without a runtime: steps planned again from a
// checkpoint are the steps handed out before, a restarted service resumes from its
// journal, the journal holds what it says, and waits end cleanly.
#include "braid/service/planner_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <thread>

#include "braid/plan/planner.h"
#include "braid/service/planner_service_state.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::HasSubstr;

constexpr double kForever = std::numeric_limits<double>::infinity();

class PlannerServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::ScopedTempDir("braid-planner-service");
    auto demo = testing::MakeDemoDataset(dir_->path().string(), /*seed=*/8,
                                         /*seq_len=*/256, /*dp=*/2,
                                         /*micro_batches=*/2, /*scale=*/0.03);
    ASSERT_TRUE(demo.ok()) << demo.status().ToString();
    auto config = LoadConfigFile(demo->config_path);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = new Config(*config);
  }
  static void TearDownTestSuite() {
    delete config_;
    delete dir_;
  }

  // A service as the Ray runtime's planner runs it (wire messages, a thread of its own),
  // checkpointing every 4th step and committing the newest 2, its journals in `journals`.
  static std::unique_ptr<PlannerService> Shared(std::vector<std::string>* journals,
                                                const std::string& journal = "",
                                                int64_t keep_steps = 4) {
    PlannerService::Options options;
    options.background = true;
    options.encode = true;
    options.keep_plan = false;
    options.state.plan_ahead = 2;
    options.state.keep_steps = keep_steps;
    options.state.checkpoint_every = 4;
    options.state.committed = 2;
    if (journals != nullptr) {
      options.commit = [journals](const std::string& j) { journals->push_back(j); };
    }
    auto service = PlannerService::Make(*config_, Planner::InitialState(*config_),
                                        PlannerService::MetadataOnly(*config_),
                                        std::move(options), journal);
    EXPECT_TRUE(service.ok()) << service.status().ToString();
    return service.ok() ? std::move(*service) : nullptr;
  }

  static std::vector<int64_t> Message(PlannerService* service, int64_t step) {
    auto planned = service->Plan(step, /*timeout_s=*/60);
    EXPECT_TRUE(planned.ok()) << planned.status().ToString();
    return planned.ok() ? (*planned)->encoded : std::vector<int64_t>{};
  }

  static testing::ScopedTempDir* dir_;
  static Config* config_;
};

testing::ScopedTempDir* PlannerServiceTest::dir_ = nullptr;
Config* PlannerServiceTest::config_ = nullptr;

TEST_F(PlannerServiceTest, AStepNoLongerHeldIsPlannedAgainAsBefore) {
  auto service = Shared(nullptr, "", /*keep_steps=*/1);
  ASSERT_NE(service, nullptr);
  std::vector<std::vector<int64_t>> first;
  for (int64_t s = 0; s < 12; ++s) first.push_back(Message(service.get(), s));
  EXPECT_EQ(service->figures().replayed_steps, 0);
  // Steps 2, 5 and 9 were dropped (one step kept behind step 11): planned again from
  // the checkpoints of steps 0, 4 and 8.
  for (int64_t s : {9, 2, 5}) EXPECT_EQ(Message(service.get(), s), first[size_t(s)]);
  EXPECT_EQ(service->figures().replayed_steps, 3);
}

TEST_F(PlannerServiceTest, ARestartedServiceResumesFromItsJournal) {
  std::vector<std::string> journals;
  std::vector<std::vector<int64_t>> first;
  {
    auto service = Shared(&journals);
    ASSERT_NE(service, nullptr);
    EXPECT_EQ(service->Attach("rank-0").ValueOrDie(), 1);
    EXPECT_EQ(service->Attach("rank-1").ValueOrDie(), 2);
    for (int64_t s = 0; s < 14; ++s) first.push_back(Message(service.get(), s));
  }
  ASSERT_FALSE(journals.empty());
  // The newest journal: the start, steps 8 and 12 (the newest two), both ranks.
  auto restarted = Shared(nullptr, journals.back());
  ASSERT_NE(restarted, nullptr);
  EXPECT_EQ(restarted->figures().restored_from, 12);
  EXPECT_EQ(restarted->figures().clients, 2);
  for (int64_t s : {12, 13}) EXPECT_EQ(Message(restarted.get(), s), first[size_t(s)]);
  EXPECT_EQ(restarted->figures().replayed_steps, 0);
  // Steps before the restore are planned again from the nearest committed checkpoint.
  for (int64_t s : {9, 3}) EXPECT_EQ(Message(restarted.get(), s), first[size_t(s)]);
  EXPECT_EQ(restarted->figures().replayed_steps, 2);
  // The last rank to detach ends the job: its journal is empty, to be dropped.
  EXPECT_EQ(restarted->Detach("rank-0"), 1);
  EXPECT_EQ(restarted->Detach("rank-1"), 0);
  // An ended job takes no more ranks (its roles are being stopped): a rank that arrives
  // now is told so and starts a new job.
  auto late = restarted->Attach("rank-2");
  ASSERT_FALSE(late.ok());
  EXPECT_TRUE(IsErrorKind(late.status(), ErrorKind::kUnavailable));
  EXPECT_THAT(late.status().message(), HasSubstr("job ended"));
  EXPECT_EQ(restarted->figures().clients, 0);
}

TEST_F(PlannerServiceTest, AJournalOfAnotherConfigIsRefused) {
  std::vector<std::string> journals;
  {
    auto service = Shared(&journals);
    ASSERT_NE(service, nullptr);
    ASSERT_TRUE(service->Attach("rank-0").ok());
  }
  Config other = *config_;
  other.seed += 1;
  auto service = PlannerService::Make(other, Planner::InitialState(other),
                                      PlannerService::MetadataOnly(other), {},
                                      journals.back());
  ASSERT_FALSE(service.ok());
  EXPECT_THAT(service.status().message(), HasSubstr("state.fingerprint"));
  auto garbage = PlannerService::Make(*config_, Planner::InitialState(*config_),
                                      PlannerService::MetadataOnly(*config_), {}, "[1, 2");
  ASSERT_FALSE(garbage.ok());
  EXPECT_THAT(garbage.status().message(), ::testing::StartsWith("journal:"));
}

TEST_F(PlannerServiceTest, WaitsEndWithAnErrorNotAHang) {
  auto service = Shared(nullptr);
  ASSERT_NE(service, nullptr);
  auto before = service->Plan(-1, 1);
  ASSERT_FALSE(before.ok());
  EXPECT_THAT(before.status().message(), HasSubstr("before the job's first step 0"));
  // A step far ahead: the wait ends when the service stops, not when it is planned.
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    service->Stop();
  });
  const Status st = service->Plan(int64_t{1} << 40, kForever).status();
  stopper.join();
  EXPECT_TRUE(st.IsCancelled()) << st.ToString();
  EXPECT_TRUE(service->Plan(int64_t{1} << 30, kForever).status().IsCancelled());
}

TEST(PlannerServiceStateTest, CheckpointsAreTrimmedAndTheJournalHoldsTheNewest) {
  Config config;
  config.seed = 3;
  config.batch.global_tokens = 64;
  config.batch.seq_len = 32;
  SourceConfig source;
  source.name = "a";
  source.path = "/nowhere";
  config.sources.push_back(source);
  PlannerServiceState::Options options;
  options.checkpoint_every = 2;
  options.max_checkpoints = 3;
  options.committed = 2;
  options.keep_steps = 1;
  options.plan_ahead = 2;
  PlannerServiceState state(config, Planner::InitialState(config), options);
  EXPECT_EQ(state.horizon(), 2);
  int commits = 0;
  for (int64_t s = 0; s < 12; ++s) {
    auto step = std::make_shared<PlannedStep>();
    step->step = s;
    step->state_before = Planner::InitialState(config);
    step->state_before.step = s;
    commits += state.Apply(PlannerServiceState::Asked{s});
    commits += state.Apply(PlannerServiceState::Planned{step});
  }
  EXPECT_EQ(commits, 5);  // steps 2, 4, 6, 8, 10 (step 0 is the start)
  EXPECT_EQ(state.next_step(), 12);
  EXPECT_EQ(state.horizon(), 13);
  EXPECT_EQ(state.held_steps(), 2);  // steps 10 and 11: one behind the newest asked
  EXPECT_EQ(state.Held(9), nullptr);
  EXPECT_NE(state.Held(10), nullptr);
  // The start and the newest three stay: 0, 6, 8, 10.
  EXPECT_EQ(state.CheckpointBefore(5).step, 0);
  EXPECT_EQ(state.CheckpointBefore(7).step, 6);
  EXPECT_EQ(state.CheckpointBefore(11).step, 10);
  // Planned ahead of every consumer: kept, but journaled only once a consumer asks.
  auto ahead = std::make_shared<PlannedStep>();
  ahead->step = 12;
  ahead->state_before = Planner::InitialState(config);
  ahead->state_before.step = 12;
  EXPECT_FALSE(state.Apply(PlannerServiceState::Planned{ahead}));
  EXPECT_EQ(state.CheckpointBefore(12).step, 12);
  {
    PlannerServiceState before_asked(config, Planner::InitialState(config), options);
    ASSERT_TRUE(before_asked.Restore(state.Journal()).ok());
    EXPECT_EQ(before_asked.restored_from(), 10);
  }
  EXPECT_TRUE(state.Apply(PlannerServiceState::Asked{12}));
  EXPECT_FALSE(state.Apply(PlannerServiceState::Asked{13}));
  {
    PlannerServiceState after_asked(config, Planner::InitialState(config), options);
    ASSERT_TRUE(after_asked.Restore(state.Journal()).ok());
    EXPECT_EQ(after_asked.restored_from(), 12);
  }
  EXPECT_FALSE(state.Apply(PlannerServiceState::Asked{14}));
  PlannerServiceState restored(config, Planner::InitialState(config), options);
  ASSERT_TRUE(restored.Restore(state.Journal()).ok());
  EXPECT_EQ(restored.restored_from(), 12);
  EXPECT_EQ(restored.next_step(), 12);
  // The journal commits the start and the newest two: 10 is there, 8 is not.
  EXPECT_EQ(restored.CheckpointBefore(11).step, 10);
  EXPECT_EQ(restored.CheckpointBefore(9).step, 0);
  EXPECT_TRUE(restored.Apply(PlannerServiceState::Attached{"r"}));
  EXPECT_FALSE(restored.Apply(PlannerServiceState::Attached{"r"}));
  EXPECT_NE(restored.Journal(), "");
  EXPECT_TRUE(restored.Apply(PlannerServiceState::Detached{"r"}));
  EXPECT_EQ(restored.Journal(), "");
  EXPECT_TRUE(restored.ended());
  EXPECT_FALSE(restored.Apply(PlannerServiceState::Attached{"late"}));
  EXPECT_EQ(restored.clients(), 0);
}

}  // namespace
}  // namespace braid
