// Launch functions of the emulation layer's test kernels (test_kernels.cu). The same file is
// compiled for the host against the emulator and, where CUDA is present, by nvcc.
#pragma once

#include <cstddef>

#include "kernels/runtime.h"

namespace fastformer::emulation_test {

constexpr int kBlockSumThreads = 256;

// block_sums[b] = sum of input[256 b .. 256 b + 255] (zeros past n): shared memory tree
// reduction; `synchronize` false drops the __syncthreads between its steps (a race).
void launch_block_sum(const float* input, int n, bool synchronize, float* block_sums,
                      ff_stream_t stream);

// For each thread t of one block of `threads` threads (a multiple of 32), with v = lane + 1 +
// 100 * warp, out[k * threads + t] for k = 0..6: xor-reduced sum of v over the warp;
// down-reduced sum (meaningful in lane 0); v of lane 5; v of lane + 1 (__shfl_down by 1);
// v of lane - 2 (__shfl_up by 2); v of lane ^ 1; xor-reduced sum over the lane's group of 8.
// half_out[t] = the ff_half 0.5 * lane broadcast from lane 3.
constexpr int kShuffleKinds = 7;
void launch_warp_shuffles(int threads, int* out, ff_half* half_out, ff_stream_t stream);

// One block of `threads`: ballot / any / all of predicate[t] != 0 over each full warp.
void launch_votes(int threads, const int* predicate, unsigned* ballot, int* any, int* all,
                  ff_stream_t stream);

// Every thread of blocks x threads: atomicAdd(counter, 1), atomicAdd(float_sum, 1.0f),
// atomicMax(max_id, global id), atomicAdd(histogram[global id % 16], 1u).
void launch_atomic_counts(int blocks, int threads, int* counter, float* float_sum, int* max_id,
                          unsigned* histogram, ff_stream_t stream);

// Each block reverses its slice of `input` through dynamic shared memory (blockDim floats,
// then blockDim ints counting the writes) and writes the block's write count to counts[b].
void launch_reverse_in_block(const float* input, int n, int threads, float* output, int* counts,
                             ff_stream_t stream);

// Each thread appends 12 ints: blockIdx, threadIdx, blockDim, gridDim (x, y, z each), at a
// slot it takes with atomicAdd(next_slot, 1).
constexpr int kIndexRecordInts = 12;
void launch_index_records(dim3 grid, dim3 block, int* records, int* next_slot, ff_stream_t stream);

// out[i] = i for i < n, one thread per element.
void launch_fill_linear(int* out, int n, dim3 grid, dim3 block, ff_stream_t stream);
// data[i] = data[i] * scale + offset.
void launch_affine(int* data, int n, int scale, int offset, ff_stream_t stream);

// The order threads ran in: order[k] = global id of the k-th thread to run (atomicAdd slot).
void launch_arrival_order(int blocks, int threads, int* order, int* next_slot, ff_stream_t stream);

// One block of 32: each lane writes input[lane] to shared memory and reads its neighbour's
// (lane + 1) % 32 value, with or without a __syncwarp between.
void launch_warp_neighbour(const int* input, bool synchronize, int* output, ff_stream_t stream);

// One block: *sum += input[t] with a float atomicAdd per thread.
void launch_atomic_float_sum(const float* input, int threads, float* sum, ff_stream_t stream);

// out[0] = whether an FF_SHARED declared in a device function names the same storage in two
// calls; out[1 + t] = the bits of a shared float read before any write.
void launch_shared_identity(int threads, int* out, ff_stream_t stream);

// Copies n_vectors groups of 4 elements through load_float4 / store_float4, starting at
// input + offset (offset not a multiple of 4: a misaligned vector access).
template <class T>
void launch_copy_float4(const T* input, int offset, int n_vectors, T* output, ff_stream_t stream);

// The tensor-core instruction ff_mma_m16n8k16<T> (T = ff_half or ff_bfloat16), one block of
// 32 x problems threads: warp p computes d[p] = a[p] b[p] + c[p] with a [16][16] row-major,
// b [16][8] ([k][n]), c and d [16][8] float. Each lane loads and stores its fragments by the
// PTX ISA's formulas (groupID = lane >> 2, threadID_in_group = lane % 4, element i).
// `mislayout` != kMmaLayoutRight breaks one mapping on purpose, so a test can show that the
// layout test sees it.
enum MmaMislayout : int {
  kMmaLayoutRight = 0,
  kMmaSwapARows = 1,       // a[1] <-> a[2]: row g + 8 taken for columns + 8
  kMmaSwapPairHalves = 2,  // the two elements of a[0] in the other halves of the register
  kMmaSwapBRegisters = 3,  // b[0] <-> b[1]: rows 2t.. taken for rows 2t + 8..
  kMmaSwapDRows = 4,       // d[1] stored where d[2] goes
};
template <class T>
void launch_mma_m16n8k16(int problems, const T* a, const T* b, const float* c, int mislayout,
                         float* d, ff_stream_t stream);

// ---- misuse: each of these must be reported ------------------------------------------------
// Threads >= active return before a __syncthreads the others wait at.
void launch_early_exit(int threads, int active, ff_stream_t stream);
// Lanes 0..15 of each warp call __shfl_xor_sync with a full mask; lanes 16..31 never do.
void launch_partial_warp_shuffle(int* out, ff_stream_t stream);
// Lanes 0..15 call __shfl_xor_sync, lanes 16..31 __ballot_sync, both with a full mask.
void launch_mixed_warp_ops(int* out, ff_stream_t stream);
// 32 KiB of static shared memory (FF_SHARED), one block of 256.
void launch_static_shared_32k(float* out, ff_stream_t stream);
// `dynamic_bytes` of dynamic shared memory, after ff_set_max_dynamic_shared_memory when
// `opt_in`; one block of 32 writes and reads its first and last float.
void launch_big_dynamic(std::size_t dynamic_bytes, bool opt_in, float* out, ff_stream_t stream);

}  // namespace fastformer::emulation_test
