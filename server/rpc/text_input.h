// Text sequences on the server's request threads: text::tokenize_text (server/text/text.h),
// timed for fastformer_tokenize_duration_seconds. It runs while the call is converted, before
// admission, never in the batch loop.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/batching/request.h"
#include "server/text/text.h"

namespace fastformer::rpc {

using text::Truncate;

// text::tokenize_text, adding the time taken and the text to request->tokenize_ns and
// request->texts (Intake::admit records them).
std::optional<std::string> tokenize_text(const text::Tokenizer* tokenizer,
                                         const engine::ModelConfig& config, std::string_view text,
                                         Truncate truncate, std::vector<int32_t>* ids,
                                         batching::Request* request);

}  // namespace fastformer::rpc
