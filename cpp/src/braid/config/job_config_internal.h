// The library's side of the public braid::JobConfig (braid/config.h): the typed Config it
// holds. Only Braid's own code (the Loader, the DataPlane, the Python binding) includes
// this; a JobConfig made here is as valid as its Config (REQUIRES: validated, i.e. from
// ParseConfig or DataPlane::Plan).
//
// Thread-safe: both functions are pure.
#pragma once

#include "braid/config.h"
#include "braid/config/config.h"

namespace braid {

class JobConfigInternal {
 public:
  /// A JobConfig holding `config`.
  static JobConfig Wrap(Config config);
  /// The Config `job` holds; lives as long as `job` or any copy of it.
  static const Config& Get(const JobConfig& job);
};

}  // namespace braid
