#include "braid/client/topology.h"

namespace braid {

Result<RankCoords> CoordsOf(const Topology& t, int64_t rank) {
  if (rank < 0 || rank >= t.world_size()) {
    return ConfigError("rank", std::to_string(rank) + " is outside the topology (world size " +
                                   std::to_string(t.world_size()) + " = dp " +
                                   std::to_string(t.dp) + " x tp " + std::to_string(t.tp) +
                                   " x pp " + std::to_string(t.pp) + " x cp " +
                                   std::to_string(t.cp) + ")");
  }
  RankCoords c;
  c.tp = rank % t.tp;
  rank /= t.tp;
  c.cp = rank % t.cp;
  rank /= t.cp;
  c.dp = rank % t.dp;
  c.pp = rank / t.dp;
  return c;
}

int64_t RankOf(const Topology& t, const RankCoords& c) {
  return c.tp + t.tp * (c.cp + t.cp * (c.dp + t.dp * c.pp));
}

}  // namespace braid
