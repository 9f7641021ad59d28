// The in-process transport: the ports of a constructor service (PlanSource,
// PieceSource, service/constructor_service.h) served by services in the same process.
//
//   InProcessPlans  plans straight from a PlannerService: the plan itself, its payload
//                   handles attached (the embedded runtime)
//   LocalPieces     pieces fetched by key from the SourceServices of this process (a Ray
//                   host that serves sources beside its constructor); a call runs when
//                   it is awaited, so the calls to other processes go out first
//   RoutedPieces    the hosts of this process through one PieceSource, the others
//                   through another (a runtime's transport between processes)
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "braid/service/constructor_service.h"
#include "braid/service/planner_service.h"
#include "braid/service/source_service.h"

namespace braid {

class InProcessPlans : public PlanSource {
 public:
  /// REQUIRES: `planner` outlives this.
  InProcessPlans(PlannerService* planner, double timeout_s)
      : planner_(planner), timeout_s_(timeout_s) {}
  Result<std::shared_ptr<const PlannedStep>> Plan(
      int64_t step, const std::vector<int64_t>& buckets) override;

 private:
  PlannerService* planner_;
  double timeout_s_;
};

class LocalPieces : public PieceSource {
 public:
  /// REQUIRES: `sources` (opened to serve) outlives this.
  explicit LocalPieces(const SourceSet* sources) : sources_(sources) {}
  Result<int64_t> Send(int32_t host, int32_t replica,
                       const SourceRequests& requests) override;
  std::optional<PieceCall> WaitAny(const std::vector<int64_t>& calls,
                                   double timeout_s) override;
  void Forget(const std::vector<int64_t>& calls) override;

 private:
  const SourceSet* sources_;
  std::mutex mu_;
  int64_t next_id_ = 0;                         // GUARDED_BY(mu_)
  std::map<int64_t, SourceRequests> pending_;  // GUARDED_BY(mu_)
};

class RoutedPieces : public PieceSource {
 public:
  /// Calls to the hosts in `local_hosts` (replica 0) go to `local`, every other call to
  /// `remote`.
  RoutedPieces(std::set<int32_t> local_hosts, std::shared_ptr<PieceSource> local,
               std::shared_ptr<PieceSource> remote)
      : local_hosts_(std::move(local_hosts)),
        local_(std::move(local)),
        remote_(std::move(remote)) {}
  Result<int64_t> Send(int32_t host, int32_t replica,
                       const SourceRequests& requests) override;
  std::optional<PieceCall> WaitAny(const std::vector<int64_t>& calls,
                                   double timeout_s) override;
  void Forget(const std::vector<int64_t>& calls) override;

 private:
  struct Routed {
    bool local = false;
    int64_t id = 0;  // the id on its side
  };
  // The calls of `calls` on one side, as that side's ids, and the map back.
  std::vector<int64_t> Side(const std::vector<int64_t>& calls, bool local,
                            std::map<int64_t, int64_t>* back);

  const std::set<int32_t> local_hosts_;
  std::shared_ptr<PieceSource> local_, remote_;
  std::mutex mu_;
  int64_t next_id_ = 0;                  // GUARDED_BY(mu_)
  std::map<int64_t, Routed> calls_;      // GUARDED_BY(mu_)
};

}  // namespace braid
