// Sanitizer gate (UBSan): signed integer overflow. Run by ctest in the ASan/UBSan build, which
// expects it to fail with a "runtime error:" report (-fno-sanitize-recover=all aborts).
#include <climits>
#include <cstdio>

int main(int argc, char**) {
  volatile int big = INT_MAX;
  const int sum = big + argc;  // argc is 1: INT_MAX + 1
  std::printf("%d: UndefinedBehaviorSanitizer did not stop this\n", sum);
  return 0;
}
