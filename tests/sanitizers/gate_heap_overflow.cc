// Sanitizer gate (ASan): reads one element past the end of a heap array. Run by ctest in the
// ASan/UBSan build, which expects it to fail with an AddressSanitizer report: proof that a
// memory error in this build stops a test instead of passing unnoticed.
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char**) {
  std::vector<int> values(8, 1);
  const int* data = values.data();
  const int past_end = data[values.size() + static_cast<std::size_t>(argc) - 1];  // argc is 1
  std::printf("read %d past the end: AddressSanitizer did not stop this\n", past_end);
  return 0;
}
