// The one default of every setting that more than one binary or layer has: the server's
// flags (server/cmd/server_options.h), the batching queue's limits, the engine's options,
// fastformer-encode and fastformer-bench all start from these, and docs/operations.md's
// flag table states them (tests/golden/test_documented_defaults.py checks the table against
// what each binary's --help reports).
#pragma once

#include <cstdint>

namespace fastformer::defaults {

inline constexpr const char* kListen = "0.0.0.0:50051";
inline constexpr const char* kMetricsListen = "0.0.0.0:8002";
inline constexpr const char* kBackend = "auto";
inline constexpr int kDevice = 0;
/// The engine picks: bfloat16 where its GEMMs are fast in bfloat16, float32 elsewhere (engine.h)
inline constexpr const char* kDtype = "auto";
inline constexpr int kThreads = 0;  ///< 0 = all cores
inline constexpr int64_t kMaxBatchTokens = 16384;
inline constexpr int64_t kMaxBatchSequences = 256;
inline constexpr int64_t kMaxQueueDelayUs = 0;
inline constexpr int64_t kMaxQueueTokens = 262144;
// A bulk sequence queued this long is batched as an interactive one (priority classes).
inline constexpr int64_t kBulkPromoteAfterMs = 5000;
inline constexpr int64_t kMaxRequestTokens =
    0;  ///< 0 = max(max_batch_tokens, max_position_embeddings)
inline constexpr int64_t kMaxMessageBytes = int64_t(64) << 20;
inline constexpr int64_t kMaxRequestInputs = 2048;  ///< OpenAI's own limit on inputs
/// Chunks (spans) over all rows of one request (late chunking): a 65,536-token document in
/// 16-token chunks.
inline constexpr int64_t kMaxRequestSpans = 4096;
inline constexpr const char* kHttpListen = "0.0.0.0:8000";
inline constexpr int kHttpThreads = 2;
inline constexpr int64_t kHttpMaxConnections = 1024;
inline constexpr double kHttpIdleTimeoutS = 60;
inline constexpr double kHttpHeaderTimeoutS = 10;
inline constexpr int64_t kMaxConcurrentStreams = 1024;
inline constexpr double kShutdownTimeoutS = 30;

}  // namespace fastformer::defaults
