#include "server/rpc/text_input.h"

#include <algorithm>
#include <chrono>

namespace fastformer::rpc {

std::optional<std::string> tokenize_text(const engine::Model& model, std::string_view text, Truncate truncate,
                                         std::vector<int32_t>* ids, batching::Request* request) {
  const auto start = batching::Clock::now();
  std::optional<std::string> refused = engine::tokenize_text(model, text, truncate, ids);
  request->tokenize_ns += uint64_t(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::nanoseconds>(batching::Clock::now() - start).count()));
  ++request->texts;
  return refused;
}

}  // namespace fastformer::rpc
