// Kernels that exercise the execution model for the emulation layer's tests: block reduction,
// warp shuffles and votes, atomics, dynamic shared memory, 2D/3D indices, deliberate races and
// deliberate misuse. Written once, through kernels/runtime.h: compiled for the host against
// the emulator, and by nvcc (fastformer_emulation_nvcc_check) so they stay valid CUDA.
#include <cstdint>
#include <cstring>

#include "tests/emulation/test_kernels.h"

namespace fastformer::emulation_test {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

FF_GLOBAL void block_sum_kernel(const float* input, int n, bool synchronize, float* block_sums) {
  FF_SHARED(float, partial, kBlockSumThreads);
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  partial[threadIdx.x] = i < static_cast<unsigned>(n) ? input[i] : 0.0f;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    // Without this barrier a thread reads partial[threadIdx.x + stride] before its owner has
    // added into it.
    if (synchronize) __syncthreads();
  }
  if (threadIdx.x == 0) block_sums[blockIdx.x] = partial[0];
}

FF_GLOBAL void warp_shuffle_kernel(int* out, ff_half* half_out) {
  const int t = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const int lane = t % warpSize;
  const int v = lane + 1 + 100 * (t / warpSize);

  int xor_sum = v;
  for (int mask = 16; mask > 0; mask /= 2) xor_sum += __shfl_xor_sync(kFullMask, xor_sum, mask);
  int down_sum = v;
  for (unsigned delta = 16; delta > 0; delta /= 2)
    down_sum += __shfl_down_sync(kFullMask, down_sum, delta);
  int group_sum = v;
  for (int mask = 4; mask > 0; mask /= 2)
    group_sum += __shfl_xor_sync(kFullMask, group_sum, mask, 8);

  out[0 * threads + t] = xor_sum;
  out[1 * threads + t] = down_sum;
  out[2 * threads + t] = __shfl_sync(kFullMask, v, 5);
  out[3 * threads + t] = __shfl_down_sync(kFullMask, v, 1);
  out[4 * threads + t] = __shfl_up_sync(kFullMask, v, 2);
  out[5 * threads + t] = __shfl_xor_sync(kFullMask, v, 1);
  out[6 * threads + t] = group_sum;
  half_out[t] = __shfl_sync(kFullMask, from_float<ff_half>(0.5f * static_cast<float>(lane)), 3);
}

FF_GLOBAL void vote_kernel(const int* predicate, unsigned* ballot, int* any, int* all) {
  const int p = predicate[threadIdx.x];
  ballot[threadIdx.x] = __ballot_sync(kFullMask, p);
  any[threadIdx.x] = __any_sync(kFullMask, p);
  all[threadIdx.x] = __all_sync(kFullMask, p);
}

FF_GLOBAL void atomic_count_kernel(int* counter, float* float_sum, int* max_id,
                                   unsigned* histogram) {
  const int id = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  atomicAdd(counter, 1);
  atomicAdd(float_sum, 1.0f);
  atomicMax(max_id, id);
  atomicAdd(&histogram[id % 16], 1u);
}

FF_GLOBAL void reverse_in_block_kernel(const float* input, int n, float* output, int* counts) {
  FF_DYNAMIC_SHARED(float, values);
  int* writes = reinterpret_cast<int*>(values + blockDim.x);  // the second part of the layout
  const unsigned t = threadIdx.x;
  const unsigned base = blockIdx.x * blockDim.x;
  if (t == 0) writes[0] = 0;
  values[t] = base + t < static_cast<unsigned>(n) ? input[base + t] : 0.0f;
  __syncthreads();
  atomicAdd(&writes[0], 1);
  const unsigned mirrored = blockDim.x - 1 - t;
  if (base + t < static_cast<unsigned>(n)) output[base + t] = values[mirrored];
  __syncthreads();
  if (t == 0) counts[blockIdx.x] = writes[0];
}

FF_GLOBAL void index_record_kernel(int* records, int* next_slot) {
  int* r = records + kIndexRecordInts * atomicAdd(next_slot, 1);
  const unsigned values[kIndexRecordInts] = {blockIdx.x,  blockIdx.y,  blockIdx.z, threadIdx.x,
                                             threadIdx.y, threadIdx.z, blockDim.x, blockDim.y,
                                             blockDim.z,  gridDim.x,   gridDim.y,  gridDim.z};
  for (int k = 0; k < kIndexRecordInts; ++k) r[k] = static_cast<int>(values[k]);
}

FF_GLOBAL void fill_linear_kernel(int* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = i;
}

FF_GLOBAL void affine_kernel(int* data, int n, int scale, int offset) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) data[i] = data[i] * scale + offset;
}

FF_GLOBAL void arrival_order_kernel(int* order, int* next_slot) {
  order[atomicAdd(next_slot, 1)] = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
}

FF_GLOBAL void warp_neighbour_kernel(const int* input, bool synchronize, int* output) {
  FF_SHARED(int, lane_values, 32);
  const unsigned lane = threadIdx.x;
  lane_values[lane] = input[lane];
  if (synchronize) __syncwarp();
  output[lane] = lane_values[(lane + 1) % 32];
}

FF_GLOBAL void atomic_float_sum_kernel(const float* input, float* sum) {
  atomicAdd(sum, input[threadIdx.x]);
}

FF_DEVICE float* block_scratch() {
  FF_SHARED(float, scratch, 32);
  return scratch;
}

FF_GLOBAL void shared_identity_kernel(int* out) {
  FF_SHARED(float, never_written, 64);
  if (threadIdx.x == 0) out[0] = block_scratch() == block_scratch();
  out[1 + threadIdx.x] = __float_as_int(never_written[threadIdx.x]);
}

template <class T>
FF_GLOBAL void copy_float4_kernel(const T* input, int n_vectors, T* output) {
  const int v = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (v < n_vectors) store_float4(output + 4 * v, load_float4(input + 4 * v));
}

FF_GLOBAL void early_exit_kernel(int active) {
  if (static_cast<int>(threadIdx.x) >= active) return;
  __syncthreads();
}

FF_GLOBAL void partial_warp_shuffle_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x) % warpSize;
  if (lane < 16) out[threadIdx.x] = __shfl_xor_sync(kFullMask, lane, 1);
}

FF_GLOBAL void mixed_warp_ops_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x) % warpSize;
  if (lane < 16) {
    out[threadIdx.x] = __shfl_xor_sync(kFullMask, lane, 1);
  } else {
    out[threadIdx.x] = static_cast<int>(__ballot_sync(kFullMask, 1));
  }
}

FF_GLOBAL void static_shared_32k_kernel(float* out) {
  FF_SHARED(float, big, 8192);
  for (unsigned i = threadIdx.x; i < 8192; i += blockDim.x) big[i] = static_cast<float>(i);
  __syncthreads();
  out[threadIdx.x] = big[8191 - threadIdx.x];
}

FF_GLOBAL void big_dynamic_kernel(int n_floats, float* out) {
  FF_DYNAMIC_SHARED(float, values);
  if (threadIdx.x == 0) values[0] = 1.0f;
  if (threadIdx.x == 1) values[n_floats - 1] = 2.0f;
  __syncthreads();
  if (threadIdx.x == 0) {
    out[0] = values[0];
    out[1] = values[n_floats - 1];
  }
}

template <class T>
FF_DEVICE std::uint32_t mma_pair(T low, T high) {
  std::uint16_t lo, hi;
  memcpy(&lo, &low, 2);
  memcpy(&hi, &high, 2);
  return std::uint32_t(lo) | (std::uint32_t(hi) << 16);
}

// The fragments by the PTX ISA's formulas ("Matrix Fragments for mma.m16n8k16 with floating
// point type"), element by element.
template <class T>
FF_GLOBAL void mma_kernel(const T* a, const T* b, const float* c, int mislayout, float* d) {
  const int problem = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group_id = lane >> 2, thread_in_group = lane % 4;
  a += problem * 16 * 16;
  b += problem * 16 * 8;
  c += problem * 16 * 8;
  d += problem * 16 * 8;
  T a_elements[8], b_elements[4];
  for (int i = 0; i < 8; ++i) {
    const int row = (i < 2 || (i >= 4 && i < 6)) ? group_id : group_id + 8;
    const int col = thread_in_group * 2 + (i & 1) + (i >= 4 ? 8 : 0);
    a_elements[i] = a[row * 16 + col];
  }
  for (int i = 0; i < 4; ++i) {
    const int row = thread_in_group * 2 + (i & 1) + (i >= 2 ? 8 : 0);
    b_elements[i] = b[row * 8 + group_id];
  }
  float c_elements[4];
  for (int i = 0; i < 4; ++i) {
    const int row = i < 2 ? group_id : group_id + 8;
    c_elements[i] = c[row * 8 + thread_in_group * 2 + (i & 1)];
  }
  std::uint32_t a_regs[4] = {
      mma_pair(a_elements[0], a_elements[1]), mma_pair(a_elements[2], a_elements[3]),
      mma_pair(a_elements[4], a_elements[5]), mma_pair(a_elements[6], a_elements[7])};
  std::uint32_t b_regs[2] = {mma_pair(b_elements[0], b_elements[1]),
                             mma_pair(b_elements[2], b_elements[3])};
  if (mislayout == kMmaSwapARows) {
    const std::uint32_t r = a_regs[1];
    a_regs[1] = a_regs[2];
    a_regs[2] = r;
  } else if (mislayout == kMmaSwapPairHalves) {
    a_regs[0] = (a_regs[0] >> 16) | (a_regs[0] << 16);
  } else if (mislayout == kMmaSwapBRegisters) {
    const std::uint32_t r = b_regs[0];
    b_regs[0] = b_regs[1];
    b_regs[1] = r;
  }
  float d_elements[4];
  ff_mma_m16n8k16<T>(d_elements, a_regs, b_regs, c_elements);
  if (mislayout == kMmaSwapDRows) {
    const float r = d_elements[1];
    d_elements[1] = d_elements[2];
    d_elements[2] = r;
  }
  for (int i = 0; i < 4; ++i) {
    const int row = i < 2 ? group_id : group_id + 8;
    d[row * 8 + thread_in_group * 2 + (i & 1)] = d_elements[i];
  }
}

unsigned blocks_for(int n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace

void launch_block_sum(const float* input, int n, bool synchronize, float* block_sums,
                      ff_stream_t stream) {
  FF_LAUNCH(block_sum_kernel, blocks_for(n, kBlockSumThreads), kBlockSumThreads, 0, stream, input,
            n, synchronize, block_sums);
  ff_check_launch("block_sum_kernel");
}

void launch_warp_shuffles(int threads, int* out, ff_half* half_out, ff_stream_t stream) {
  FF_LAUNCH(warp_shuffle_kernel, 1, threads, 0, stream, out, half_out);
  ff_check_launch("warp_shuffle_kernel");
}

void launch_votes(int threads, const int* predicate, unsigned* ballot, int* any, int* all,
                  ff_stream_t stream) {
  FF_LAUNCH(vote_kernel, 1, threads, 0, stream, predicate, ballot, any, all);
  ff_check_launch("vote_kernel");
}

void launch_atomic_counts(int blocks, int threads, int* counter, float* float_sum, int* max_id,
                          unsigned* histogram, ff_stream_t stream) {
  FF_LAUNCH(atomic_count_kernel, blocks, threads, 0, stream, counter, float_sum, max_id, histogram);
  ff_check_launch("atomic_count_kernel");
}

void launch_reverse_in_block(const float* input, int n, int threads, float* output, int* counts,
                             ff_stream_t stream) {
  const std::size_t shared_bytes =
      static_cast<std::size_t>(threads) * (sizeof(float) + sizeof(int));
  FF_LAUNCH(reverse_in_block_kernel, blocks_for(n, threads), threads, shared_bytes, stream, input,
            n, output, counts);
  ff_check_launch("reverse_in_block_kernel");
}

void launch_index_records(dim3 grid, dim3 block, int* records, int* next_slot, ff_stream_t stream) {
  FF_LAUNCH(index_record_kernel, grid, block, 0, stream, records, next_slot);
  ff_check_launch("index_record_kernel");
}

void launch_fill_linear(int* out, int n, dim3 grid, dim3 block, ff_stream_t stream) {
  FF_LAUNCH(fill_linear_kernel, grid, block, 0, stream, out, n);
  ff_check_launch("fill_linear_kernel");
}

void launch_affine(int* data, int n, int scale, int offset, ff_stream_t stream) {
  FF_LAUNCH(affine_kernel, blocks_for(n, 128), 128, 0, stream, data, n, scale, offset);
  ff_check_launch("affine_kernel");
}

void launch_arrival_order(int blocks, int threads, int* order, int* next_slot, ff_stream_t stream) {
  FF_LAUNCH(arrival_order_kernel, blocks, threads, 0, stream, order, next_slot);
  ff_check_launch("arrival_order_kernel");
}

void launch_warp_neighbour(const int* input, bool synchronize, int* output, ff_stream_t stream) {
  FF_LAUNCH(warp_neighbour_kernel, 1, 32, 0, stream, input, synchronize, output);
  ff_check_launch("warp_neighbour_kernel");
}

void launch_atomic_float_sum(const float* input, int threads, float* sum, ff_stream_t stream) {
  FF_LAUNCH(atomic_float_sum_kernel, 1, threads, 0, stream, input, sum);
  ff_check_launch("atomic_float_sum_kernel");
}

void launch_shared_identity(int threads, int* out, ff_stream_t stream) {
  FF_LAUNCH(shared_identity_kernel, 1, threads, 0, stream, out);
  ff_check_launch("shared_identity_kernel");
}

template <class T>
void launch_copy_float4(const T* input, int offset, int n_vectors, T* output, ff_stream_t stream) {
  FF_LAUNCH((copy_float4_kernel<T>), blocks_for(n_vectors, 64), 64, 0, stream, input + offset,
            n_vectors, output);
  ff_check_launch("copy_float4_kernel");
}
template void launch_copy_float4<float>(const float*, int, int, float*, ff_stream_t);
template void launch_copy_float4<ff_half>(const ff_half*, int, int, ff_half*, ff_stream_t);
template void launch_copy_float4<ff_bfloat16>(const ff_bfloat16*, int, int, ff_bfloat16*,
                                              ff_stream_t);

void launch_early_exit(int threads, int active, ff_stream_t stream) {
  FF_LAUNCH(early_exit_kernel, 1, threads, 0, stream, active);
  ff_check_launch("early_exit_kernel");
}

void launch_partial_warp_shuffle(int* out, ff_stream_t stream) {
  FF_LAUNCH(partial_warp_shuffle_kernel, 1, 64, 0, stream, out);
  ff_check_launch("partial_warp_shuffle_kernel");
}

void launch_mixed_warp_ops(int* out, ff_stream_t stream) {
  FF_LAUNCH(mixed_warp_ops_kernel, 1, 32, 0, stream, out);
  ff_check_launch("mixed_warp_ops_kernel");
}

void launch_static_shared_32k(float* out, ff_stream_t stream) {
  FF_LAUNCH(static_shared_32k_kernel, 1, 256, 0, stream, out);
  ff_check_launch("static_shared_32k_kernel");
}

template <class T>
void launch_mma_m16n8k16(int problems, const T* a, const T* b, const float* c, int mislayout,
                         float* d, ff_stream_t stream) {
  FF_LAUNCH(mma_kernel<T>, 1, 32 * problems, 0, stream, a, b, c, mislayout, d);
  ff_check_launch("mma_kernel");
}
template void launch_mma_m16n8k16<ff_half>(int, const ff_half*, const ff_half*, const float*, int,
                                           float*, ff_stream_t);
template void launch_mma_m16n8k16<ff_bfloat16>(int, const ff_bfloat16*, const ff_bfloat16*,
                                               const float*, int, float*, ff_stream_t);

void launch_big_dynamic(std::size_t dynamic_bytes, bool opt_in, float* out, ff_stream_t stream) {
  if (opt_in) ff_set_max_dynamic_shared_memory(big_dynamic_kernel, dynamic_bytes);
  const int n_floats = static_cast<int>(dynamic_bytes / sizeof(float));
  FF_LAUNCH(big_dynamic_kernel, 1, 32, dynamic_bytes, stream, n_floats, out);
  ff_check_launch("big_dynamic_kernel");
}

}  // namespace fastformer::emulation_test
