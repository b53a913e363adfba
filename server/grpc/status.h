// The serving core in gRPC's terms: the one mapping of a Status to a grpc::Status (the codes
// share gRPC's numbers: status.cc checks each), its reverse for what gRPC itself reports (a
// serialization failure), a call's deadline on the steady clock, and the core's names the
// services use.
#pragma once

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "server/batching/job.h"
#include "server/request/outcome.h"
#include "server/serving/infer_conversion.h"
#include "server/serving/intake.h"

namespace fastformer::rpc {

// The serving core's names, as every gRPC service uses them.
using request::outcome_status;
using serving::Admitted;
using serving::InferCall;
using serving::Intake;
using serving::ns_since;
using serving::ServedModel;
using serving::ServiceConfig;

grpc::Status to_grpc(const Status& status);
Status from_grpc(const grpc::Status& status);

// The call's deadline on the steady clock (max() when the client set none).
batching::Clock::time_point steady_deadline(const grpc::CallbackServerContext* context);

}  // namespace fastformer::rpc
