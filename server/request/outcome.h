// The status a finished request answers with, from its batching::Outcome: the same on every
// protocol (DEADLINE_EXCEEDED, CANCELLED, INTERNAL naming the engine's failure).
#pragma once

#include "common/status.h"
#include "server/batching/job.h"

namespace fastformer::request {

Status outcome_status(const batching::Job& request);

}  // namespace fastformer::request
