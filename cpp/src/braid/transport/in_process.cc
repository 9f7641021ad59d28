#include "braid/transport/in_process.h"

#include <algorithm>

namespace braid {

Result<std::shared_ptr<const PlannedStep>> InProcessPlans::Plan(
    int64_t step, const std::vector<int64_t>& /*buckets: the plan holds every one*/) {
  return planner_->Plan(step, timeout_s_);
}

Result<int64_t> LocalPieces::Send(int32_t /*host*/, int32_t /*replica*/,
                                  const SourceRequests& requests) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t id = next_id_++;
  pending_.emplace(id, requests);
  return id;
}

std::optional<PieceCall> LocalPieces::WaitAny(const std::vector<int64_t>& calls,
                                              double /*timeout_s: runs now*/) {
  SourceRequests requests;
  PieceCall out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = std::find_if(calls.begin(), calls.end(),
                                 [&](int64_t id) { return pending_.count(id) > 0; });
    if (it == calls.end()) return std::nullopt;
    out.id = *it;
    requests = std::move(pending_[*it]);
    pending_.erase(*it);
  }
  for (const auto& [source, reqs] : requests) {
    SourceService* service = sources_->find(source);
    if (service == nullptr) {
      out.status = ConfigError("sources[" + std::to_string(source) + "]",
                               "not served in this process");
      return out;
    }
    auto reply = service->Fetch(reqs.data(), int64_t(reqs.size()) / kRequestFields);
    if (!reply.ok()) {
      out.status = reply.status();
      out.replies.clear();
      return out;
    }
    out.replies.push_back(std::make_shared<const PieceReply>(std::move(*reply)));
  }
  return out;
}

void LocalPieces::Forget(const std::vector<int64_t>& calls) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t id : calls) pending_.erase(id);
}

Result<int64_t> RoutedPieces::Send(int32_t host, int32_t replica,
                                   const SourceRequests& requests) {
  const bool local = replica == 0 && local_hosts_.count(host) > 0;
  ARROW_ASSIGN_OR_RAISE(int64_t id,
                        (local ? local_ : remote_)->Send(host, replica, requests));
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t routed = next_id_++;
  calls_[routed] = Routed{local, id};
  return routed;
}

std::vector<int64_t> RoutedPieces::Side(const std::vector<int64_t>& calls, bool local,
                                        std::map<int64_t, int64_t>* back) {
  std::vector<int64_t> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t id : calls) {
    const auto it = calls_.find(id);
    if (it == calls_.end() || it->second.local != local) continue;
    out.push_back(it->second.id);
    (*back)[it->second.id] = id;
  }
  return out;
}

std::optional<PieceCall> RoutedPieces::WaitAny(const std::vector<int64_t>& calls,
                                               double timeout_s) {
  // A call in this process answers at once; only without one is the other side awaited.
  for (const bool local : {true, false}) {
    std::map<int64_t, int64_t> back;
    const std::vector<int64_t> ids = Side(calls, local, &back);
    if (ids.empty()) continue;
    auto done = (local ? local_ : remote_)->WaitAny(ids, timeout_s);
    if (!done) return std::nullopt;
    done->id = back[done->id];
    std::lock_guard<std::mutex> lock(mu_);
    calls_.erase(done->id);
    return done;
  }
  return std::nullopt;
}

void RoutedPieces::Forget(const std::vector<int64_t>& calls) {
  for (const bool local : {true, false}) {
    std::map<int64_t, int64_t> back;
    const std::vector<int64_t> ids = Side(calls, local, &back);
    if (!ids.empty()) (local ? local_ : remote_)->Forget(ids);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t id : calls) calls_.erase(id);
}

}  // namespace braid
