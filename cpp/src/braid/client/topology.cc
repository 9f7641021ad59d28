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
  for (Dim d : t.order) {
    c.at(d) = rank % t.size(d);
    rank /= t.size(d);
  }
  return c;
}

int64_t RankOf(const Topology& t, const RankCoords& c) {
  int64_t rank = 0, stride = 1;
  for (Dim d : t.order) {
    rank += c.at(d) * stride;
    stride *= t.size(d);
  }
  return rank;
}

int64_t BucketOf(const Topology& t, const RankCoords& c) {
  int64_t slot = 0, stride = 1;
  for (Dim d : t.order) {
    if (!t.distributed(d)) continue;
    slot += c.at(d) * stride;
    stride *= t.size(d);
  }
  return slot / t.group;
}

RankCoords WithBucket(const Topology& t, RankCoords c, int64_t bucket) {
  int64_t slot = bucket * t.group;
  for (Dim d : t.order) {
    if (!t.distributed(d)) continue;
    c.at(d) = slot % t.size(d);
    slot /= t.size(d);
  }
  return c;
}

}  // namespace braid
