// Text sequences on the server's request threads: engine::tokenize_text (server/engine/text.h),
// timed for fastformer_tokenize_duration_seconds. It runs while the call is converted, before
// admission, never in the batch loop.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/batching/request.h"
#include "server/engine/model.h"
#include "server/engine/text.h"

namespace fastformer::rpc {

using engine::Truncate;

// engine::tokenize_text, adding the time taken and the text to request->tokenize_ns and
// request->texts (Intake::admit records them).
std::optional<std::string> tokenize_text(const engine::Model& model, std::string_view text, Truncate truncate,
                                         std::vector<int32_t>* ids, batching::Request* request);

}  // namespace fastformer::rpc
