// Trainer rank <-> parallel coordinates, and rank -> bucket.
//
// The rank order is topology.order, the fastest-varying dimension first; the default is
// Megatron's (tp, then cp, then dp, then pp):
//   rank = tp + TP * (cp + CP * (dp + DP * pp)).
// A bucket is the part of each step's sequences that the planner balances for one group
// of ranks (topology.distribute, docs/parallelism.md): by default one per DP rank.
// Thread-safe: pure functions.
#pragma once

#include <cstdint>

#include "braid/config/config.h"
#include "braid/status.h"

namespace braid {

struct RankCoords {
  int64_t dp = 0, tp = 0, pp = 0, cp = 0;

  int64_t& at(Dim d) {
    int64_t* c[] = {&dp, &tp, &pp, &cp};
    return *c[static_cast<int>(d)];
  }
  int64_t at(Dim d) const { return const_cast<RankCoords*>(this)->at(d); }
};

/// The coordinates of `rank`. Fails (config error naming "rank") if rank is outside the
/// topology's world size.
Result<RankCoords> CoordsOf(const Topology& topology, int64_t rank);

/// The rank at `coords`. REQUIRES: coordinates within the topology.
int64_t RankOf(const Topology& topology, const RankCoords& coords);

/// The bucket the rank at `coords` receives: its index over the distributed dimensions
/// (in rank order), divided by topology.group. REQUIRES: coordinates within the topology.
int64_t BucketOf(const Topology& topology, const RankCoords& coords);

/// `coords` with its distributed coordinates replaced by those of the first rank of
/// `bucket` (the other coordinates, which decide the rank's view, kept).
/// REQUIRES: 0 <= bucket < topology.buckets().
RankCoords WithBucket(const Topology& topology, RankCoords coords, int64_t bucket);

}  // namespace braid
