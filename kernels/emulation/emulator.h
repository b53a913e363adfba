// The emulated CUDA execution model behind kernels/runtime.h when FF_EMULATION is defined.
//
// A launch runs its grid block after block on the calling OS thread. The threads of a block
// are cooperative fibers: a scheduler runs each one until it reaches a barrier (__syncthreads:
// every thread of the block; a warp operation: the lanes of its mask) or exits, then releases
// the barrier. Everything is deterministic; the order in which threads (and blocks) run between
// barriers is set by set_schedule(), and racecheck() compares a launch sequence under two
// orders. Misuse (a thread leaving while others wait at __syncthreads, a warp operation whose
// lanes never all arrive, a block over 1024 threads, shared memory over the limit) throws
// std::runtime_error naming the kernel, the block and the thread.
//
// Kernel code does not use this header directly: it uses the CUDA names runtime.h maps here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace ff_emu {

// dim3: what gridDim / blockDim / blockIdx / threadIdx are.
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr Dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The indices of the emulated thread that is running.
struct ThreadIndices {
  Dim3 thread_idx, block_idx, block_dim, grid_dim;
};

namespace detail {
// Set by the scheduler while a fiber runs; null on the host.
inline thread_local const ThreadIndices* current_indices = nullptr;
[[noreturn]] void outside_kernel(const char* what);
}  // namespace detail

inline const ThreadIndices& this_thread() {
  const ThreadIndices* indices = detail::current_indices;
  if (indices == nullptr) [[unlikely]]
    detail::outside_kernel("threadIdx/blockIdx/blockDim/gridDim");
  return *indices;
}

// ---- settings (process-wide) -----------------------------------------------------------------

// The order in which the threads of a block run between two barriers, and the blocks of a
// grid run: kForward from thread (block) 0 up, kReverse from the last one down.
enum class Schedule { kForward, kReverse };
void set_schedule(Schedule schedule);
Schedule schedule();

// Static plus dynamic shared memory one block may use, unless the kernel opted in to more
// (ff_set_max_dynamic_shared_memory). CUDA's default is 48 KiB; sm_90 allows 227 KiB opt-in.
inline constexpr std::size_t kDefaultSharedMemoryLimit = 48 * 1024;
inline constexpr std::size_t kMaxOptInSharedMemory = 227 * 1024;
void set_shared_memory_limit(std::size_t bytes);
std::size_t shared_memory_limit();

// ---- race check ------------------------------------------------------------------------------

struct RaceCheckResult {
  bool order_dependent = false;      // the snapshots of the two schedules differ
  std::size_t first_difference = 0;  // byte offset of the first difference
  std::size_t snapshot_bytes = 0;
  std::string message;  // a sentence for a test failure
};

// Runs `run` (a launch sequence that starts from the same inputs each time) under kForward,
// takes `snapshot` (the bytes of its results), runs it again under kReverse, and compares.
// A difference means the results depend on the order of threads or blocks between barriers:
// a missing __syncthreads / __syncwarp, a read of another thread's data before it is written,
// a combine that depends on which block finishes last, or a float atomicAdd (whose rounding
// depends on order on a GPU too; snapshot a rounded view if that is intended). It cannot see
// races whose result is the same in both orders, memory-model subtleties (fences, visibility
// between blocks, non-atomic read-modify-write interleaving inside one statement) or timing.
RaceCheckResult racecheck(const std::function<void()>& run,
                          const std::function<std::vector<std::uint8_t>()>& snapshot);

// ---- streams and launches --------------------------------------------------------------------

// An emulated stream: operations run at once, in the order they are issued, so a stream is an
// ordered queue that is always drained.
struct Stream {
  std::uint64_t operations = 0;  // kernels, copies and memsets run on it so far
};

struct LaunchInfo {
  const char* kernel_name;
  Dim3 grid, block;
  std::size_t dynamic_shared_bytes;
  Stream* stream;  // null: the default stream
};

// Called before each launch runs (tests use it to check launch configurations and order).
void set_launch_observer(std::function<void(const LaunchInfo&)> observer);

namespace detail {
using KernelThunk = void (*)(const void* bound_kernel);
void run_launch(const LaunchInfo& info, std::uintptr_t kernel_key, KernelThunk thunk,
                const void* bound_kernel);
void set_max_dynamic_shared_memory(std::uintptr_t kernel_key, std::size_t bytes);
}  // namespace detail

// FF_LAUNCH in emulation. The arguments are converted to the kernel's parameter types once,
// as a CUDA launch copies them, and each thread calls the kernel with its own copies.
template <class... Params, class... Args>
void launch(const char* kernel_name, void (*kernel)(Params...), Dim3 grid, Dim3 block,
            std::size_t dynamic_shared_bytes, Stream* stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args),
                "FF_LAUNCH: wrong number of kernel arguments");
  struct Bound {
    void (*kernel)(Params...);
    std::tuple<std::decay_t<Params>...> params;
  };
  const Bound bound{kernel, std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)};
  const detail::KernelThunk thunk = [](const void* bound_kernel) {
    const Bound& b = *static_cast<const Bound*>(bound_kernel);
    std::apply(b.kernel, b.params);
  };
  detail::run_launch(LaunchInfo{kernel_name, grid, block, dynamic_shared_bytes, stream},
                     reinterpret_cast<std::uintptr_t>(kernel), thunk, &bound);
}

template <class... Params>
void set_max_dynamic_shared_memory(void (*kernel)(Params...), std::size_t bytes) {
  detail::set_max_dynamic_shared_memory(reinterpret_cast<std::uintptr_t>(kernel), bytes);
}

// ---- inside a kernel -------------------------------------------------------------------------

// One FF_SHARED declaration: its address identifies it, so a declaration inside a device
// function called twice names the same storage, as __shared__ does.
struct SharedSite {
  std::size_t bytes;
  std::size_t alignment;
  const char* name;
};
void* shared_array(const SharedSite& site);  // this block's storage for the declaration
void* dynamic_shared_memory();               // this block's dynamic shared memory

void syncthreads();

enum class WarpOp : std::uint8_t {
  kShflIdx,
  kShflXor,
  kShflDown,
  kShflUp,
  kBallot,
  kAny,
  kAll,
  kSync
};
// Waits until every lane of `mask` that exists in the warp has reached the same operation
// with the same mask, then returns this lane's result.
std::uint64_t warp_op(WarpOp op, unsigned mask, std::uint64_t value, int param, int width);

template <class T>
T warp_shuffle(WarpOp op, unsigned mask, T value, int param, int width) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8,
                "warp shuffles move trivially copyable values of up to 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = warp_op(op, mask, bits, param, width);
  T result;
  std::memcpy(&result, &bits, sizeof(T));
  return result;
}

// A vector load or store of `bytes` at `address` must be aligned to `bytes`, as on a GPU.
void check_vector_alignment(const void* address, std::size_t bytes, const char* what);

}  // namespace ff_emu
