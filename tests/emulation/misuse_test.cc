// Misuse the emulator must report, with the kernel, block and thread: barriers some threads
// never reach, warp operations with lanes missing, blocks over 1024 threads, shared memory
// over the limit, misaligned vector accesses.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/emulation/device_buffer.h"
#include "tests/emulation/test_kernels.h"

namespace fastformer::emulation_test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

struct SharedMemoryLimit {
  explicit SharedMemoryLimit(std::size_t bytes) { ff_emu::set_shared_memory_limit(bytes); }
  ~SharedMemoryLimit() { ff_emu::set_shared_memory_limit(ff_emu::kDefaultSharedMemoryLimit); }
};

TEST(Misuse, ThreadExitingWhileOthersWaitAtSyncthreads) {
  EXPECT_THAT(error_of([] { launch_early_exit(64, 16, nullptr); }),
              AllOf(HasSubstr("kernel 'early_exit_kernel' block (0,0,0) thread (16,0,0)"),
                    HasSubstr("exited while 16 threads wait at __syncthreads")));
}

TEST(Misuse, WarpShuffleWithLanesMissing) {
  DeviceBuffer<int> out(64);
  EXPECT_THAT(error_of([&] { launch_partial_warp_shuffle(out.get(), nullptr); }),
              AllOf(HasSubstr("kernel 'partial_warp_shuffle_kernel' block (0,0,0) thread (0,0,0)"),
                    HasSubstr("__shfl_xor_sync with mask 0xffffffff waits for lane 16"),
                    HasSubstr("has exited")));
}

TEST(Misuse, LanesCallingDifferentWarpOperations) {
  DeviceBuffer<int> out(32);
  EXPECT_THAT(error_of([&] { launch_mixed_warp_ops(out.get(), nullptr); }),
              AllOf(HasSubstr("kernel 'mixed_warp_ops_kernel' block (0,0,0)"),
                    HasSubstr("call different warp operations"), HasSubstr("__ballot_sync"),
                    HasSubstr("__shfl_xor_sync")));
}

TEST(Misuse, BlockOverTheThreadLimits) {
  DeviceBuffer<int> out(2048);
  EXPECT_THAT(error_of([&] { launch_fill_linear(out.get(), 2048, 1, dim3(1025), nullptr); }),
              AllOf(HasSubstr("kernel 'fill_linear_kernel'"),
                    HasSubstr("blockDim (1025,1,1) has 1025 threads")));
  EXPECT_THAT(error_of([&] { launch_fill_linear(out.get(), 2048, 1, dim3(16, 16, 8), nullptr); }),
              HasSubstr("has 2048 threads"));
  EXPECT_THAT(error_of([&] { launch_fill_linear(out.get(), 2048, 1, dim3(1, 1, 65), nullptr); }),
              HasSubstr("blockDim.z is at most 64"));
  EXPECT_THAT(error_of([&] { launch_fill_linear(out.get(), 2048, dim3(0), 32, nullptr); }),
              HasSubstr("gridDim (0,1,1) is out of range"));
  EXPECT_EQ(error_of([&] { launch_fill_linear(out.get(), 2048, 2, 1024, nullptr); }), "(no error)");
}

TEST(Misuse, StaticSharedMemoryOverTheConfiguredLimit) {
  DeviceBuffer<float> out(256);
  {
    const SharedMemoryLimit limit(16 * 1024);
    EXPECT_THAT(error_of([&] { launch_static_shared_32k(out.get(), nullptr); }),
                AllOf(HasSubstr("kernel 'static_shared_32k_kernel' block (0,0,0) thread (0,0,0)"),
                      HasSubstr("FF_SHARED(big)"), HasSubstr("32768 bytes"),
                      HasSubstr("limit of 16384 bytes")));
  }
  launch_static_shared_32k(out.get(), nullptr);  // 32 KiB is within the default 48 KiB
  const std::vector<float> result = out.download();
  for (int t = 0; t < 256; ++t) EXPECT_EQ(result[t], static_cast<float>(8191 - t));
}

TEST(Misuse, DynamicSharedMemoryOverTheDefaultLimitUnlessOptedIn) {
  DeviceBuffer<float> out(2);
  EXPECT_THAT(
      error_of([&] { launch_big_dynamic(64 * 1024, /*opt_in=*/false, out.get(), nullptr); }),
      AllOf(HasSubstr("kernel 'big_dynamic_kernel'"),
            HasSubstr("65536 bytes of dynamic shared memory exceed the limit of 49152 bytes")));
  launch_big_dynamic(64 * 1024, /*opt_in=*/true, out.get(), nullptr);
  EXPECT_EQ(out.download(), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_THAT(
      error_of([&] { launch_big_dynamic(228 * 1024, /*opt_in=*/true, out.get(), nullptr); }),
      HasSubstr("exceed the 227 KiB"));
}

TEST(Misuse, MisalignedVectorLoad) {
  DeviceBuffer<float> input(64), output(64);
  EXPECT_THAT(
      error_of([&] { launch_copy_float4<float>(input.get(), 1, 4, output.get(), nullptr); }),
      AllOf(HasSubstr("kernel 'copy_float4_kernel"), HasSubstr("load_float4"),
            HasSubstr("is not aligned to 16 bytes")));
}

TEST(Misuse, ExecutionModelOutsideAKernel) {
  EXPECT_THROW((void)threadIdx.x, std::logic_error);
  EXPECT_THROW(__syncthreads(), std::logic_error);
  EXPECT_THROW((void)__shfl_sync(0xffffffffu, 1, 0), std::logic_error);
}

TEST(Misuse, EmulatorKeepsWorkingAfterAReportedMisuse) {
  EXPECT_NE(error_of([] { launch_early_exit(256, 100, nullptr); }), "(no error)");
  DeviceBuffer<int> out(64);
  EXPECT_NE(error_of([&] { launch_partial_warp_shuffle(out.get(), nullptr); }), "(no error)");

  std::vector<float> ones(512, 1.0f);
  DeviceBuffer<float> input(ones), sums(2);
  launch_block_sum(input.get(), 512, true, sums.get(), nullptr);
  EXPECT_EQ(sums.download(), (std::vector<float>{256.0f, 256.0f}));
}

}  // namespace
}  // namespace fastformer::emulation_test
