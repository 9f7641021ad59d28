// Braid's public C++ API in one include. See docs/architecture.md for the roles.
#pragma once

#include "braid/client/topology.h"
#include "braid/config/config.h"
#include "braid/construct/batch.h"
#include "braid/construct/constructor.h"
#include "braid/plan/balance.h"
#include "braid/plan/planner.h"
#include "braid/plan/step_plan.h"
#include "braid/runtime/engine.h"
#include "braid/cli/job.h"
#include "braid/source/source_loader.h"
#include "braid/status.h"
