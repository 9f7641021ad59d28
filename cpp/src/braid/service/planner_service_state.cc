#include "braid/service/planner_service_state.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace braid {

std::shared_ptr<const PayloadIndex> PayloadIndex::Of(const StepPlan& plan,
                                                     const Config& config) {
  auto index = std::make_shared<PayloadIndex>();
  for (const BucketPlan& bucket : plan.buckets) {
    for (const MicroBatch& mb : bucket.micro_batches) {
      for (const Sequence& seq : mb.sequences) {
        for (const DocPiece& d : seq.docs) {
          if (!d.payload || size_t(d.source) >= config.sources.size() ||
              !config.sources[size_t(d.source)].image_column.empty()) {
            continue;
          }
          index->entries.push_back(Entry{d.source, d.file, d.row, d.payload});
        }
      }
    }
  }
  auto key = [](const Entry& e) { return std::tuple(e.source, e.file, e.row); };
  auto& entries = index->entries;
  std::stable_sort(entries.begin(), entries.end(),
                   [&](const Entry& a, const Entry& b) { return key(a) < key(b); });
  const auto same = [&](const Entry& a, const Entry& b) { return key(a) == key(b); };
  entries.erase(std::unique(entries.begin(), entries.end(), same), entries.end());
  return index;
}

PayloadRef PayloadIndex::Find(int32_t source, int32_t file, int64_t row) const {
  const auto want = std::tuple(source, file, row);
  const auto it = std::lower_bound(
      entries.begin(), entries.end(), want, [](const Entry& e, const auto& k) {
        return std::tuple(e.source, e.file, e.row) < k;
      });
  if (it == entries.end() || std::tuple(it->source, it->file, it->row) != want) {
    return PayloadRef();
  }
  return it->payload;
}
namespace {

using Json = nlohmann::json;

Status JournalError(const std::string& what) { return ConfigError("journal", what); }

}  // namespace

PlannerServiceState::PlannerServiceState(const Config& config, const PlannerState& start,
                                         Options options)
    : config_(config),
      options_(options),
      first_step_(start.step),
      next_step_(start.step),
      horizon_(start.step + options.plan_ahead),
      newest_asked_(start.step),
      restored_from_(start.step) {
  checkpoints_.emplace(start.step, start);
}

Status PlannerServiceState::Restore(const std::string& journal) {
  Json in = Json::parse(journal, nullptr, /*allow_exceptions=*/false);
  if (!in.is_object() || !in.contains("checkpoints") || !in["checkpoints"].is_array() ||
      !in.contains("clients") || !in["clients"].is_array()) {
    return JournalError("must be an object with checkpoints and clients");
  }
  std::map<int64_t, PlannerState> checkpoints;
  for (const Json& entry : in["checkpoints"]) {
    if (!entry.is_string()) return JournalError("a checkpoint must be a state's JSON");
    int64_t consumed = 0;
    ARROW_ASSIGN_OR_RAISE(PlannerState state,
                          PlannerStateFromJson(entry.get<std::string>(), config_, &consumed));
    if (consumed != 0) return JournalError("a checkpoint must lie at a step boundary");
    checkpoints.emplace(state.step, std::move(state));
  }
  std::set<std::string> clients;
  for (const Json& c : in["clients"]) {
    if (!c.is_string()) return JournalError("a client must be a string");
    clients.insert(c.get<std::string>());
  }
  if (checkpoints.empty() || checkpoints.begin()->first != first_step_) {
    return JournalError("does not start at the job's first step " +
                        std::to_string(first_step_));
  }
  checkpoints_ = std::move(checkpoints);
  clients_ = std::move(clients);
  held_.clear();
  restored_from_ = checkpoints_.rbegin()->first;
  next_step_ = restored_from_;
  horizon_ = std::max(horizon_, next_step_ + options_.plan_ahead);
  return Status::OK();
}

bool PlannerServiceState::Apply(const Update& update) {
  if (const auto* u = std::get_if<Planned>(&update)) {
    const int64_t step = u->step->step;
    next_step_ = step + 1;
    held_[step] = u->step;
    DropOld();
    if (step % options_.checkpoint_every != 0 || checkpoints_.count(step)) return false;
    checkpoints_.emplace(step, u->step->state_before);
    while (static_cast<int64_t>(checkpoints_.size()) > options_.max_checkpoints + 1) {
      checkpoints_.erase(std::next(checkpoints_.begin()));  // the start stays
    }
    return step <= journaled_through();
  }
  if (const auto* u = std::get_if<Asked>(&update)) {
    horizon_ = std::max(horizon_, u->step + options_.plan_ahead);
    const int64_t before = journaled_through();
    newest_asked_ = std::max(newest_asked_, u->step);
    DropOld();
    // Did a checkpoint come into the journal?
    const auto reached = checkpoints_.upper_bound(std::max(before, first_step_));
    return reached != checkpoints_.end() && reached->first <= journaled_through();
  }
  if (const auto* u = std::get_if<Attached>(&update)) {
    return !ended_ && clients_.insert(u->client).second;
  }
  if (const auto* u = std::get_if<Detached>(&update)) {
    if (clients_.erase(u->client) == 0) return false;
    ended_ = clients_.empty();
    return true;
  }
  if (std::get_if<Replayed>(&update) != nullptr) {
    ++replays_;
    return false;
  }
  return false;
}

PayloadRef PlannerServiceState::KeptPayload(int32_t source, int32_t file,
                                            int64_t row) const {
  for (auto it = held_.rbegin(); it != held_.rend(); ++it) {
    const PlannedStep& step = *it->second;
    if (step.plan == nullptr) continue;  // lightened: its wire message only
    if (step.payloads == nullptr) step.payloads = PayloadIndex::Of(*step.plan, config_);
    if (PayloadRef found = step.payloads->Find(source, file, row)) return found;
  }
  return PayloadRef();
}

void PlannerServiceState::DropOld() {
  const int64_t oldest = newest_asked_ - options_.keep_steps;
  while (!held_.empty() && held_.begin()->first < oldest) held_.erase(held_.begin());
  if (options_.keep_plan_steps < 0) return;
  // Older steps keep their wire message, not the plan: its payloads are freed.
  const int64_t planned = newest_asked_ - options_.keep_plan_steps;
  for (auto it = held_.begin(); it != held_.end() && it->first < planned; ++it) {
    if (it->second->plan == nullptr) continue;
    auto light = std::make_shared<PlannedStep>(*it->second);
    light->plan = nullptr;
    light->payloads = nullptr;
    it->second = std::move(light);
  }
}

std::string PlannerServiceState::Journal() const {
  if (ended_) return "";
  Json checkpoints = Json::array();
  // The start, then the newest `committed` others.
  checkpoints.push_back(PlannerStateToJson(checkpoints_.begin()->second, config_));
  // Of the others, the newest `committed` of steps a consumer asked for: one planned
  // ahead of them all is not committed yet.
  const auto reached =
      checkpoints_.upper_bound(std::max(journaled_through(), first_step_));
  const int64_t others = std::distance(std::next(checkpoints_.begin()), reached);
  auto it = std::next(checkpoints_.begin(),
                      1 + std::max<int64_t>(0, others - options_.committed));
  for (; it != reached && it != checkpoints_.end(); ++it) {
    checkpoints.push_back(PlannerStateToJson(it->second, config_));
  }
  Json clients = Json::array();
  for (const std::string& c : clients_) clients.push_back(c);
  return Json{{"checkpoints", checkpoints}, {"clients", clients}}.dump();
}

const PlannerState& PlannerServiceState::resume_state() const {
  return CheckpointBefore(next_step_);
}

std::shared_ptr<const PlannedStep> PlannerServiceState::Held(int64_t step) const {
  const auto it = held_.find(step);
  return it == held_.end() ? nullptr : it->second;
}

const PlannerState& PlannerServiceState::CheckpointBefore(int64_t step) const {
  auto it = checkpoints_.upper_bound(step);
  return std::prev(it)->second;
}

}  // namespace braid
