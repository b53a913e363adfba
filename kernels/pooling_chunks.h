// The chunk size of the pooling reductions: one constant for the kernels
// (additive_pooling.cu), the CPU engine and the chunk layout the forward graph plans
// (server/engine/workspace.h). Plain C++, no CUDA headers, so host-only code includes it.
#pragma once

#include <cstdint>

namespace fastformer::kernels {

// Tokens per pooling chunk: a sequence's softmax-weighted sums are split into chunks of at
// most this many tokens, reduced in parallel (a block each on the GPU, a task each on the
// CPU) and combined from their online-softmax partials, so one 65,536-token sequence keeps
// every block or thread busy.
inline constexpr int32_t kChunkTokens = 256;

}  // namespace fastformer::kernels
