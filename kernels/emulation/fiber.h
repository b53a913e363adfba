// A fiber: a stack and a saved context that runs one emulated CUDA thread cooperatively on
// the OS thread that resumes it.
//
// The stack is mapped once, with a guard page below it so an overflow faults instead of
// corrupting a neighbour, and reused for every thread the fiber runs. On x86-64 a switch is a
// few instructions (callee-saved registers and the FP control words, like Boost.Context);
// elsewhere, or with FF_EMU_UCONTEXT defined, it is ucontext's swapcontext, which also makes a
// system call for the signal mask (hundreds of ns, and the emulator switches at every barrier).
// Under AddressSanitizer each switch is announced with __sanitizer_start/finish_switch_fiber
// so ASan knows which stack is live; under ThreadSanitizer each fiber has its own TSan context
// (__tsan_create_fiber) and each switch is announced with __tsan_switch_to_fiber.
#pragma once

#include <cstddef>

#if defined(__x86_64__) && !defined(FF_EMU_UCONTEXT)
#define FF_EMU_FIBER_ASM 1
#else
#include <ucontext.h>
#endif

namespace ff_emu::detail {

class Fiber {
 public:
  Fiber();
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Prepares the fiber to run `body` from the start at the next resume(); whatever it was
  // running before is abandoned.
  void start(void (*body)());
  // From the scheduler: runs the fiber until it calls suspend() or its body returns.
  void resume();
  // From inside the fiber: back to the scheduler; returns at the next resume().
  void suspend();

 private:
  static void entry();
  [[noreturn]] void exit_to_scheduler();

  void (*body_)() = nullptr;
  bool finished_ = true;  // false while a body has started and not returned
#if defined(FF_EMU_FIBER_ASM)
  void* saved_stack_pointer_ = nullptr;
#else
  ucontext_t context_{};
#endif
  void* mapping_ = nullptr;
  std::size_t mapping_bytes_ = 0;
  void* stack_ = nullptr;
  std::size_t stack_bytes_ = 0;
  void* asan_fake_stack_ = nullptr;
  [[maybe_unused]] void* tsan_fiber_ = nullptr;  // TSan builds: this fiber's TSan context
};

}  // namespace ff_emu::detail
