#include "braid/service/constructor_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <thread>

#include "braid/client/topology.h"
#include "braid/construct/constructor.h"
#include "braid/construct/views.h"
#include "braid/service/constructor_service_state.h"
#include "braid/util/log_internal.h"

namespace braid {

namespace {

// Whether the pieces of `bucket` hold their payloads (a plan planned in this process
// from streams that read them), or only their keys (from metadata, or across processes).
bool CarriesPayloads(const StepPlan& plan, int64_t bucket) {
  for (const MicroBatch& mb : plan.buckets[size_t(bucket)].micro_batches) {
    for (const Sequence& seq : mb.sequences) {
      for (const DocPiece& piece : seq.docs) return static_cast<bool>(piece.payload);
    }
  }
  return true;  // no piece: nothing to fetch
}

// The steps built of each bucket, kept as runs of consecutive steps (a job builds a few
// runs, however long it runs), to tell a build of a (step, bucket) built before (for a
// rank further behind than the kept window) from a first one. Thread-compatible.
class BuiltSteps {
 public:
  // Notes (step, bucket) built; false if it was built before.
  bool Add(int64_t step, int64_t bucket) {
    std::map<int64_t, int64_t>& runs = runs_[bucket];  // first step -> last step
    auto after = runs.upper_bound(step);
    const bool joins_next = after != runs.end() && after->first == step + 1;
    if (after != runs.begin()) {
      auto run = std::prev(after);
      if (step <= run->second) return false;
      if (run->second + 1 == step) {
        run->second = joins_next ? after->second : step;
        if (joins_next) runs.erase(after);
        return true;
      }
    }
    int64_t last = step;
    if (joins_next) {
      last = after->second;
      runs.erase(after);
    }
    runs.emplace(step, last);
    return true;
  }

 private:
  std::map<int64_t, std::map<int64_t, int64_t>> runs_;
};

}  // namespace

std::shared_ptr<void> DeliveredView::Attachment(
    const std::function<std::shared_ptr<void>()>& make) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!attachment_) attachment_ = make();
  return attachment_;
}

class ConstructorService::Impl {
 public:
  using StepBucket = ConstructorServiceState::StepBucket;
  using BuildResult = Result<std::shared_ptr<const BucketBuild>>;
  using PlanResult = Result<std::shared_ptr<const PlannedStep>>;

  Impl(const Config& config, Options options, std::shared_ptr<PlanSource> plans,
       std::shared_ptr<PieceSource> pieces)
      : config_(config),
        options_(std::move(options)),
        plans_(std::move(plans)),
        pieces_(std::move(pieces)),
        state_(options_.keep_steps, options_.buckets, options_.receivers) {
    for (int64_t t = 0; t < std::max<int64_t>(options_.build_threads, 1); ++t) {
      threads_.emplace_back([this] { BuildLoop(); });
    }
  }

  ~Impl() {
    Stop();
    for (auto& t : threads_) t.join();
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
  }

  Result<std::shared_ptr<const DeliveredView>> View(const ViewKey& key);
  Figures figures() const;

 private:
  // Queues the build of (step, bucket) unless it is queued or done; returns it.
  ConstructorServiceState::BuildFuture EnsureBuild(int64_t step, int64_t bucket);
  void BuildLoop();
  BuildResult Construct(int64_t step, int64_t bucket);
  // Step `step`'s plan, holding `bucket`: requested once for every bucket known so far
  // that has none, by the first build that needs it; the others wait for that one.
  PlanResult PlanFor(int64_t step, int64_t bucket);
  // The replies of call `call` to `host`, hedged to its standby when options_.standby.
  Result<std::vector<std::shared_ptr<const PieceReply>>> Await(int32_t host, int64_t call,
                                                              const SourceRequests& reqs);
  template <typename T>
  // Waits for `future` up to runtime.timeout_s; `interruptible`: asking
  // Options::interrupt every 100 ms (View's wait, on its caller's thread).
  Result<T> WaitFor(const std::shared_future<Result<T>>& future, const std::string& what,
                    bool interruptible = false);
  void LogBlank(int32_t source, const std::string& why);

  const Config config_;
  const Options options_;
  std::shared_ptr<PlanSource> plans_;
  std::shared_ptr<PieceSource> pieces_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  ConstructorServiceState state_;  // GUARDED_BY(mu_)
  // Builds waiting for a thread, oldest step first, with their promises.
  struct Queued {
    int64_t id = 0;
    std::shared_ptr<std::promise<BuildResult>> promise;
    ConstructorServiceState::BuildFuture build;
  };
  std::map<StepBucket, Queued> queued_;  // GUARDED_BY(mu_)
  int64_t next_id_ = 0;                  // GUARDED_BY(mu_): of builds and plan requests
  bool stopped_ = false;                                                    // GUARDED_BY(mu_)
  int64_t built_ = 0;                                                       // GUARDED_BY(mu_)
  int64_t rebuilt_ = 0;                                                     // GUARDED_BY(mu_)
  int64_t shared_ = 0;                                                      // GUARDED_BY(mu_)
  BuiltSteps built_steps_;                                                  // GUARDED_BY(mu_)
  int64_t plan_bytes_ = 0;                                                  // GUARDED_BY(mu_)
  int64_t standby_requests_ = 0;                                            // GUARDED_BY(mu_)
  std::map<int32_t, int64_t> blanked_;                                      // GUARDED_BY(mu_)
  double usual_answer_s_ = 0.05;  // GUARDED_BY(mu_): a host's usual answer time (average)
  std::vector<std::thread> threads_;
};

template <typename T>
Result<T> ConstructorService::Impl::WaitFor(const std::shared_future<Result<T>>& future,
                                            const std::string& what, bool interruptible) {
  const bool interrupt = interruptible && options_.interrupt != nullptr;
  if (!interrupt && !std::isfinite(options_.timeout_s)) {
    future.wait();  // in process: waits end with the work
    return future.get();
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      std::isfinite(options_.timeout_s)
          ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(options_.timeout_s))
          : Clock::time_point::max();
  while (true) {
    auto until = deadline;  // with an interrupt to ask, slices of 100 ms
    if (interrupt) {
      until = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
    }
    if (future.wait_until(until) == std::future_status::ready) return future.get();
    if (Clock::now() >= deadline) {
      return TimeoutError("constructor", what + ": not ready within " +
                                             std::to_string(options_.timeout_s) +
                                             " s (runtime.timeout_s)");
    }
    ARROW_RETURN_NOT_OK(options_.interrupt());  // set: else the deadline passed
  }
}

ConstructorServiceState::BuildFuture ConstructorService::Impl::EnsureBuild(int64_t step,
                                                                           int64_t bucket) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto held = state_.Build({step, bucket})) return *held;
  const auto queued = queued_.find({step, bucket});
  if (queued != queued_.end()) {  // dropped from the window before it started: kept
    state_.Apply(ConstructorServiceState::BuildQueued{
        {step, bucket}, queued->second.id, queued->second.build});
    return queued->second.build;
  }
  auto promise = std::make_shared<std::promise<BuildResult>>();
  ConstructorServiceState::BuildFuture build = promise->get_future().share();
  const int64_t id = next_id_++;
  state_.Apply(ConstructorServiceState::BuildQueued{{step, bucket}, id, build});
  queued_.emplace(StepBucket{step, bucket}, Queued{id, std::move(promise), build});
  cv_.notify_one();
  return build;
}

void ConstructorService::Impl::BuildLoop() {
  while (true) {
    ConstructorServiceState::Dropped dropped;  // freed without mu_ held
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stopped_ || !queued_.empty(); });
    if (stopped_) {
      for (auto& [key, queued] : queued_) {
        queued.promise->set_value(Status::Cancelled("the constructor service was stopped"));
      }
      queued_.clear();
      return;
    }
    auto node = queued_.extract(queued_.begin());  // the oldest step first
    const StepBucket key = node.key();
    lock.unlock();
    BuildResult built = Construct(key.first, key.second);
    lock.lock();
    if (built.ok()) {
      ++built_;
      if (!built_steps_.Add(key.first, key.second)) ++rebuilt_;
    } else {  // forgotten before its waiters learn of it: a retried request builds again
      dropped = state_.Apply(
          ConstructorServiceState::BuildEnded{key, node.mapped().id, false});
    }
    lock.unlock();
    node.mapped().promise->set_value(std::move(built));
  }
}

ConstructorService::Impl::PlanResult ConstructorService::Impl::PlanFor(int64_t step,
                                                                      int64_t bucket) {
  std::shared_ptr<std::promise<PlanResult>> owner;
  ConstructorServiceState::PlanFuture plan;
  std::vector<int64_t> wanted;
  int64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto held = state_.Plan({step, bucket})) {
      plan = *held;
    } else {
      wanted = state_.BucketsWithoutPlan(step);
      owner = std::make_shared<std::promise<PlanResult>>();
      plan = owner->get_future().share();
      id = next_id_++;
      state_.Apply(ConstructorServiceState::PlansRequested{step, wanted, id, plan});
    }
  }
  if (owner) {
    PlanResult got = plans_->Plan(step, wanted);
    if (got.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      plan_bytes_ += int64_t((*got)->encoded.size() * sizeof(int64_t));
    } else {
      ConstructorServiceState::Dropped dropped;  // a later request asks again
      std::lock_guard<std::mutex> lock(mu_);
      dropped = state_.Apply(ConstructorServiceState::PlansFailed{step, id});
    }
    owner->set_value(std::move(got));
  }
  return WaitFor(plan, "step " + std::to_string(step) + "'s plan");
}

Result<std::vector<std::shared_ptr<const PieceReply>>> ConstructorService::Impl::Await(
    int32_t host, int64_t call, const SourceRequests& reqs) {
  const std::string who = "source host " + std::to_string(host);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto seconds = [](Clock::duration d) {
    return std::chrono::duration<double>(d).count();
  };
  if (!options_.standby) {
    // No hedging; a host that cannot be reached at all (its node is gone) is replaced
    // by its standby, which the transport starts.
    auto done = pieces_->WaitAny({call}, options_.timeout_s);
    if (done && IsErrorKind(done->status, ErrorKind::kUnavailable)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++standby_requests_;
      }
      ARROW_ASSIGN_OR_RAISE(int64_t id, pieces_->Send(host, /*replica=*/1, reqs));
      const double left =
          std::max(0.0, options_.timeout_s - seconds(Clock::now() - start));
      done = pieces_->WaitAny({id}, left);
      if (!done) pieces_->Forget({id});
    }
    if (!done) {
      return TimeoutError(who, "no answer within " + std::to_string(options_.timeout_s) +
                                   " s (runtime.timeout_s)");
    }
    if (!done->status.ok()) return done->status;
    return std::move(done->replies);
  }
  // Hedged: when the host has not answered within four times its usual time (dead,
  // restarting or slow), or is unreachable, its standby is asked too; the first good
  // answer wins (requests are keyed: both are the same bytes).
  double usual = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    usual = usual_answer_s_;
  }
  std::vector<int64_t> pending = {call};
  bool asked_standby = false;
  Status error;
  const auto ask_standby = [&]() -> Status {
    asked_standby = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++standby_requests_;
    }
    ARROW_ASSIGN_OR_RAISE(int64_t id, pieces_->Send(host, /*replica=*/1, reqs));
    pending.push_back(id);
    return Status::OK();
  };
  auto done = pieces_->WaitAny(pending, std::max(0.05, 4 * usual));
  if (!done) ARROW_RETURN_NOT_OK(ask_standby());
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(options_.timeout_s));
  while (true) {
    if (!done) {
      if (pending.empty()) break;
      const double left = std::max(0.0, seconds(deadline - Clock::now()));
      done = pieces_->WaitAny(pending, left);
      if (!done) break;
    }
    pending.erase(std::remove(pending.begin(), pending.end(), done->id), pending.end());
    if (done->status.ok()) {
      if (done->id == call) {  // the usual time, from the host's own answers only
        std::lock_guard<std::mutex> lock(mu_);
        usual_answer_s_ = 0.8 * usual_answer_s_ + 0.2 * seconds(Clock::now() - start);
      }
      pieces_->Forget(pending);
      return std::move(done->replies);
    }
    if (!done->status.IsIOError()) {  // the data is bad: the standby would say the same
      pieces_->Forget(pending);
      return done->status;
    }
    error = done->status;
    if (!asked_standby) ARROW_RETURN_NOT_OK(ask_standby());
    done.reset();
  }
  pieces_->Forget(pending);
  if (!error.ok()) return error;
  return TimeoutError(who, "no answer within " + std::to_string(options_.timeout_s) +
                               " s (runtime.timeout_s)");
}

void ConstructorService::Impl::LogBlank(int32_t source, const std::string& why) {
  int64_t count = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    count = ++blanked_[source];
  }
  // Its metadata was planned already: logged and counted as the embedded loader does.
  internal::LogLine("braid: source '" + config_.sources[size_t(source)].name +
                    "' blanked a piece of " + why +
                    "; its metadata was already planned, so its payload is blank and its "
                    "loss mask 0 (blanked " + std::to_string(count) + ")");
}

ConstructorService::Impl::BuildResult ConstructorService::Impl::Construct(int64_t step,
                                                                         int64_t bucket) {
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<const PlannedStep> planned, PlanFor(step, bucket));
  auto out = std::make_shared<BucketBuild>();
  out->step = planned;
  if (planned->plan != nullptr && CarriesPayloads(*planned->plan, bucket)) {
    const StepPlan& plan = *planned->plan;
    // The build keeps the step's states, not its plan: the payloads go once built.
    auto states = std::make_shared<PlannedStep>();
    states->step = planned->step;
    states->state_before = planned->state_before;
    states->state_after = planned->state_after;
    states->figures = planned->figures;
    out->step = std::move(states);
    // A peer's build of the same plan, if it made one first (or makes it meanwhile).
    std::shared_ptr<void> claim;
    for (int look = 0; options_.share != nullptr && look < 2; ++look) {
      if (auto built = options_.share->Find(plan, bucket)) {
        out->batches = std::move(*built);
        std::lock_guard<std::mutex> lock(mu_);
        ++shared_;
        return out;
      }
      if (look == 0) {
        claim = options_.share->Claim(plan, bucket, [this] {
          std::lock_guard<std::mutex> lock(mu_);
          return stopped_;
        });
      }
    }
    // In process, the pieces' payloads attached: their decodes start now, on the pool.
    for (const MicroBatch& mb : plan.buckets[size_t(bucket)].micro_batches) {
      for (const Sequence& seq : mb.sequences) {
        for (const DocPiece& piece : seq.docs) piece.payload.Want();
      }
    }
    const size_t n = plan.buckets[size_t(bucket)].micro_batches.size();
    for (size_t mb = 0; mb < n; ++mb) {
      const auto file = MaybeTensorFile(options_.shared_memory);
      ARROW_ASSIGN_OR_RAISE(Batch batch, BuildMicroBatch(plan, bucket, int64_t(mb),
                                                         config_.batch.pad_to_multiple_of,
                                                         file.get()));
      out->batches.push_back(std::make_shared<const Batch>(std::move(batch)));
    }
    if (options_.share != nullptr) options_.share->Put(plan, bucket, out->batches);
    return out;
  }
  ARROW_ASSIGN_OR_RAISE(StepPlan part, DecodeBucket(planned->encoded.data(),
                                                    planned->encoded.size(), bucket));
  const int32_t num_sources = static_cast<int32_t>(config_.sources.size());
  std::map<int32_t, SourceRequests> by_host;
  {
    auto requests = PieceRequests(part, bucket, num_sources);
    for (int32_t i = 0; i < num_sources; ++i) {
      if (requests[size_t(i)].empty()) continue;
      by_host[options_.host_of_source[size_t(i)]].emplace_back(
          i, std::move(requests[size_t(i)]));
    }
  }
  if (!by_host.empty() && pieces_ == nullptr) {
    return ConfigError("runtime", "the plan carries no payloads and no source host serves "
                                  "them");
  }
  // Every host is asked at once; their answers are awaited in turn.
  std::vector<std::pair<int32_t, int64_t>> calls;
  for (const auto& [host, reqs] : by_host) {
    auto id = pieces_->Send(host, /*replica=*/0, reqs);
    if (!id.ok()) {
      std::vector<int64_t> sent;
      for (const auto& c : calls) sent.push_back(c.second);
      pieces_->Forget(sent);
      return id.status();
    }
    calls.emplace_back(host, *id);
  }
  for (size_t c = 0; c < calls.size(); ++c) {
    const auto [host, id] = calls[c];
    const SourceRequests& reqs = by_host[host];
    auto replies = Await(host, id, reqs);
    if (!replies.ok()) {
      std::vector<int64_t> rest;
      for (size_t k = c + 1; k < calls.size(); ++k) rest.push_back(calls[k].second);
      pieces_->Forget(rest);
      return replies.status();
    }
    if (replies->size() != reqs.size()) {
      return DataError("source host " + std::to_string(host),
                       "answered " + std::to_string(replies->size()) + " sources of " +
                           std::to_string(reqs.size()));
    }
    for (size_t k = 0; k < reqs.size(); ++k) {
      const int32_t source = reqs[k].first;
      std::vector<std::string> blanked;
      ARROW_RETURN_NOT_OK(AttachPieces(&part, bucket, source,
                                       config_.sources[size_t(source)],
                                       (*replies)[k], &blanked,
                                       config_.batch.pad_to_multiple_of));
      for (const std::string& why : blanked) LogBlank(source, why);
    }
  }
  const size_t n = part.buckets[size_t(bucket)].micro_batches.size();
  for (size_t mb = 0; mb < n; ++mb) {
    const auto file = MaybeTensorFile(options_.shared_memory);
    ARROW_ASSIGN_OR_RAISE(Batch batch, BuildMicroBatch(part, bucket, int64_t(mb),
                                                       config_.batch.pad_to_multiple_of,
                                                       file.get()));
    out->batches.push_back(std::make_shared<const Batch>(std::move(batch)));
  }
  return out;
}

Result<std::shared_ptr<const DeliveredView>> ConstructorService::Impl::View(
    const ViewKey& key) {
  const Topology& topology = config_.topology;
  if (key.bucket < 0 || key.bucket >= topology.buckets()) {
    return ConfigError("rank", "bucket " + std::to_string(key.bucket) +
                                   " is outside the " +
                                   std::to_string(topology.buckets()) +
                                   " buckets of the topology");
  }
  if (!key.whole && (key.pp < 0 || key.pp >= topology.pp || key.cp < 0 ||
                     key.cp >= topology.cp)) {
    return ConfigError("rank", "view coordinates (pp " + std::to_string(key.pp) +
                                   ", cp " + std::to_string(key.cp) +
                                   ") are outside the topology");
  }
  {
    ConstructorServiceState::Dropped dropped;  // freed after the lock is released
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return Status::Cancelled("the constructor service was stopped");
    dropped = state_.Apply(ConstructorServiceState::Asked{key.step, key.bucket});
    if (auto held = state_.View(key)) {
      dropped.Add(state_.Apply(ConstructorServiceState::Served{key, 0}));
      return held;
    }
  }
  const auto build = EnsureBuild(key.step, key.bucket);
  for (int64_t ahead = 1; ahead <= options_.steps_in_flight; ++ahead) {
    EnsureBuild(key.step + ahead, key.bucket);
  }
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<const BucketBuild> built,
                        WaitFor(build,
                                "step " + std::to_string(key.step) + " bucket " +
                                    std::to_string(key.bucket),
                                /*interruptible=*/true));
  if (key.micro_batch < 0 || key.micro_batch >= int64_t(built->batches.size())) {
    return ConfigError("micro_batch", std::to_string(key.micro_batch) + " is outside the " +
                                          std::to_string(built->batches.size()) +
                                          " micro-batches of step " +
                                          std::to_string(key.step));
  }
  const auto& batch = built->batches[size_t(key.micro_batch)];
  std::shared_ptr<const Batch> viewed = batch;
  if (!key.whole) {
    Topology t = topology;
    RankCoords coords = WithBucket(t, RankCoords{0, 0, key.pp, key.cp}, key.bucket);
    if (!key.split_context && t.slices_context()) {
      t.cp = 1;
      coords.cp = 0;
    }
    // A context split copies its tensors: into a file of its own.
    const auto file = MaybeTensorFile(options_.shared_memory && t.slices_context() && t.cp > 1);
    ARROW_ASSIGN_OR_RAISE(Batch view, ViewFor(*batch, t, coords, file.get()));
    viewed = std::make_shared<const Batch>(std::move(view));
  }
  auto made = std::make_shared<const DeliveredView>(std::move(viewed), built->step);
  ConstructorServiceState::Dropped dropped;  // freed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  state_.Apply(ConstructorServiceState::ViewMade{key, made});
  auto held = state_.View(key);
  if (held == nullptr) held = made;  // evicted meanwhile (a rank far ahead): this one
  dropped = state_.Apply(
      ConstructorServiceState::Served{key, int64_t(built->batches.size())});
  return held;
}

ConstructorService::Figures ConstructorService::Impl::figures() const {
  std::lock_guard<std::mutex> lock(mu_);
  Figures f;
  f.newest_step = state_.newest_step();
  f.built_buckets = built_;
  f.rebuilt_buckets = rebuilt_;
  f.shared_buckets = shared_;
  f.standby_requests = standby_requests_;
  f.held_builds = state_.held_builds();
  f.held_views = state_.held_views();
  f.plan_bytes = plan_bytes_;
  f.blanked_pieces = blanked_;
  return f;
}

ConstructorService::ConstructorService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ConstructorService::~ConstructorService() = default;

Result<std::unique_ptr<ConstructorService>> ConstructorService::Make(
    const Config& config, Options options, std::shared_ptr<PlanSource> plans,
    std::shared_ptr<PieceSource> pieces) {
  if (pieces != nullptr &&
      options.host_of_source.size() != config.sources.size()) {
    return ConfigError("sources", "every source needs a host that serves its pieces (" +
                                      std::to_string(options.host_of_source.size()) +
                                      " hosts for " +
                                      std::to_string(config.sources.size()) + " sources)");
  }
  if (plans == nullptr) return ConfigError("runtime", "a constructor needs a plan source");
  return std::unique_ptr<ConstructorService>(new ConstructorService(
      std::make_unique<Impl>(config, std::move(options), std::move(plans),
                             std::move(pieces))));
}

Result<std::shared_ptr<const DeliveredView>> ConstructorService::View(const ViewKey& key) {
  return impl_->View(key);
}

ConstructorService::Figures ConstructorService::figures() const { return impl_->figures(); }

void ConstructorService::Stop() { impl_->Stop(); }

}  // namespace braid
