// Emulated streams: launches and copies run in issue order; copies check their device side.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "tests/emulation/device_buffer.h"
#include "tests/emulation/test_kernels.h"

namespace fastformer::emulation_test {
namespace {

using ::testing::HasSubstr;

TEST(Stream, LaunchSequenceOnOneStreamRunsInOrder) {
  const int n = 300;
  std::vector<std::string> launched;
  ff_emu::set_launch_observer(
      [&](const ff_emu::LaunchInfo& info) { launched.push_back(info.kernel_name); });
  ff_stream_t stream = ff_stream_create();
  DeviceBuffer<int> a(n), b(n);
  std::vector<int> host_a(n), host_b(n);

  launch_fill_linear(a.get(), n, (n + 127) / 128, 128, stream);               // a = i
  ff_memcpy_async(b.get(), a.get(), a.bytes(), ff_device_to_device, stream);  // b = i
  launch_affine(b.get(), n, 2, 1, stream);                                    // b = 2i + 1
  launch_affine(a.get(), n, 3, 0, stream);                                    // a = 3i
  launch_affine(b.get(), n, 1, -1, stream);                                   // b = 2i
  ff_memcpy_async(host_a.data(), a.get(), a.bytes(), ff_device_to_host, stream);
  ff_memcpy_async(host_b.data(), b.get(), b.bytes(), ff_device_to_host, stream);
  ff_stream_synchronize(stream);

  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(host_a[i], 3 * i) << i;
    ASSERT_EQ(host_b[i], 2 * i) << i;
  }
  EXPECT_EQ(launched, (std::vector<std::string>{"fill_linear_kernel", "affine_kernel",
                                                "affine_kernel", "affine_kernel"}));
  EXPECT_EQ(stream->operations, 7u);
  ff_emu::set_launch_observer(nullptr);
  ff_stream_destroy(stream);
}

TEST(Stream, LaunchObserverSeesTheConfiguration) {
  ff_emu::LaunchInfo seen{};
  ff_emu::set_launch_observer([&](const ff_emu::LaunchInfo& info) { seen = info; });
  std::vector<float> ones(1000, 1.0f);
  DeviceBuffer<float> input(ones), sums(4);
  launch_block_sum(input.get(), 1000, true, sums.get(), nullptr);
  ff_emu::set_launch_observer(nullptr);
  EXPECT_EQ(seen.grid.x, 4u);
  EXPECT_EQ(seen.block.x, 256u);
  EXPECT_EQ(seen.dynamic_shared_bytes, 0u);
  EXPECT_EQ(seen.stream, nullptr);
}

TEST(Stream, CopiesCheckTheirDeviceSide) {
  DeviceBuffer<int> device(16);
  std::vector<int> host(32);
  const auto error_of = [](const auto& run) -> std::string {
    try {
      run();
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "(no error)";
  };
  // The device side overruns its allocation.
  EXPECT_THAT(error_of([&] {
                ff_memcpy_async(device.get(), host.data(), 32 * sizeof(int), ff_host_to_device,
                                nullptr);
              }),
              HasSubstr("destination (128 bytes) is not inside one ff_malloc allocation"));
  // Source and destination swapped.
  EXPECT_THAT(error_of([&] {
                ff_memcpy_async(host.data(), device.get(), 16 * sizeof(int), ff_host_to_device,
                                nullptr);
              }),
              HasSubstr("source is device memory"));
  EXPECT_THAT(error_of([&] { ff_memset_async(host.data(), 0, 4, nullptr); }),
              HasSubstr("ff_memset_async"));
  EXPECT_EQ(error_of([&] {
              ff_memcpy_async(device.get() + 8, host.data(), 8 * sizeof(int), ff_host_to_device,
                              nullptr);
            }),
            "(no error)");
}

}  // namespace
}  // namespace fastformer::emulation_test
