// Helpers shared by the kernels: warp and block reductions in float, activations, and the
// block and grid sizes of their launches. Compiles under nvcc and against the host emulation
// (kernels/runtime.h).
#pragma once

#include <cstdint>

#include "kernels/runtime.h"

namespace fastformer::kernels {
inline namespace FF_KERNELS_ABI {

// Mirrors engine::Activation (server/engine/config.h), kept separate so kernels do not
// depend on the engine's headers.
enum class Act : int { kGeluErf = 0, kGeluTanh = 1, kRelu = 2, kSilu = 3 };

// Device helpers exist where kernels compile (nvcc or the emulation); host code that only
// launches kernels (the engine's .cc files in CUDA builds) sees the declarations above.
#if defined(__CUDACC__) || defined(FF_EMULATION)
FF_DEVICE float activate(float x, Act act) {
  switch (act) {
    case Act::kGeluErf: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case Act::kGeluTanh: return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case Act::kRelu: return fmaxf(x, 0.0f);
    case Act::kSilu: return x / (1.0f + expf(-x));
  }
  return x;
}

FF_DEVICE float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of `v` over the block; every thread gets the result. `scratch` holds 32 floats of
// shared memory; blockDim.x must be a multiple of 32. Ends with a barrier, so `scratch`
// may be reused right after.
FF_DEVICE float block_sum(float v, float* scratch) {
  const int lane_id = threadIdx.x % 32, warp_id = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane_id == 0) scratch[warp_id] = v;
  __syncthreads();
  float total = lane_id < warps ? scratch[lane_id] : 0.0f;
  total = warp_sum(total);
  __syncthreads();
  return total;
}
#endif

// Threads for a kernel that gives one block to each row of D columns: a multiple of 32,
// at most 256, about one thread per 4 columns.
inline unsigned row_block_size(int32_t D) {
  const unsigned threads = unsigned((D / 4 + 31) / 32 * 32);
  return threads < 32 ? 32 : (threads > 256 ? 256 : threads);
}

// Blocks for an element-wise kernel over `count` elements with `threads` per block.
inline unsigned grid_size(int64_t count, unsigned threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return unsigned(blocks < 1 ? 1 : (blocks > 65535 * 32 ? 65535 * 32 : blocks));
}

}  // inline namespace FF_KERNELS_ABI
}  // namespace fastformer::kernels
