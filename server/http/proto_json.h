// A protobuf message as JSON the way Triton's REST API prints it (KServe v2 REST's metadata,
// config, statistics and repository index, kserve_rest.cc): proto field names, enums by name,
// 64-bit integers as numbers (protobuf's own JSON printer quotes them, which Triton's clients
// and perf_analyzer do not read), maps as objects, zero values printed.
#pragma once

#include <google/protobuf/message.h>

#include "server/http/json.h"

namespace fastformer::http {

void proto_json(const google::protobuf::Message& message, json::Writer& w);

}  // namespace fastformer::http
