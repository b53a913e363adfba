#include "server/grpc/raw_message.h"

#include <spdlog/spdlog.h>

namespace fastformer::rpc {

void log_unserializable(const char* method, size_t bytes) {
  spdlog::error("{}: an answer of {} bytes did not serialize", method, bytes);
}

}  // namespace fastformer::rpc
