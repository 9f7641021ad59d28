// braid/dataplane.h: the data plane as a small language (docs/dataplane.md).
//
// A DataPlane is a builder of the declarative primitives mix / distribute / cost /
// balance / broadcast_at / phase over a base JobConfig (its seed, sources, batch,
// topology and runtime), compiled by Plan() into the same JobConfig the equivalent YAML
// produces. The planner, the Loader and `braid plan` then run it unchanged.
//
//   braid::DataPlane plane(base);
//   plane.Mix("web", 0.7).Mix("code", braid::WeightSchedule{{{0, 0.1}, {1000, 0.3}}})
//        .Phase(/*until_step=*/1000, /*seq_len=*/4096)
//        .Distribute("dp").Cost(1.0, 4096).Balance("karmarkar_karp").BroadcastAt("tp");
//   ARROW_ASSIGN_OR_RAISE(braid::JobConfig config, plane.Plan());
//
// Errors name the primitive ("mix.web: must be a finite number >= 0, got -1",
// "balance: unknown method 'x' ..."), all Invalid with an ErrorDetail of kind kConfig.
// The first bad call is kept in status() and returned by Plan(); later calls are still
// recorded but cannot clear it.
//
// Thread-compatible: a DataPlane is a value (a copy is a deep copy); Plan() is const.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "braid/config.h"
#include "braid/status.h"

namespace braid {

class DataPlane {
 public:
  /// Starts from `base`: its seed, sources, batch, topology, phases and runtime. Weights
  /// and balance start as the base's (so a DataPlane with no calls plans the base).
  explicit DataPlane(const JobConfig& base);
  ~DataPlane();
  DataPlane(const DataPlane& other);
  DataPlane& operator=(const DataPlane& other);
  DataPlane(DataPlane&& other) noexcept;
  DataPlane& operator=(DataPlane&& other) noexcept;

  // --- mix(schedule) ---
  /// Source `source`'s weight: a constant (share of tokens, relative).
  DataPlane& Mix(const std::string& source, double weight);
  /// Source `source`'s weight as a function of the step (piecewise linear, or piecewise
  /// constant with `stepwise`), as `sources[].weight: {schedule|steps: ...}` in YAML.
  DataPlane& Mix(const std::string& source, WeightSchedule weight);
  /// Several sources at once, in order; unnamed sources keep their weight.
  DataPlane& Mix(const std::vector<std::pair<std::string, WeightSchedule>>& weights);

  // --- distribute(axis, group) ---
  /// Which ranks get different buckets of each step's sequences (topology.distribute,
  /// docs/parallelism.md "Buckets"): "dp" (the default, one bucket per DP rank), "cp"
  /// (one per DP x CP rank: CP ranks get whole sequences) or "world" (every rank, less
  /// the dimensions given to BroadcastAt). `group` consecutive slots share one bucket.
  DataPlane& Distribute(const std::string& axis, int64_t group = 1);

  // --- cost(fn) ---
  /// Cost of a document piece of `len` tokens: attn * len^2 + linear * len
  /// (`balance.cost` in YAML). Both >= 0. The vision term stays the base's.
  DataPlane& Cost(double attn, double linear);
  /// The same plus the vision-encoder term: vision * image tokens of a document
  /// (`balance.cost.vision`), and `mode` "hybrid" (backbone + vision) or "backbone"
  /// (`balance.cost.mode`; docs/planner.md).
  DataPlane& Cost(double attn, double linear, double vision, const std::string& mode);

  // --- mix(schedule): phases ---
  /// Adds a phase: steps from the previous phase's end up to `until_step` (exclusive) use
  /// `seq_len` (0: batch.seq_len) and these weight overrides (`phases[]` in YAML). The
  /// first call replaces the base's phases; calls must come in increasing until_step.
  DataPlane& Phase(
      int64_t until_step, int64_t seq_len,
      const std::vector<std::pair<std::string, WeightSchedule>>& weights = {});

  // --- balance(method) ---
  /// "karmarkar_karp" | "greedy" | "none" (`balance.algorithm`).
  DataPlane& Balance(const std::string& method);

  // --- broadcast_at(dim) ---
  /// A parallel dimension whose ranks receive the same micro-batches: "tp" (copies) or
  /// "pp" (every stage its view of the same micro-batch). With distribute "dp" or "cp"
  /// both always are (a call says so and changes nothing); with "world" only the
  /// dimensions named here are (topology.broadcast_at). "dp" and "cp" cannot be broadcast
  /// at (DP ranks get different buckets, CP ranks slices). Calls accumulate.
  DataPlane& BroadcastAt(const std::string& dim);

  /// The compiled, validated config, or the first error (a bad call's, or the
  /// validation's: the batch shape against the topology, weights all zero as "mix").
  Result<JobConfig> Plan() const;

  /// OK, or the first bad call's error.
  const Status& status() const;
  /// "dp", "cp" or "world".
  const std::string& distribute_axis() const;
  /// The dimensions whose ranks receive the same micro-batches in the compiled topology
  /// ("tp", "pp" in that order; by default both, or none with distribute "world").
  std::vector<std::string> broadcast_dims() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;  // INVARIANT: non-null except in a moved-from DataPlane
};

}  // namespace braid
