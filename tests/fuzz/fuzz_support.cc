#include <cstdio>
#include <cstdlib>

#include "tests/fuzz/fuzz_input.h"

namespace fastformer::fuzz {

void invariant_failed(const char* file, int line, const char* what) {
  std::fprintf(stderr, "%s:%d: invariant failed: %s\n", file, line, what);
  std::abort();
}

}  // namespace fastformer::fuzz
