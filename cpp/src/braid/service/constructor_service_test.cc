// The constructor service without a runtime: its views are the embedded runtime's
// micro-batches bit for bit, each (step, bucket) is built once however many ranks ask
// at once, a slow or unreachable source host is hedged to its standby, a failed build is
// built again when asked again, and the window stays bounded.
#include "braid/service/constructor_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>

#include "braid/plan/planner.h"
#include "braid/runtime/engine.h"
#include "braid/service/planner_service.h"
#include "braid/service/source_service.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"
#include "braid/transport/in_process.h"

namespace braid {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Pieces from the SourceServices of this process, each (host, replica) answering after
// its delay or with its error: a source host that is slow, restarting or gone.
class ScriptedPieces : public PieceSource {
 public:
  explicit ScriptedPieces(const SourceSet* sources) : sources_(sources) {}

  struct Behaviour {
    double delay_s = 0;
    Status error;   // returned instead of the replies
    int failures = -1;  // how many calls fail with `error` (-1: every one)
  };
  void Set(int32_t host, int32_t replica, Behaviour b) {
    std::lock_guard<std::mutex> lock(mu_);
    behaviour_[{host, replica}] = b;
  }
  int64_t calls(int32_t replica) const {
    std::lock_guard<std::mutex> lock(mu_);
    return replica == 0 ? primary_calls_ : standby_calls_;
  }

  Result<int64_t> Send(int32_t host, int32_t replica,
                       const SourceRequests& requests) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++(replica == 0 ? primary_calls_ : standby_calls_);
    Behaviour& b = behaviour_[{host, replica}];
    Call call{Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(b.delay_s)),
              requests, Status::OK()};
    if (!b.error.ok() && b.failures != 0) {
      call.error = b.error;
      if (b.failures > 0) --b.failures;
    }
    const int64_t id = next_++;
    pending_.emplace(id, std::move(call));
    return id;
  }

  std::optional<PieceCall> WaitAny(const std::vector<int64_t>& calls,
                                   double timeout_s) override {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
    int64_t first = -1;
    Clock::time_point ready = Clock::time_point::max();
    Call call;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int64_t id : calls) {
        auto it = pending_.find(id);
        if (it != pending_.end() && it->second.ready < ready) {
          first = id;
          ready = it->second.ready;
        }
      }
      if (first < 0) return std::nullopt;
      if (ready > deadline) {
        std::this_thread::sleep_until(deadline);
        return std::nullopt;
      }
      call = std::move(pending_[first]);
      pending_.erase(first);
    }
    std::this_thread::sleep_until(ready);
    PieceCall out;
    out.id = first;
    out.status = call.error;
    if (!out.status.ok()) return out;
    for (const auto& [source, reqs] : call.requests) {
      auto reply = sources_->find(source)->Fetch(reqs.data(),
                                                 int64_t(reqs.size()) / kRequestFields);
      if (!reply.ok()) {
        out.status = reply.status();
        return out;
      }
      out.replies.push_back(std::make_shared<const PieceReply>(std::move(*reply)));
    }
    return out;
  }

  void Forget(const std::vector<int64_t>& calls) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t id : calls) pending_.erase(id);
  }

 private:
  struct Call {
    Clock::time_point ready;
    SourceRequests requests;
    Status error;
  };
  const SourceSet* sources_;
  mutable std::mutex mu_;
  std::map<std::pair<int32_t, int32_t>, Behaviour> behaviour_;
  std::map<int64_t, Call> pending_;
  int64_t next_ = 0;
  int64_t primary_calls_ = 0, standby_calls_ = 0;
};

class ConstructorServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::ScopedTempDir("braid-constructor-service");
    auto demo = testing::MakeDemoDataset(dir_->path().string(), /*seed=*/6,
                                         /*seq_len=*/256, /*dp=*/2,
                                         /*micro_batches=*/2, /*scale=*/0.03);
    ASSERT_TRUE(demo.ok()) << demo.status().ToString();
    auto config = LoadConfigFile(demo->config_path);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = new Config(*config);
    // The embedded runtime's micro-batches, (step, bucket, micro-batch) order.
    auto engine = Engine::Make(*config_, {});
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    embedded_ = new std::vector<std::shared_ptr<const Batch>>();
    const int64_t per_step = config_->MicroBatchesPerRankAt(0) * config_->topology.buckets();
    for (int64_t i = 0; i < kSteps * per_step; ++i) {
      auto b = (*engine)->Next();
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      embedded_->push_back(*b);
    }
  }
  static void TearDownTestSuite() {
    delete embedded_;
    delete config_;
    delete dir_;
  }

  void SetUp() override {
    PlannerService::Options planning;  // as across processes: wire messages only
    planning.background = true;
    planning.encode = true;
    planning.keep_plan = false;
    planning.state.keep_steps = 8;
    auto planner = PlannerService::Make(*config_, Planner::InitialState(*config_),
                                        PlannerService::MetadataOnly(*config_),
                                        std::move(planning));
    ASSERT_TRUE(planner.ok()) << planner.status().ToString();
    planner_ = std::move(*planner);
    auto sources = SourceSet::Open(*config_, Planner::InitialState(*config_),
                                   SourceService::Stream::kNone, /*serve=*/true);
    ASSERT_TRUE(sources.ok()) << sources.status().ToString();
    sources_ = std::move(*sources);
    pieces_ = std::make_shared<ScriptedPieces>(sources_.get());
  }

  std::unique_ptr<ConstructorService> Make(ConstructorService::Options options) {
    options.host_of_source.assign(config_->sources.size(), 0);  // one source host
    auto service = ConstructorService::Make(
        *config_, std::move(options), std::make_shared<InProcessPlans>(planner_.get(), 60),
        pieces_);
    EXPECT_TRUE(service.ok()) << service.status().ToString();
    return service.ok() ? std::move(*service) : nullptr;
  }

  // The embedded runtime's micro-batch at (step, bucket, micro-batch).
  static const Batch& Embedded(int64_t step, int64_t bucket, int64_t mb) {
    const int64_t per_bucket = config_->MicroBatchesPerRankAt(0);
    const int64_t per_step = per_bucket * config_->topology.buckets();
    return *(*embedded_)[size_t(step * per_step + bucket * per_bucket + mb)];
  }

  static void ExpectSame(const Batch& got, const Batch& want) {
    ASSERT_EQ(got.tensors.size(), want.tensors.size());
    for (size_t t = 0; t < got.tensors.size(); ++t) {
      EXPECT_EQ(got.tensors[t].name, want.tensors[t].name);
      EXPECT_EQ(got.tensors[t].shape, want.tensors[t].shape);
      EXPECT_EQ(*got.tensors[t].storage, *want.tensors[t].storage)
          << got.tensors[t].name << " of step " << want.step << " bucket " << want.dp;
    }
  }

  static constexpr int64_t kSteps = 6;
  static testing::ScopedTempDir* dir_;
  static Config* config_;
  static std::vector<std::shared_ptr<const Batch>>* embedded_;
  std::unique_ptr<PlannerService> planner_;
  std::unique_ptr<SourceSet> sources_;
  std::shared_ptr<ScriptedPieces> pieces_;
};

testing::ScopedTempDir* ConstructorServiceTest::dir_ = nullptr;
Config* ConstructorServiceTest::config_ = nullptr;
std::vector<std::shared_ptr<const Batch>>* ConstructorServiceTest::embedded_ = nullptr;

TEST_F(ConstructorServiceTest, ManyRanksAtOnceGetTheEmbeddedBatchesFromOneBuildEach) {
  ConstructorService::Options options;
  options.build_threads = 4;
  options.keep_steps = kSteps;  // nothing is dropped: every build is counted once
  auto service = Make(options);
  ASSERT_NE(service, nullptr);
  const int64_t buckets = config_->topology.buckets();
  const int64_t per_bucket = config_->MicroBatchesPerRankAt(0);
  // Four "TP peers" per bucket ask for every micro-batch at once, in order.
  std::vector<std::thread> ranks;
  std::atomic<int64_t> failures{0};
  std::vector<std::vector<std::shared_ptr<const DeliveredView>>> got(size_t(4 * buckets));
  for (int64_t r = 0; r < 4 * buckets; ++r) {
    ranks.emplace_back([&, r] {
      for (int64_t s = 0; s < kSteps; ++s) {
        for (int64_t mb = 0; mb < per_bucket; ++mb) {
          auto view = service->View(ViewKey{s, r % buckets, mb, 0, 0, true, true});
          if (!view.ok()) {
            ++failures;
            return;
          }
          got[size_t(r)].push_back(*view);
        }
      }
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_EQ(failures.load(), 0);
  for (int64_t r = 0; r < 4 * buckets; ++r) {
    for (int64_t k = 0; k < kSteps * per_bucket; ++k) {
      const auto& view = got[size_t(r)][size_t(k)];
      ExpectSame(view->batch(), Embedded(k / per_bucket, r % buckets, k % per_bucket));
      // The peers of a bucket share the one view made of it.
      EXPECT_EQ(view.get(), got[size_t(r % buckets)][size_t(k)].get());
    }
  }
  const auto figures = service->figures();
  // Each (step, bucket) once, plus the builds ahead of the newest step asked for.
  EXPECT_GE(figures.built_buckets, kSteps * buckets);
  EXPECT_LE(figures.built_buckets, (kSteps + options.steps_in_flight) * buckets);
  EXPECT_EQ(figures.rebuilt_buckets, 0);
  EXPECT_EQ(figures.standby_requests, 0);
}

TEST_F(ConstructorServiceTest, ASlowHostIsHedgedToItsStandbyWithTheSameBytes) {
  ConstructorService::Options options;
  options.standby = true;
  options.steps_in_flight = 0;
  auto service = Make(options);
  ASSERT_NE(service, nullptr);
  pieces_->Set(0, 0, {.delay_s = 30, .error = Status::OK(), .failures = 0});  // no answer in time
  const auto view = service->View(ViewKey{0, 1, 0, 0, 0, true, true});
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  ExpectSame((*view)->batch(), Embedded(0, 1, 0));
  EXPECT_EQ(service->figures().standby_requests, 1);
  EXPECT_EQ(pieces_->calls(1), 1);
}

TEST_F(ConstructorServiceTest, AnUnreachableHostIsReplacedByItsStandby) {
  ConstructorService::Options options;  // no hedging: only a host that cannot be reached
  options.steps_in_flight = 0;
  auto service = Make(options);
  ASSERT_NE(service, nullptr);
  pieces_->Set(0, 0, {.delay_s = 0,
                      .error = UnavailableError("source host 0", "its node is gone"),
                      .failures = -1});
  for (int64_t s = 0; s < 2; ++s) {
    const auto view = service->View(ViewKey{s, 0, 1, 0, 0, true, true});
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    ExpectSame((*view)->batch(), Embedded(s, 0, 1));
  }
  EXPECT_EQ(pieces_->calls(1), 2);
}

TEST_F(ConstructorServiceTest, AFailedBuildFailsItsViewsAndIsBuiltAgainWhenAsked) {
  ConstructorService::Options options;
  options.steps_in_flight = 0;
  auto service = Make(options);
  ASSERT_NE(service, nullptr);
  pieces_->Set(0, 0, {.delay_s = 0,
                      .error = DataError("web.parquet (row group 0, row 3)", "bad row"),
                      .failures = 1});
  const ViewKey key{0, 0, 0, 0, 0, true, true};
  auto failed = service->View(key);
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("row 3"));
  EXPECT_EQ(pieces_->calls(1), 0);  // the data is bad: no standby would answer better
  auto again = service->View(key);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ExpectSame((*again)->batch(), Embedded(0, 0, 0));
}

TEST_F(ConstructorServiceTest, TheWindowKeepsFewStepsAndRebuildsAnOldOneTheSame) {
  ConstructorService::Options options;
  options.keep_steps = 1;
  options.steps_in_flight = 1;
  auto service = Make(options);
  ASSERT_NE(service, nullptr);
  const int64_t buckets = config_->topology.buckets();
  for (int64_t s = 0; s < kSteps; ++s) {
    for (int64_t b = 0; b < buckets; ++b) {
      ASSERT_TRUE(service->View(ViewKey{s, b, 0, 0, 0, true, true}).ok());
    }
    // The newest step, the one before it and the one ahead, per bucket.
    EXPECT_LE(service->figures().held_builds, 3 * buckets) << "step " << s;
  }
  const int64_t built = service->figures().built_buckets;
  EXPECT_EQ(service->figures().rebuilt_buckets, 0);
  auto old = service->View(ViewKey{1, 1, 1, 0, 0, true, true});
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  ExpectSame((*old)->batch(), Embedded(1, 1, 1));
  // Built again, and the step in flight after it (perhaps not yet): each a rebuild.
  EXPECT_GT(service->figures().built_buckets, built);
  EXPECT_GE(service->figures().rebuilt_buckets, 1);
  EXPECT_LE(service->figures().rebuilt_buckets, 2);
  EXPECT_FALSE(service->View(ViewKey{0, buckets, 0, 0, 0, true, true}).ok());
  EXPECT_FALSE(service->View(ViewKey{0, 0, 99, 0, 0, true, true}).ok());
}

TEST_F(ConstructorServiceTest, ABuildGoesOnceEveryRankOfItsBucketWasServedAll) {
  // Two ranks per bucket (TP peers); the window alone would keep 8 steps.
  ConstructorService::Options options;
  options.keep_steps = 8;
  options.steps_in_flight = 0;
  const int64_t buckets = config_->topology.buckets();
  options.receivers.assign(size_t(buckets), 2);
  auto service = Make(options);
  ASSERT_NE(service, nullptr);
  const int64_t mbs = config_->MicroBatchesPerRankAt(0);
  for (int64_t b = 0; b < buckets; ++b) {
    for (int64_t mb = 0; mb < mbs; ++mb) {
      auto view = service->View(ViewKey{0, b, mb, 0, 0, true, true});
      ASSERT_TRUE(view.ok()) << view.status().ToString();
      ExpectSame((*view)->batch(), Embedded(0, b, mb));
    }
  }
  // One rank of each bucket has all of step 0: every build is still held.
  EXPECT_EQ(service->figures().held_builds, buckets);
  EXPECT_EQ(service->figures().held_views, buckets * mbs);
  for (int64_t mb = 0; mb + 1 < mbs; ++mb) {
    ASSERT_TRUE(service->View(ViewKey{0, 0, mb, 0, 0, true, true}).ok());
  }
  EXPECT_EQ(service->figures().held_builds, buckets);  // bucket 0's last one is unserved
  ASSERT_TRUE(service->View(ViewKey{0, 0, mbs - 1, 0, 0, true, true}).ok());
  EXPECT_EQ(service->figures().held_builds, buckets - 1);  // bucket 0's build went
  EXPECT_EQ(service->figures().held_views, (buckets - 1) * mbs);
  // A rank that asks again gets the same bytes, built again.
  const int64_t built = service->figures().built_buckets;
  auto again = service->View(ViewKey{0, 0, 1 % mbs, 0, 0, true, true});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ExpectSame((*again)->batch(), Embedded(0, 0, 1 % mbs));
  EXPECT_EQ(service->figures().built_buckets, built + 1);
  EXPECT_EQ(service->figures().rebuilt_buckets, 1);
}

TEST_F(ConstructorServiceTest, ABuildDroppedFromTheWindowBeforeItRanIsStillAnswered) {
  // Regression: a rank far ahead dropped a queued build from the window; a rank behind
  // that then asked for it got a broken promise instead of the build.
  ConstructorService::Options options;
  options.keep_steps = 0;
  options.steps_in_flight = 3;
  options.build_threads = 1;
  auto service = Make(options);
  ASSERT_NE(service, nullptr);
  pieces_->Set(0, 0, {.delay_s = 0.3, .error = Status::OK(), .failures = 0});
  // Step 0 builds (0.3 s) with steps 1-3 queued behind it; meanwhile a rank asks for
  // the last step (dropping steps before it from the window), then one for step 2.
  std::thread first([&] {
    EXPECT_TRUE(service->View(ViewKey{0, 0, 0, 0, 0, true, true}).ok());
  });
  std::thread ahead([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    EXPECT_TRUE(service->View(ViewKey{kSteps - 1, 0, 0, 0, 0, true, true}).ok());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const auto behind = service->View(ViewKey{2, 0, 1, 0, 0, true, true});
  first.join();
  ahead.join();
  ASSERT_TRUE(behind.ok()) << behind.status().ToString();
  ExpectSame((*behind)->batch(), Embedded(2, 0, 1));
}

}  // namespace
}  // namespace braid
