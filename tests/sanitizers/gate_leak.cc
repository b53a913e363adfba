// Sanitizer gate (LSan): a heap block nothing points to at exit. Run by ctest in the ASan/UBSan
// build, which expects it to fail with a LeakSanitizer report (detect_leaks=1).
#include <cstdio>

namespace {
char* volatile last_block = nullptr;

__attribute__((noinline)) void allocate_and_forget() {
  last_block = new char[4096];
  last_block[0] = 1;
  last_block = nullptr;  // the only pointer to the block is gone
}
}  // namespace

int main() {
  allocate_and_forget();
  std::printf("exiting with a leak\n");
  return 0;
}
