// Trainer rank <-> parallel coordinates.
//
// The rank order is Megatron's: tp varies fastest, then cp, then dp, then pp:
//   rank = tp + TP * (cp + CP * (dp + DP * pp)).
// Thread-safe: pure functions.
#pragma once

#include <cstdint>

#include "braid/config/config.h"
#include "braid/status.h"

namespace braid {

struct RankCoords {
  int64_t dp = 0, tp = 0, pp = 0, cp = 0;
};

/// The coordinates of `rank`. Fails (config error naming "rank") if rank is outside the
/// topology's world size.
Result<RankCoords> CoordsOf(const Topology& topology, int64_t rank);

/// The rank at `coords`. REQUIRES: coordinates within the topology.
int64_t RankOf(const Topology& topology, const RankCoords& coords);

}  // namespace braid
