// braid/braid.h: Braid's public C++ API in one include (docs/cpp-api.md).
//
//   ARROW_ASSIGN_OR_RAISE(braid::JobConfig config, braid::JobConfig::FromFile(path));
//   ARROW_ASSIGN_OR_RAISE(auto loader, braid::Loader::Make(config, {.rank = 0}));
//   ARROW_ASSIGN_OR_RAISE(std::shared_ptr<const braid::Batch> batch, loader->Next());
//
// status.h    Status / Result (Arrow's) and ErrorDetail: what failed, and where
// config.h    JobConfig: a parsed, validated config file; WeightSchedule
// dataplane.h DataPlane: mix / distribute / cost / balance / broadcast_at -> JobConfig
// loader.h    Loader: one trainer rank's micro-batches and their resumable state
// batch.h     Batch and Tensor: a micro-batch's named dense tensors
#pragma once

#include "braid/batch.h"      // IWYU pragma: export
#include "braid/config.h"     // IWYU pragma: export
#include "braid/dataplane.h"  // IWYU pragma: export
#include "braid/loader.h"     // IWYU pragma: export
#include "braid/status.h"     // IWYU pragma: export
