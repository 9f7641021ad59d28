#include "braid/service/constructor_service_state.h"

#include <limits>

namespace braid {

ConstructorServiceState::ConstructorServiceState(int64_t keep_steps,
                                                 const std::vector<int64_t>& buckets,
                                                 std::vector<int64_t> receivers)
    : keep_steps_(keep_steps),
      receivers_(std::move(receivers)),
      buckets_(buckets.begin(), buckets.end()) {}

void ConstructorServiceState::Dropped::Add(Dropped&& more) {
  for (auto& b : more.builds) builds.push_back(std::move(b));
  for (auto& p : more.plans) plans.push_back(std::move(p));
  for (auto& v : more.views) views.push_back(std::move(v));
}

void ConstructorServiceState::DropBuild(const StepBucket& key, Dropped* dropped) {
  if (const auto it = builds_.find(key); it != builds_.end()) {
    dropped->builds.push_back(std::move(it->second.future));
    builds_.erase(it);
  }
  ViewKey first;
  first.step = key.first;
  first.bucket = key.second;
  first.micro_batch = std::numeric_limits<int64_t>::min();
  first.pp = first.cp = std::numeric_limits<int64_t>::min();
  first.split_context = false;
  first.whole = false;
  for (auto it = views_.lower_bound(first);
       it != views_.end() && it->first.step == key.first && it->first.bucket == key.second;) {
    dropped->views.push_back(std::move(it->second));
    it = views_.erase(it);
  }
  served_.erase(key);
}

ConstructorServiceState::Dropped ConstructorServiceState::Apply(const Update& update) {
  Dropped dropped;
  if (const auto* u = std::get_if<Asked>(&update)) {
    buckets_.insert(u->bucket);
    if (u->step <= newest_) return dropped;
    newest_ = u->step;
    const int64_t oldest = newest_ - keep_steps_;
    while (!builds_.empty() && builds_.begin()->first.first < oldest) {
      dropped.builds.push_back(std::move(builds_.begin()->second.future));
      builds_.erase(builds_.begin());
    }
    while (!plans_.empty() && plans_.begin()->first.first < oldest) {
      dropped.plans.push_back(std::move(plans_.begin()->second.future));
      plans_.erase(plans_.begin());
    }
    while (!views_.empty() && views_.begin()->first.step < oldest) {
      dropped.views.push_back(std::move(views_.begin()->second));
      views_.erase(views_.begin());
    }
    while (!served_.empty() && served_.begin()->first.first < oldest) {
      served_.erase(served_.begin());
    }
  } else if (const auto* u = std::get_if<BuildQueued>(&update)) {
    builds_.emplace(u->key, Held<BuildFuture>{u->id, u->build});
  } else if (const auto* u = std::get_if<BuildEnded>(&update)) {
    const auto it = builds_.find(u->key);
    if (!u->ok && it != builds_.end() && it->second.id == u->id) {
      dropped.builds.push_back(std::move(it->second.future));
      builds_.erase(it);
    }
  } else if (const auto* u = std::get_if<PlansRequested>(&update)) {
    for (int64_t b : u->buckets) {
      plans_.emplace(StepBucket{u->step, b}, Held<PlanFuture>{u->id, u->plan});
    }
  } else if (const auto* u = std::get_if<PlansFailed>(&update)) {
    for (auto it = plans_.lower_bound({u->step, std::numeric_limits<int64_t>::min()});
         it != plans_.end() && it->first.first == u->step;) {
      if (it->second.id == u->id) {
        dropped.plans.push_back(std::move(it->second.future));
        it = plans_.erase(it);
      } else {
        ++it;
      }
    }
  } else if (const auto* u = std::get_if<ViewMade>(&update)) {
    views_.emplace(u->key, u->view);  // the first one made stays
  } else if (const auto* u = std::get_if<Served>(&update)) {
    const int64_t bucket = u->key.bucket;
    const int64_t receivers =
        bucket >= 0 && size_t(bucket) < receivers_.size() ? receivers_[size_t(bucket)] : 0;
    if (receivers <= 0 || u->key.step < newest_ - keep_steps_ ||
        !builds_.count({u->key.step, bucket})) {
      return dropped;
    }
    const StepBucket key{u->key.step, bucket};
    auto it = served_.find(key);
    if (it == served_.end()) {
      if (u->micro_batches <= 0) return dropped;
      it = served_.emplace(key, std::vector<int64_t>(size_t(u->micro_batches), 0)).first;
    }
    auto& served = it->second;
    if (u->key.micro_batch < 0 || u->key.micro_batch >= int64_t(served.size())) {
      return dropped;
    }
    ++served[size_t(u->key.micro_batch)];
    for (int64_t n : served) {
      if (n < receivers) return dropped;
    }
    DropBuild(key, &dropped);  // every rank of the bucket has every micro-batch
  }
  return dropped;
}

std::optional<ConstructorServiceState::BuildFuture> ConstructorServiceState::Build(
    const StepBucket& key) const {
  const auto it = builds_.find(key);
  if (it == builds_.end()) return std::nullopt;
  return it->second.future;
}

std::optional<ConstructorServiceState::PlanFuture> ConstructorServiceState::Plan(
    const StepBucket& key) const {
  const auto it = plans_.find(key);
  if (it == plans_.end()) return std::nullopt;
  return it->second.future;
}

std::vector<int64_t> ConstructorServiceState::BucketsWithoutPlan(int64_t step) const {
  std::vector<int64_t> out;
  for (int64_t b : buckets_) {
    if (!plans_.count({step, b})) out.push_back(b);
  }
  return out;
}

std::shared_ptr<const DeliveredView> ConstructorServiceState::View(
    const ViewKey& key) const {
  const auto it = views_.find(key);
  return it == views_.end() ? nullptr : it->second;
}

}  // namespace braid
