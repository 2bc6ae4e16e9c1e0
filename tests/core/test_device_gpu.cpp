#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "common/gpu.h"
#include "core/memory.h"

using namespace gpulab::core;

TEST(Device, QueryReportsARealDevice) {
  GPULAB_REQUIRE_GPU();
  const auto devices = query_devices();
  ASSERT_FALSE(devices.empty());
  for (const auto& d : devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.sm_count, 0);
    EXPECT_GT(d.memory_total, 0u);
    EXPECT_LE(d.memory_free, d.memory_total);
    EXPECT_GT(d.l2_bytes, 0u);
    EXPECT_EQ(d.pci_bus_id.find(':') != std::string::npos, true);
  }
  const auto v = query_versions();
  EXPECT_GE(v.cuda_runtime, 12000);
  EXPECT_GE(v.cuda_driver, v.cuda_runtime);
  EXPECT_GT(v.cublas, 0);
  EXPECT_GT(v.cudnn, 0);
  EXPECT_GT(v.nccl, 0);
}

TEST(Device, BuffersCopyEveryByte) {
  GPULAB_REQUIRE_GPU();
  constexpr size_t n = 1 << 20;
  PinnedBuffer<int> host(n), back(n);
  std::iota(host.get(), host.get() + n, -12345);
  std::fill(back.get(), back.get() + n, 0x7EEEEEEE);  // poison
  DeviceBuffer<int> dev(n);
  Stream stream;
  EventTimer timer(stream);
  timer.start();
  GPULAB_CHECK(cudaMemcpyAsync(dev.get(), host.get(), n * sizeof(int), cudaMemcpyHostToDevice, stream));
  GPULAB_CHECK(cudaMemcpyAsync(back.get(), dev.get(), n * sizeof(int), cudaMemcpyDeviceToHost, stream));
  const float ms = timer.stop();
  EXPECT_GT(ms, 0.0f);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(back.get()[i], host.get()[i]) << i;
}

TEST(Device, ImpossibleAllocationSaysHowMuchWasFree) {
  GPULAB_REQUIRE_GPU();
  const size_t too_much = query_device(0).memory_total * 4;
  try {
    DeviceBuffer<std::byte> huge(too_much);
    FAIL() << "allocation of " << too_much << " bytes succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of GPU memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("free of"), std::string::npos) << e.what();
  }
  // The failed allocation left no sticky error behind.
  DeviceBuffer<float> small(16);
  EXPECT_NE(small.get(), nullptr);
}
