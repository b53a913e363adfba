// Sanitizer gate (TSan): two threads increment one plain int. Run by ctest in the TSan build,
// which expects it to fail with a ThreadSanitizer data race report: proof that TSAN_OPTIONS
// (halt_on_error=1) turn a race into a failed test.
#include <cstdio>
#include <thread>

int main() {
  int counter = 0;
  auto bump = [&counter] {
    for (int i = 0; i < 1000; ++i) ++counter;
  };
  std::thread a(bump), b(bump);
  a.join();
  b.join();
  std::printf("counter %d: ThreadSanitizer did not stop this\n", counter);
  return 0;
}
