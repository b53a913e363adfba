#include "kernels/emulation/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define FF_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FF_EMU_ASAN 1
#endif
#endif
#if defined(FF_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__SANITIZE_THREAD__)
#define FF_EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FF_EMU_TSAN 1
#endif
#endif
#if defined(FF_EMU_TSAN)
#include <sanitizer/tsan_interface.h>
// ThreadSanitizer keeps a shadow call stack per fiber. Fiber::entry never returns (it switches
// away from inside exit_to_scheduler), so if it were instrumented each run of a fiber would
// leave two frames on that stack, and a stack reused for millions of emulated threads would
// overflow it. These two functions touch no shared memory.
#if defined(__clang__)
#define FF_EMU_NO_TSAN_FRAMES __attribute__((disable_sanitizer_instrumentation))
#else
#define FF_EMU_NO_TSAN_FRAMES __attribute__((no_sanitize_thread))
#endif
#else
#define FF_EMU_NO_TSAN_FRAMES
#endif

#if defined(FF_EMU_FIBER_ASM)
// ff_emu_switch_context(save, load): pushes the callee-saved registers and the MXCSR / x87
// control words on the current stack, stores the stack pointer in *save, switches to `load`
// and pops the same from there. A new fiber's stack is laid out as if it had switched away
// just before entering Fiber::entry (see Fiber::start).
extern "C" void ff_emu_switch_context(void** save, void* load);
asm(R"(
  .text
  .globl ff_emu_switch_context
  .hidden ff_emu_switch_context
  .type ff_emu_switch_context, @function
  .p2align 4
ff_emu_switch_context:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ff_emu_switch_context, .-ff_emu_switch_context
)");
#endif

namespace ff_emu::detail {
namespace {

#if defined(FF_EMU_ASAN)
constexpr std::size_t kStackBytes = 256 * 1024;  // ASan's redzones make frames larger
#else
constexpr std::size_t kStackBytes = 128 * 1024;
#endif

// Per OS thread: the scheduler's side of the switches.
struct SchedulerSide {
#if defined(FF_EMU_FIBER_ASM)
  void* saved_stack_pointer;
#else
  ucontext_t context;
#endif
  Fiber* running;
  const void* asan_stack_bottom;  // the OS thread's own stack, for the switch back
  std::size_t asan_stack_bytes;
  void* tsan_fiber;  // ThreadSanitizer's context of the OS thread, for the switch back
};
thread_local SchedulerSide scheduler{};

}  // namespace

Fiber::Fiber() {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  mapping_bytes_ = kStackBytes + page;
  mapping_ = mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (mapping_ == MAP_FAILED) throw std::bad_alloc();
  // Stacks grow down: the lowest page is the guard.
  if (mprotect(mapping_, page, PROT_NONE) != 0) {
    munmap(mapping_, mapping_bytes_);
    throw std::bad_alloc();
  }
  stack_ = static_cast<char*>(mapping_) + page;
  stack_bytes_ = kStackBytes;
#if !defined(FF_EMU_FIBER_ASM)
  // Once: getcontext costs a system call, and makecontext can reuse the saved state.
  if (getcontext(&context_) != 0) std::abort();
#endif
#if defined(FF_EMU_TSAN)
  tsan_fiber_ = __tsan_create_fiber(0);
#endif
}

Fiber::~Fiber() {
#if defined(FF_EMU_TSAN)
  __tsan_destroy_fiber(tsan_fiber_);
#endif
  munmap(mapping_, mapping_bytes_);
}

void Fiber::start(void (*body)()) {
#if defined(FF_EMU_ASAN)
  // A fiber abandoned mid-kernel leaves its frames' redzones poisoned; the next thread's
  // frames at the same addresses must not trip over them.
  if (!finished_) __asan_unpoison_memory_region(stack_, stack_bytes_);
#endif
#if defined(FF_EMU_TSAN)
  // Likewise ThreadSanitizer's shadow call stack still holds the abandoned frames: start over.
  if (!finished_) {
    __tsan_destroy_fiber(tsan_fiber_);
    tsan_fiber_ = __tsan_create_fiber(0);
  }
#endif
  body_ = body;
  finished_ = false;
  asan_fake_stack_ = nullptr;
#if defined(FF_EMU_FIBER_ASM)
  // From the 16-byte aligned top down: a null return address for Fiber::entry's frame, the
  // address ff_emu_switch_context returns to (Fiber::entry), six zeroed callee-saved
  // registers, then the default MXCSR (0x1f80) and x87 control word (0x037f).
  const auto top = (reinterpret_cast<std::uintptr_t>(stack_) + stack_bytes_) & ~std::uintptr_t{15};
  auto* slots = reinterpret_cast<std::uint64_t*>(top) - 9;
  slots[0] = 0x1f80 | (std::uint64_t{0x037f} << 32);
  for (int i = 1; i <= 6; ++i) slots[i] = 0;
  slots[7] = reinterpret_cast<std::uint64_t>(&Fiber::entry);
  slots[8] = 0;
  saved_stack_pointer_ = slots;
#else
  context_.uc_stack.ss_sp = stack_;
  context_.uc_stack.ss_size = stack_bytes_;
  context_.uc_link = nullptr;
  makecontext(&context_, &Fiber::entry, 0);
#endif
}

void Fiber::resume() {
  scheduler.running = this;
#if defined(FF_EMU_ASAN)
  void* scheduler_fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&scheduler_fake_stack, stack_, stack_bytes_);
#endif
#if defined(FF_EMU_TSAN)
  // Flags 0: the switch synchronizes (the emulated threads of a block take turns on one OS
  // thread; the emulator's racecheck, not TSan, looks for races between them).
  scheduler.tsan_fiber = __tsan_get_current_fiber();
  __tsan_switch_to_fiber(tsan_fiber_, 0);
#endif
#if defined(FF_EMU_FIBER_ASM)
  ff_emu_switch_context(&scheduler.saved_stack_pointer, saved_stack_pointer_);
#else
  if (swapcontext(&scheduler.context, &context_) != 0) std::abort();
#endif
#if defined(FF_EMU_ASAN)
  __sanitizer_finish_switch_fiber(scheduler_fake_stack, nullptr, nullptr);
#endif
  scheduler.running = nullptr;
}

void Fiber::suspend() {
#if defined(FF_EMU_ASAN)
  __sanitizer_start_switch_fiber(&asan_fake_stack_, scheduler.asan_stack_bottom,
                                 scheduler.asan_stack_bytes);
#endif
#if defined(FF_EMU_TSAN)
  __tsan_switch_to_fiber(scheduler.tsan_fiber, 0);
#endif
#if defined(FF_EMU_FIBER_ASM)
  ff_emu_switch_context(&saved_stack_pointer_, scheduler.saved_stack_pointer);
#else
  if (swapcontext(&context_, &scheduler.context) != 0) std::abort();
#endif
#if defined(FF_EMU_ASAN)
  __sanitizer_finish_switch_fiber(asan_fake_stack_, &scheduler.asan_stack_bottom,
                                  &scheduler.asan_stack_bytes);
#endif
}

FF_EMU_NO_TSAN_FRAMES void Fiber::entry() {
  Fiber* self = scheduler.running;
#if defined(FF_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &scheduler.asan_stack_bottom,
                                  &scheduler.asan_stack_bytes);
#endif
  self->body_();  // catches everything itself: nothing may unwind past a fiber's entry
  self->exit_to_scheduler();
}

FF_EMU_NO_TSAN_FRAMES void Fiber::exit_to_scheduler() {
  finished_ = true;
#if defined(FF_EMU_ASAN)
  // A null save slot tells ASan this fiber's fake stack is gone.
  __sanitizer_start_switch_fiber(nullptr, scheduler.asan_stack_bottom, scheduler.asan_stack_bytes);
#endif
#if defined(FF_EMU_TSAN)
  __tsan_switch_to_fiber(scheduler.tsan_fiber, 0);
#endif
#if defined(FF_EMU_FIBER_ASM)
  ff_emu_switch_context(&saved_stack_pointer_, scheduler.saved_stack_pointer);
#else
  setcontext(&scheduler.context);
#endif
  std::abort();  // a finished fiber is never resumed
}

}  // namespace ff_emu::detail
