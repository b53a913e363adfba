#include "server/rpc/text_input.h"

#include "server/rpc/intake.h"  // ns_since

namespace fastformer::rpc {

std::optional<std::string> tokenize_text(const text::Tokenizer* tokenizer,
                                         const engine::ModelConfig& config, std::string_view text,
                                         Truncate truncate, std::vector<int32_t>* ids,
                                         batching::Request* request) {
  const auto start = batching::Clock::now();
  std::optional<std::string> refused = text::tokenize_text(tokenizer, config, text, truncate, ids);
  request->tokenize_ns += ns_since(start);
  ++request->texts;
  return refused;
}

}  // namespace fastformer::rpc
