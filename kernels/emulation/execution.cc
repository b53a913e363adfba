// Runs an emulated launch: the grid block after block, each block's threads as fibers that a
// scheduler switches between at barriers. See emulator.h for the model.
//
// A block runs in phases. In a phase the scheduler resumes every runnable thread, in schedule
// order, until it reaches __syncthreads, a warp operation or its end. A warp operation
// completes as soon as the last lane of its mask arrives (its lanes become runnable again in
// the same phase). When no thread can run, the phase ends: if every thread that has not exited
// waits at __syncthreads, they are released into the next phase; anything else is misuse.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/emulation/emulator.h"
#include "kernels/emulation/fiber.h"

namespace ff_emu {
namespace {

constexpr unsigned kWarpSize = 32;
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDimZ = 64;
constexpr unsigned kMaxGridDimYZ = 65535;
// What a lane reads from a lane that does not take part in a shuffle (undefined on a GPU):
// all bits set, a NaN for floats, so a use of it shows.
constexpr std::uint64_t kUndefinedLaneValue = ~std::uint64_t{0};

// ---- settings --------------------------------------------------------------------------------

std::atomic<Schedule> g_schedule{Schedule::kForward};
std::atomic<std::size_t> g_shared_memory_limit{kDefaultSharedMemoryLimit};

struct LaunchSettings {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> max_dynamic_shared;  // per kernel, opted in
  std::function<void(const LaunchInfo&)> observer;
};
LaunchSettings& launch_settings() {
  static LaunchSettings settings;
  return settings;
}

// ---- state of the launch running on this OS thread ------------------------------------------

enum class Status : std::uint8_t { kRunnable, kAtBarrier, kAtWarpOp, kExited, kFailed };

struct EmulatedThread {
  ThreadIndices indices;
  unsigned linear_id = 0;  // x fastest, then y, then z: warp = linear_id / 32
  Status status = Status::kRunnable;
  // The warp operation this thread waits at (kAtWarpOp), then its result.
  WarpOp op = WarpOp::kSync;
  unsigned op_mask = 0;
  int op_param = 0;
  int op_width = 0;
  std::uint64_t op_value = 0;
  std::uint64_t op_result = 0;
  // Why it stopped (kFailed): a misuse found inside the fiber, or an exception of the kernel.
  std::string failure;
  std::exception_ptr exception;
};

struct AlignedDelete {
  std::size_t alignment;
  void operator()(std::byte* p) const { ::operator delete (p, std::align_val_t{alignment}); }
};
using AlignedBytes = std::unique_ptr<std::byte, AlignedDelete>;

// Exactly `bytes` (so ASan sees an overflow), filled with 0xff: shared memory starts out
// undefined on a GPU, and a NaN makes a read before the first write visible.
AlignedBytes allocate_poisoned(std::size_t bytes, std::size_t alignment) {
  alignment = std::max<std::size_t>(alignment, 16);
  auto* p = static_cast<std::byte*>(::operator new (bytes, std::align_val_t{alignment}));
  std::memset(p, 0xff, bytes);
  return AlignedBytes(p, AlignedDelete{alignment});
}

struct SharedAllocation {
  const SharedSite* site;
  AlignedBytes storage;
};

struct Block {
  const LaunchInfo* launch = nullptr;
  detail::KernelThunk thunk = nullptr;
  const void* bound_kernel = nullptr;
  Dim3 block_idx;
  unsigned num_threads = 0;
  std::size_t shared_memory_limit = 0;
  std::size_t static_shared_bytes = 0;
  std::vector<SharedAllocation> shared;  // FF_SHARED declarations reached so far
  AlignedBytes dynamic_shared{nullptr, AlignedDelete{16}};
  unsigned exited_since_barrier = 0;
  unsigned first_exited = 0;
};

struct Emulator {
  std::vector<std::unique_ptr<detail::Fiber>> fibers;  // allocated once, reused
  std::vector<EmulatedThread> threads;
  Block* block = nullptr;
  EmulatedThread* running = nullptr;
};
thread_local Emulator emulator;

// ---- messages --------------------------------------------------------------------------------

std::string to_string(Dim3 d) {
  char text[48];
  std::snprintf(text, sizeof text, "(%u,%u,%u)", d.x, d.y, d.z);
  return text;
}

std::string hex(unsigned mask) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", mask);
  return text;
}

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kShflIdx:
      return "__shfl_sync";
    case WarpOp::kShflXor:
      return "__shfl_xor_sync";
    case WarpOp::kShflDown:
      return "__shfl_down_sync";
    case WarpOp::kShflUp:
      return "__shfl_up_sync";
    case WarpOp::kBallot:
      return "__ballot_sync";
    case WarpOp::kAny:
      return "__any_sync";
    case WarpOp::kAll:
      return "__all_sync";
    case WarpOp::kSync:
      return "__syncwarp";
  }
  return "warp operation";
}

std::string where(const Block& block, const EmulatedThread& thread) {
  return "kernel '" + std::string(block.launch->kernel_name) + "' block " +
         to_string(block.block_idx) + " thread " + to_string(thread.indices.thread_idx);
}

[[noreturn]] void misuse(const Block& block, const EmulatedThread& thread,
                         const std::string& what) {
  throw std::runtime_error(where(block, thread) + ": " + what);
}

// ---- inside a fiber --------------------------------------------------------------------------

EmulatedThread& running_thread(const char* what) {
  if (emulator.running == nullptr) detail::outside_kernel(what);
  return *emulator.running;
}

void suspend(EmulatedThread& self) { emulator.fibers[self.linear_id]->suspend(); }

// A misuse found inside a fiber cannot throw across the fiber switch: the thread stops, and the
// scheduler throws on its own stack. The block's threads are abandoned mid-kernel, their frames
// never unwound, so no string may be alive in them at the switch: `describe` builds the message
// in a statement that ends (destroying its temporaries) before the switch.
template <class Describe>
[[noreturn]] void fail(EmulatedThread& self, const Describe& describe) {
  self.failure = describe();
  self.status = Status::kFailed;
  suspend(self);
  std::abort();  // a failed thread is never resumed
}

void thread_main() {
  EmulatedThread& self = *emulator.running;
  try {
    emulator.block->thunk(emulator.block->bound_kernel);
    self.status = Status::kExited;
  } catch (...) {
    self.exception = std::current_exception();
    self.status = Status::kFailed;
  }
}

// ---- warp operations (on the scheduler's stack) ----------------------------------------------

unsigned lanes_in_warp(const Block& block, unsigned warp) {
  const unsigned lanes = std::min(kWarpSize, block.num_threads - warp * kWarpSize);
  return lanes == kWarpSize ? ~0u : (1u << lanes) - 1;
}

// The lane a shuffle reads; its own lane where CUDA returns the caller's value.
unsigned source_lane(WarpOp op, unsigned lane, int param, int width) {
  const auto w = static_cast<unsigned>(width);
  const unsigned segment = lane & ~(w - 1);
  const auto p = static_cast<unsigned>(param);
  switch (op) {
    case WarpOp::kShflIdx:
      return segment + (p & (w - 1));
    case WarpOp::kShflXor:
      return (lane ^ p) >= segment + w ? lane : lane ^ p;
    case WarpOp::kShflDown:
      return p >= segment + w - lane ? lane : lane + p;
    case WarpOp::kShflUp:
      return p > lane - segment ? lane : lane - p;
    default:
      return lane;
  }
}

// Called when `arrived` reaches a warp operation: completes it if every participating lane
// (its mask, less lanes past the end of the block) is there with the same mask.
void complete_warp_op_if_ready(Block& block, EmulatedThread& arrived) {
  std::vector<EmulatedThread>& threads = emulator.threads;
  const unsigned warp = arrived.linear_id / kWarpSize;
  const unsigned base = warp * kWarpSize;
  const unsigned participants = arrived.op_mask & lanes_in_warp(block, warp);
  for (unsigned lanes = participants; lanes != 0; lanes &= lanes - 1) {
    const EmulatedThread& t = threads[base + std::countr_zero(lanes)];
    if (t.status != Status::kAtWarpOp || t.op_mask != arrived.op_mask) return;
  }
  std::uint64_t votes = 0;
  for (unsigned lanes = participants; lanes != 0; lanes &= lanes - 1) {
    const unsigned lane = std::countr_zero(lanes);
    const EmulatedThread& t = threads[base + lane];
    if (t.op != arrived.op) {
      misuse(block, t,
             std::string("lanes of warp ") + std::to_string(warp) +
                 " call different warp operations with mask " + hex(arrived.op_mask) + ": " +
                 op_name(t.op) + " here, " + op_name(arrived.op) + " in thread " +
                 to_string(arrived.indices.thread_idx));
    }
    if (t.op_value != 0) votes |= std::uint64_t{1} << lane;
  }
  for (unsigned lanes = participants; lanes != 0; lanes &= lanes - 1) {
    const unsigned lane = std::countr_zero(lanes);
    EmulatedThread& t = threads[base + lane];
    switch (t.op) {
      case WarpOp::kSync:
        t.op_result = 0;
        break;
      case WarpOp::kBallot:
        t.op_result = votes;
        break;
      case WarpOp::kAny:
        t.op_result = votes != 0;
        break;
      case WarpOp::kAll:
        t.op_result = votes == participants;
        break;
      default: {
        const unsigned source = source_lane(t.op, lane, t.op_param, t.op_width);
        t.op_result = source == lane                  ? t.op_value
                      : (participants >> source) & 1u ? threads[base + source].op_value
                                                      : kUndefinedLaneValue;
      }
    }
    t.status = Status::kRunnable;
  }
}

std::string describe_wait(const EmulatedThread& t) {
  switch (t.status) {
    case Status::kExited:
      return "has exited";
    case Status::kAtBarrier:
      return "waits at __syncthreads";
    case Status::kAtWarpOp:
      return std::string("waits at ") + op_name(t.op) + " with mask " + hex(t.op_mask);
    default:
      return "is running";
  }
}

[[noreturn]] void warp_op_deadlock(const Block& block, const EmulatedThread& waiting) {
  const unsigned warp = waiting.linear_id / kWarpSize;
  const unsigned participants = waiting.op_mask & lanes_in_warp(block, warp);
  for (unsigned lanes = participants; lanes != 0; lanes &= lanes - 1) {
    const unsigned lane = std::countr_zero(lanes);
    const EmulatedThread& t = emulator.threads[warp * kWarpSize + lane];
    if (t.status != Status::kAtWarpOp || t.op_mask != waiting.op_mask) {
      misuse(block, waiting,
             std::string(op_name(waiting.op)) + " with mask " + hex(waiting.op_mask) +
                 " waits for lane " + std::to_string(lane) + " (thread " +
                 to_string(t.indices.thread_idx) + "), which " + describe_wait(t) +
                 "; every lane named in the mask must reach the same warp operation");
    }
  }
  misuse(block, waiting, "warp operation cannot complete");
}

// ---- one block -------------------------------------------------------------------------------

[[noreturn]] void report_failure(const Block& block, const EmulatedThread& t) {
  if (!t.exception) misuse(block, t, t.failure);
  try {
    std::rethrow_exception(t.exception);
  } catch (const std::exception& e) {
    misuse(block, t, std::string("threw: ") + e.what());
  } catch (...) {
    misuse(block, t, "threw an exception");
  }
}

void run_block(Block& block, bool reverse) {
  const Dim3 dim = block.launch->block;
  std::vector<EmulatedThread>& threads = emulator.threads;
  for (unsigned id = 0; id < block.num_threads; ++id) {
    EmulatedThread& t = threads[id];
    t.indices = ThreadIndices{Dim3(id % dim.x, id / dim.x % dim.y, id / (dim.x * dim.y)),
                              block.block_idx, dim, block.launch->grid};
    t.linear_id = id;
    t.status = Status::kRunnable;
    t.failure.clear();
    t.exception = nullptr;
    emulator.fibers[id]->start(&thread_main);
  }
  for (;;) {
    bool ran = false;
    for (unsigned i = 0; i < block.num_threads; ++i) {
      EmulatedThread& t = threads[reverse ? block.num_threads - 1 - i : i];
      if (t.status != Status::kRunnable) continue;
      ran = true;
      emulator.running = &t;
      detail::current_indices = &t.indices;
      emulator.fibers[t.linear_id]->resume();
      emulator.running = nullptr;
      detail::current_indices = nullptr;
      switch (t.status) {
        case Status::kFailed:
          report_failure(block, t);
        case Status::kAtWarpOp:
          complete_warp_op_if_ready(block, t);
          break;
        case Status::kExited:
          if (block.exited_since_barrier++ == 0) block.first_exited = t.linear_id;
          break;
        default:
          break;
      }
    }
    if (ran) continue;

    // No thread can run: the phase ends.
    const EmulatedThread* at_barrier = nullptr;
    unsigned waiting = 0;
    for (unsigned id = 0; id < block.num_threads; ++id) {
      const EmulatedThread& t = threads[id];
      if (t.status == Status::kAtWarpOp) warp_op_deadlock(block, t);
      if (t.status == Status::kAtBarrier) {
        if (at_barrier == nullptr) at_barrier = &t;
        ++waiting;
      }
    }
    if (at_barrier == nullptr) return;  // every thread has exited
    if (block.exited_since_barrier > 0) {
      misuse(block, threads[block.first_exited],
             "exited while " + std::to_string(waiting) +
                 " threads wait at __syncthreads (the first: thread " +
                 to_string(at_barrier->indices.thread_idx) +
                 "); every thread of a block must reach each __syncthreads");
    }
    for (unsigned id = 0; id < block.num_threads; ++id) threads[id].status = Status::kRunnable;
  }
}

void check_configuration(const LaunchInfo& info, std::size_t shared_memory_limit) {
  const auto reject = [&](const std::string& what) {
    throw std::runtime_error("kernel '" + std::string(info.kernel_name) + "': " + what);
  };
  const Dim3 g = info.grid, b = info.block;
  const std::uint64_t threads = std::uint64_t{b.x} * b.y * b.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock || b.z > kMaxBlockDimZ) {
    reject("blockDim " + to_string(b) + " has " + std::to_string(threads) +
           " threads; a block has 1 to 1024 threads and blockDim.z is at most 64");
  }
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > kMaxGridDimYZ ||
      g.z > kMaxGridDimYZ) {
    reject("gridDim " + to_string(g) + " is out of range (x 1..2^31-1, y and z 1..65535)");
  }
  if (info.dynamic_shared_bytes > shared_memory_limit) {
    reject(std::to_string(info.dynamic_shared_bytes) +
           " bytes of dynamic shared memory exceed the limit of " +
           std::to_string(shared_memory_limit) +
           " bytes (ff_set_max_dynamic_shared_memory to opt in)");
  }
}

}  // namespace

// ---- settings --------------------------------------------------------------------------------

void set_schedule(Schedule schedule) { g_schedule.store(schedule); }
Schedule schedule() { return g_schedule.load(); }

void set_shared_memory_limit(std::size_t bytes) { g_shared_memory_limit.store(bytes); }
std::size_t shared_memory_limit() { return g_shared_memory_limit.load(); }

void set_launch_observer(std::function<void(const LaunchInfo&)> observer) {
  LaunchSettings& settings = launch_settings();
  const std::lock_guard lock(settings.mutex);
  settings.observer = std::move(observer);
}

namespace detail {

void outside_kernel(const char* what) {
  throw std::logic_error(std::string(what) +
                         " used outside a kernel: no emulated thread is running");
}

void set_max_dynamic_shared_memory(std::uintptr_t kernel_key, std::size_t bytes) {
  if (bytes > kMaxOptInSharedMemory) {
    throw std::runtime_error("ff_set_max_dynamic_shared_memory: " + std::to_string(bytes) +
                             " bytes exceed the 227 KiB a block can have");
  }
  LaunchSettings& settings = launch_settings();
  const std::lock_guard lock(settings.mutex);
  settings.max_dynamic_shared[kernel_key] = bytes;
}

void run_launch(const LaunchInfo& launch_info, std::uintptr_t kernel_key, KernelThunk thunk,
                const void* bound_kernel) {
  if (emulator.running != nullptr) {
    fail(*emulator.running,
         [] { return std::string("a kernel cannot launch kernels in emulation"); });
  }
  // FF_LAUNCH((kernel<float, 4>), ...) names the kernel in parentheses: drop them.
  LaunchInfo info = launch_info;
  const std::string_view written = info.kernel_name;
  const std::string name(written.size() >= 2 && written.front() == '(' && written.back() == ')'
                             ? written.substr(1, written.size() - 2)
                             : written);
  info.kernel_name = name.c_str();
  std::size_t limit = g_shared_memory_limit.load();
  std::function<void(const LaunchInfo&)> observer;
  {
    LaunchSettings& settings = launch_settings();
    const std::lock_guard lock(settings.mutex);
    if (const auto it = settings.max_dynamic_shared.find(kernel_key);
        it != settings.max_dynamic_shared.end()) {
      limit = std::max(limit, it->second);
    }
    observer = settings.observer;
  }
  check_configuration(info, limit);
  if (observer) observer(info);

  Block block;
  block.launch = &info;
  block.thunk = thunk;
  block.bound_kernel = bound_kernel;
  block.num_threads = info.block.x * info.block.y * info.block.z;
  block.shared_memory_limit = limit;
  while (emulator.fibers.size() < block.num_threads)
    emulator.fibers.push_back(std::make_unique<Fiber>());
  if (emulator.threads.size() < block.num_threads) emulator.threads.resize(block.num_threads);

  struct Reset {
    ~Reset() { emulator.block = nullptr; }
  } reset;
  emulator.block = &block;
  const bool reverse = g_schedule.load() == Schedule::kReverse;
  const std::uint64_t blocks = std::uint64_t{info.grid.x} * info.grid.y * info.grid.z;
  for (std::uint64_t i = 0; i < blocks; ++i) {
    const std::uint64_t b = reverse ? blocks - 1 - i : i;
    block.block_idx = Dim3(static_cast<unsigned>(b % info.grid.x),
                           static_cast<unsigned>(b / info.grid.x % info.grid.y),
                           static_cast<unsigned>(b / (std::uint64_t{info.grid.x} * info.grid.y)));
    block.static_shared_bytes = 0;
    block.shared.clear();
    block.dynamic_shared = allocate_poisoned(info.dynamic_shared_bytes, 16);
    block.exited_since_barrier = 0;
    run_block(block, reverse);
  }
  if (info.stream != nullptr) ++info.stream->operations;
}

}  // namespace detail

// ---- called by kernels -----------------------------------------------------------------------

void syncthreads() {
  EmulatedThread& self = running_thread("__syncthreads");
  self.status = Status::kAtBarrier;
  suspend(self);
}

std::uint64_t warp_op(WarpOp op, unsigned mask, std::uint64_t value, int param, int width) {
  EmulatedThread& self = running_thread(op_name(op));
  const unsigned lane = self.linear_id % kWarpSize;
  if (width < 1 || width > static_cast<int>(kWarpSize) ||
      !std::has_single_bit(static_cast<unsigned>(width))) {
    fail(self, [&] {
      return std::string(op_name(op)) + ": width " + std::to_string(width) +
             " is not a power of two up to 32";
    });
  }
  if (((mask >> lane) & 1u) == 0) {
    fail(self, [&] {
      return std::string(op_name(op)) + ": mask " + hex(mask) + " does not name the calling lane " +
             std::to_string(lane);
    });
  }
  self.op = op;
  self.op_mask = mask;
  self.op_value = value;
  self.op_param = param;
  self.op_width = width;
  self.status = Status::kAtWarpOp;
  suspend(self);
  return self.op_result;
}

void* shared_array(const SharedSite& site) {
  EmulatedThread& self = running_thread("FF_SHARED");
  Block& block = *emulator.block;
  for (const SharedAllocation& allocation : block.shared) {
    if (allocation.site == &site) return allocation.storage.get();
  }
  // The first thread of the block to reach the declaration allocates it.
  const std::size_t static_bytes = block.static_shared_bytes + site.bytes;
  if (static_bytes + block.launch->dynamic_shared_bytes > block.shared_memory_limit) {
    fail(self, [&] {
      return "FF_SHARED(" + std::string(site.name) + ") brings static shared memory to " +
             std::to_string(static_bytes) + " bytes, which with " +
             std::to_string(block.launch->dynamic_shared_bytes) +
             " dynamic bytes exceeds the limit of " + std::to_string(block.shared_memory_limit) +
             " bytes";
    });
  }
  block.static_shared_bytes = static_bytes;
  block.shared.push_back(SharedAllocation{&site, allocate_poisoned(site.bytes, site.alignment)});
  return block.shared.back().storage.get();
}

void* dynamic_shared_memory() {
  running_thread("FF_DYNAMIC_SHARED");
  return emulator.block->dynamic_shared.get();
}

void check_vector_alignment(const void* address, std::size_t bytes, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(address) % bytes == 0) return;
  const auto describe = [&] {
    char text[160];
    std::snprintf(text, sizeof text,
                  "%s: address %p is not aligned to %zu bytes (a GPU faults on it)", what, address,
                  bytes);
    return std::string(text);
  };
  if (emulator.running != nullptr) fail(*emulator.running, describe);
  throw std::runtime_error(describe());
}

}  // namespace ff_emu
