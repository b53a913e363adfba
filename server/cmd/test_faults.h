// Test-only fault injection for the end-to-end fault tests (tests/e2e/test_faults.py).
//
// Configured only by the environment variable FASTFORMER_TEST_FAULTS, never by a flag, so it
// cannot slip into a deployment's command line; when the variable is not set (production)
// there is no hook at all. When it is set the server logs a warning at start-up. Its value is
// a comma-separated list of:
//
//   fail_first_token=N       a batch holding a sequence whose first token id is N fails before
//                            compute, as if the engine had thrown: that batch's requests get
//                            INTERNAL, every other batch runs
//   stall_first_token=N:MS   a batch holding a sequence whose first token id is N sleeps MS
//                            milliseconds before compute (keeps the engine busy on purpose)
//
// Anything else is an error and the server refuses to start: a misspelt fault must not
// silently inject nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "server/batching/queue.h"

namespace fastformer {

struct TestFaults {
  std::optional<int32_t> fail_first_token;   ///< fail batches holding a sequence starting with it
  std::optional<int32_t> stall_first_token;  ///< stall batches holding a sequence starting with it
  std::chrono::milliseconds stall{0};        ///< how long a stalled batch sleeps

  std::string describe() const;  ///< for the start-up warning
};

inline constexpr const char* kTestFaultsEnv = "FASTFORMER_TEST_FAULTS";

// The faults in $FASTFORMER_TEST_FAULTS; nullopt when it is not set. Throws
// std::invalid_argument, naming the bad entry, when it cannot be parsed.
std::optional<TestFaults> test_faults_from_env();

// The Scheduler's before_compute hook that injects `faults`.
std::function<void(const batching::Batch&)> test_fault_hook(const TestFaults& faults);

}  // namespace fastformer
